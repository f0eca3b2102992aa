"""`steerkit --help` (and every command's --help) and `import steerkit` import neither torch nor transformers.

Each check runs in a fresh interpreter (``python -c``) and looks at ``sys.modules`` afterwards: a test of *what* is
imported, never of how long it takes. The installed plugins are loaded as `steerkit --help` loads them (their
``register_commands`` hooks add commands), so a plugin chain that reaches torch fails here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what a help text or a plugin's registration never needs
HEAVY = ("torch", "transformers", "numpy", "pandas", "onnx", "onnxruntime", "ray", "fastapi", "peft", "datasets")

HELP_EVERY_COMMAND = f"""
import json, sys, typer
from steerkit.cli.main import main
from steerkit.cli.app import build_app

def paths(command, prefix=()):
    for name, sub in sorted(getattr(command, "commands", {{}}).items()):
        yield prefix + (name,)
        yield from paths(sub, prefix + (name,))

codes = {{}}
for path in [()] + list(paths(typer.main.get_command(build_app(plugins=True)))):
    try:
        main([*path, "--help"])
    except SystemExit as exc:
        codes[" ".join(path)] = exc.code
print(json.dumps({{"codes": codes, "heavy": [m for m in {HEAVY!r} if m in sys.modules],
                  "modules": sorted(m for m in sys.modules if m.startswith("steerkit"))}}))
"""


def run_python(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("STEERKIT_PLUGINS", None)  # every installed plugin loads, as in a user's `steerkit --help`
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def every_help():
    return run_python(HELP_EVERY_COMMAND)


def test_every_commands_help_imports_neither_torch_nor_transformers(every_help):
    from steerkit.cli.app import COMMAND_MODULES

    codes = every_help["codes"]
    assert {"", "generate", "score", "setup", "train", "plugins", "export", "eval", "import", "serve"} <= set(codes)
    assert len(codes) > len(COMMAND_MODULES)  # subcommands (export onnx, eval toxicity ...) too
    assert set(codes.values()) == {0}, codes
    assert every_help["heavy"] == [], f"--help imported {every_help['heavy']}"


def test_the_installed_plugins_register_without_torch(every_help):
    """The plugins shipped in plugins/ (when installed) register their rewards, scorers and commands lightly: the
    weights and runtimes load when a reward is used."""
    import importlib.util

    found = run_python("import json, sys\nfrom steerkit import registry\n"
                       "names = [r.name for r in registry.list_rewards()] + [s.name for s in registry.list_scorers()]"
                       " + [b.name for b in registry.list_backends()]\n"
                       f"print(json.dumps({{'names': names, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    assert found["heavy"] == [], f"registering the plugins imported {found['heavy']}"
    assert {"torch", "onnx"} <= set(found["names"])
    if importlib.util.find_spec("steerkit_toxicity") is not None:
        assert "toxicity" in found["names"]
    if importlib.util.find_spec("steerkit_example") is not None:
        assert "positive-words" in found["names"] and "positive-words" in every_help["codes"]


def test_import_steerkit_and_hookimpl_are_light():
    found = run_python("import json, sys, steerkit\nfrom steerkit import hookimpl, SteerkitError\n"
                       "from steerkit.rewards.packaged import describe_reward_model, reward_model_factory\n"
                       f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    assert found["heavy"] == []


def test_the_public_api_still_resolves():
    import steerkit

    assert set(steerkit.__all__) <= set(dir(steerkit))
    for name in steerkit.__all__:
        assert getattr(steerkit, name) is not None, name
    from steerkit import RewardAugmentedLogitsProcessor, generate, hookimpl, load_reward  # noqa: F401
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.registry import hookimpl as registry_hookimpl

    assert steerkit.RewardAugmentedGenerator is RewardAugmentedGenerator and hookimpl is registry_hookimpl
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        steerkit.not_a_name  # noqa: B018


def test_generate_help_shows_the_steering_config_defaults():
    """`steerkit generate --help` states SteeringConfig's defaults without importing it (it imports torch)."""
    from steerkit.cli.generate import _DEFAULTS
    from steerkit.config import SteeringConfig

    fields = SteeringConfig.model_fields
    assert _DEFAULTS == {"lm": fields["lm"].default, "k": fields["k"].default, "n": fields["num_return_sequences"].default,
                         "max_new_tokens": fields["max_new_tokens"].default,
                         "temperature": fields["temperature"].default}

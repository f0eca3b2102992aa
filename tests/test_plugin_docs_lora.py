"""docs/plugins.md's "Shipping a trained reward model" package works as written, LoRA adapter included, without peft.

The section's two files (``pyproject.toml`` and the module, each marked ``<!-- file: PATH -->``) are copied verbatim
into a package directory, with a tiny LoRA reward model (saved as training saves it) as its ``model/`` package data.
The package is pip-installed (a real, non-editable install: wheel build, entry point, package data) into a fresh
virtual environment, and that environment's Python loads the reward by its registered name through
``steerkit.load_reward`` with peft unimportable, and scores texts as this process does from the same directory.

The virtual environment reuses this interpreter's installed packages (torch, transformers, steerkit itself) so
that nothing is downloaded: a ``.pth`` file in it adds this interpreter's site-packages as site directories.
``python -m venv --system-site-packages`` alone is not enough: it shares the *base* interpreter's site-packages,
which lack torch when the suite itself runs in a virtual environment. The plugin's declared dependencies are
checked to be installed there, and pip runs with ``--no-deps --no-build-isolation --no-index`` (offline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import time
import tomllib
import venv
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")  # the LoRA reward model is saved as training saves it (through peft)

from tiny import make_tokenizer, save_tiny_lm  # noqa: E402

from steerkit.rewards.lora import lora_config, resolve_lora  # noqa: E402
from steerkit.rewards.model import LoraSettings, RewardModel  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
SECTION = "## Shipping a trained reward model"
TEXTS = ["You are a wonderful friend", "I hate it, this is terrible", "12 apples and 3.5 pears"]

CHILD = """
import json, sys
sys.modules["peft"] = None  # unimportable: loading a LoRA reward must not need it
import importlib, importlib.metadata as md
from packaging.requirements import Requirement
import steerkit

distribution, package, name, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
unmet = [r for r in md.requires(distribution) or []
         if not Requirement(r).specifier.contains(md.version(Requirement(r).name), prereleases=True)]
reward = steerkit.load_reward(name)
print(json.dumps({"scores": reward.model.score_texts(texts), "unmet": unmet,
                  "requires": md.requires(distribution) or [],
                  "module": importlib.import_module(package).__file__,
                  "peft": sys.modules.get("peft") is not None}))
"""


def doc_files() -> dict[str, str]:
    """``{path: content}`` of the section's ``<!-- file: PATH -->`` code blocks."""
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"docs/plugins.md lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", section, flags=re.S))
    assert any(p.endswith("pyproject.toml") for p in files) and any(p.endswith(".py") for p in files), (
        f"{SECTION} in docs/plugins.md must show the plugin's pyproject.toml and its module, each marked "
        f"'<!-- file: PATH -->'; found {sorted(files)}")
    return files


def save_lora_reward(directory: Path, backbone_dir: Path) -> list[float]:
    """A LoRA reward model saved as ``steerkit train`` saves one (peft's adapter keys), random non-zero adapter."""
    from peft import get_peft_model

    rm = RewardModel.from_backbone(str(backbone_dir), 2, name="politeness")
    settings = resolve_lora(LoraSettings(r=4, alpha=8), rm.backbone)
    rm.config = rm.config.model_copy(update={"method": "lora", "lora": settings})
    with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
        warnings.simplefilter("ignore", FutureWarning)
        rm.backbone = get_peft_model(rm.backbone, lora_config(settings, rm.backbone))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, param in rm.backbone.named_parameters():
            if "lora_" in key:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        rm.head.weight.normal_(0, 0.5, generator=generator)
    rm.eval().save_pretrained(directory)
    return rm.score_texts(TEXTS)


def child_env(**extra) -> dict[str, str]:
    """A clean environment: no inherited plugin allowlist or preference, offline, one thread."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT") if k in os.environ}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "STEERKIT_THREADS": "1",
            "OMP_NUM_THREADS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
            "PIP_NO_CACHE_DIR": "1", **extra}


def run(args, timeout, **env) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(**env))
    command = " ".join(str(a) for a in args)
    assert proc.returncode == 0, f"{command[:300]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin_docs_lora")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def make_venv(directory: Path) -> tuple[Path, Path]:
    """A virtual environment whose Python sees this interpreter's packages through a .pth file (module docstring)."""
    venv.create(directory, with_pip=False, clear=True, symlinks=os.name != "nt")
    python = directory / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], 60).strip())
    parents = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    (purelib / "_parent_site.pth").write_text(
        f"import site; list(map(site.addsitedir, {parents!r}))\n", encoding="utf-8")
    return python, purelib


def test_the_documented_lora_plugin_installs_and_scores_without_peft(workspace):
    started = time.perf_counter()
    files = doc_files()
    for path, content in files.items():
        (workspace / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / "src" / path).write_text(content, encoding="utf-8")
    pyproject_path = next(workspace / "src" / p for p in files if p.endswith("pyproject.toml"))
    pyproject = tomllib.loads(pyproject_path.read_text(encoding="utf-8"))
    distribution = pyproject["project"]["name"]
    (entry_point, module), = pyproject["project"]["entry-points"]["steerkit"].items()
    module_source = next(c for p, c in files.items() if p.endswith(".py"))
    name = re.search(r"register\(\s*\"([^\"]+)\"", module_source).group(1)
    package_dir = pyproject_path.parent / module
    assert (package_dir / "__init__.py").is_file(), f"the module file should be {module}/__init__.py"

    backbone_dir = save_tiny_lm(workspace / "backbone", make_tokenizer(), seed=3)
    unmerged = save_lora_reward(package_dir / "model", backbone_dir)
    expected = RewardModel.from_pretrained(package_dir / "model").score_texts(TEXTS)
    assert expected == pytest.approx(unmerged, abs=1e-5)

    python, purelib = make_venv(workspace / "venv")
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         pyproject_path.parent], 300)
    assert (purelib / module / "model" / "adapter.safetensors").is_file(), "the package data was not installed"
    shutil.rmtree(workspace / "src")  # the installed copy only

    out = run([python, "-c", CHILD, distribution, module, name, json.dumps(TEXTS)], 300,
              STEERKIT_PLUGINS=entry_point, STEERKIT_CACHE=str(workspace / "cache"))
    result = json.loads(out.strip().splitlines()[-1])
    assert Path(result["module"]).is_relative_to(purelib), result["module"]
    assert not result["peft"] and not result["unmet"], result
    assert not any("peft" in r or "[" in r for r in result["requires"]), result["requires"]  # no extra needed
    assert result["scores"] == pytest.approx(expected, abs=1e-6)
    print(f"venv build, install and scoring took {time.perf_counter() - started:.1f}s")

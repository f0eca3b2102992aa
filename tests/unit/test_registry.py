"""The plugin registry, driven through real entry points: packages are written as dist-info directories on
sys.path, so ``importlib.metadata`` and pluggy find them exactly as they find pip-installed plugins."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from steerkit import registry
from steerkit.rewards.loading import get_reward
from steerkit.rewards.packaged import reward_model_factory
from steerkit.errors import PluginError
from steerkit.testing import write_distribution

GOOD = '''
import torch
from steerkit import hookimpl

class Session:
    def __init__(self, n):
        self.n = n
    def score(self, candidates):
        return torch.full(candidates.shape, 0.25)
    def commit(self, tokens):
        pass

class ConstantReward:
    name = "good-reward"
    def __init__(self, backend, context):
        self.backend, self.context = backend, context
    def start(self, prefixes, lm_tokenizer):
        return Session(len(prefixes))

class Scorer:
    name = "good-scorer"
    def __init__(self, scale=1.0):
        self.scale = scale
    def score(self, texts):
        return [min(1.0, self.scale * len(t) / 100) for t in texts]

@hookimpl
def register_reward_models(register):
    register("good-reward", lambda backend, context: ConstantReward(backend, context), description="a constant")
    register("torch-only", lambda: ConstantReward("torch", "continuation"))
    register("explodes", lambda **kw: 1 / 0)
    register("not-a-reward", lambda: object())

@hookimpl
def register_scorers(register):
    register("good-scorer", Scorer, description="length")
'''

PLUGINS = {
    # entry-point name: (distribution, version, module name, source)
    "good": ("steerkit-good", "1.2.3", "sk_goodplug", GOOD),
    "broken": ("steerkit-broken", "0.1", "sk_brokenplug", "raise ImportError('needs the frobnicate package')\n"),
    "raising": ("steerkit-raising", "0.2", "sk_raisingplug", '''
from steerkit import hookimpl

@hookimpl
def register_reward_models(register):
    register("partial-reward", lambda: None)
    raise RuntimeError("config file not found")

@hookimpl
def register_scorers(register):
    register("raising-scorer", lambda: None)
'''),
    "misspelled": ("steerkit-misspelled", "0.3", "sk_misspelledplug", '''
from steerkit import hookimpl

@hookimpl
def register_reward_model(register):
    register("never", lambda: None)
'''),
    # "twin" also registers "good-reward": the fixture's STEERKIT_PREFER picks "good" for it
    "twin": ("steerkit-twin", "0.4", "sk_twinplug", '''
from steerkit import hookimpl

@hookimpl
def register_reward_models(register):
    register("good-reward", lambda: None)
    register("dup-only", lambda: None, description="fine")
'''),
    "badname": ("steerkit-badname", "0.5", "sk_badnameplug", '''
from steerkit import hookimpl

@hookimpl
def register_reward_models(register):
    register("has space", lambda: None)
'''),
}


def write_plugin(site, ep_name, dist, version, module, source):
    write_distribution(site, ep_name, dist, version, module, textwrap.dedent(source))


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for ep_name, (dist, version, module, source) in PLUGINS.items():
        write_plugin(site, ep_name, dist, version, module, source)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(registry.ENV_ALLOWLIST, raising=False)
    # "good" and "twin" both register "good-reward"; a shared name is ambiguous until the user picks one
    # (tests/unit/test_plugin_conflicts.py), so these tests pick "good"
    monkeypatch.setenv(registry.ENV_PREFER, "good-reward=good")
    registry.reset()
    yield site
    registry.reset()
    for _, _, module, _ in PLUGINS.values():
        sys.modules.pop(module, None)


def plugin(name):
    return next(p for p in registry.list_plugins() if p.name == name)


def test_entry_point_plugins_load_with_versions(fake_plugins):
    good = plugin("good")
    assert good.loaded and not good.errors
    assert (good.distribution, good.version, good.module) == ("steerkit-good", "1.2.3", "sk_goodplug")
    assert good.hooks == ["register_reward_models", "register_scorers"]
    assert good.rewards == ["good-reward", "torch-only", "explodes", "not-a-reward"]
    assert good.scorers == ["good-scorer"]
    reward = get_reward("good-reward", backend="onnx", context="full")
    assert (reward.backend, reward.context) == ("onnx", "full")
    session = reward.start(["a", "b"], None)
    assert session.score(torch.zeros(2, 3, dtype=torch.long)).shape == (2, 3)
    assert registry.get_scorer("good-scorer", scale=2.0).score(["x" * 10]) == [0.2]
    assert [s.name for s in registry.list_scorers() if s.plugin == "good"] == ["good-scorer"]


def test_a_broken_plugin_is_reported_by_name_and_the_others_work(fake_plugins):
    broken = plugin("broken")
    assert not broken.loaded
    assert broken.errors == ["failed to load: ImportError: needs the frobnicate package"]
    assert broken.version == "0.1"

    raising = plugin("raising")
    assert raising.loaded
    assert any("register_reward_models: RuntimeError: config file not found" in e for e in raising.errors)
    assert raising.rewards == []  # nothing from the failing hook call is used ...
    assert raising.scorers == ["raising-scorer"]  # ... but its other hook still counts
    with pytest.raises(PluginError, match="Unknown reward 'partial-reward'"):
        get_reward("partial-reward")

    misspelled = plugin("misspelled")
    assert not misspelled.loaded
    assert misspelled.errors[0].startswith("failed to load: unknown hook 'register_reward_model' (steerkit hooks: ")
    assert "register_reward_models, register_scorers" in misspelled.errors[0]

    twin = plugin("twin")
    assert twin.rewards == ["dup-only"]
    assert any("'good-reward' is also registered by plugin 'good'" in c for c in twin.conflicts)
    assert registry.get_registry().entries["reward"]["good-reward"].plugin == "good"

    assert "invalid reward name 'has space'" in plugin("badname").errors[0]
    # the good plugin is untouched by all of the above
    assert get_reward("good-reward").name == "good-reward"


def test_unknown_reward_lists_available_names_and_broken_plugins(fake_plugins):
    with pytest.raises(PluginError) as info:
        get_reward("good-rewrd")
    message = str(info.value)
    assert "Did you mean 'good-reward'?" in message
    assert "dup-only" in message and "good-reward" in message and "torch-only" in message
    assert "\n  broken: failed to load: ImportError: needs the frobnicate package" in message
    assert "path to a trained reward-model directory" in message
    with pytest.raises(PluginError, match="(?s)Unknown scorer 'nope'.*good-scorer"):
        registry.get_scorer("nope")


def test_factory_contract_errors(fake_plugins):
    assert get_reward("torch-only").backend == "torch"
    with pytest.raises(PluginError, match="does not support the 'onnx' backend"):
        get_reward("torch-only", backend="onnx")
    with pytest.raises(PluginError, match="'explodes' from plugin 'good' failed to load: ZeroDivisionError"):
        get_reward("explodes")
    with pytest.raises(PluginError, match="returned object, which lacks `name`"):
        get_reward("not-a-reward")


def test_load_reward_resolves_registered_names(fake_plugins):
    import steerkit

    assert steerkit.load_reward("good-reward").name == "good-reward"
    with pytest.raises(PluginError, match="Unknown reward"):
        steerkit.load_reward("no-such-reward")


def test_allowlist_by_entry_point_or_distribution_name(fake_plugins, monkeypatch):
    monkeypatch.setenv(registry.ENV_ALLOWLIST, "good, steerkit-twin,not-installed")
    registry.reset()
    names = {p.name for p in registry.list_plugins()}
    assert {"good", "twin", "not-installed"} <= names
    assert not names & {"broken", "raising", "misspelled", "badname"}
    assert "no installed package declares" in plugin("not-installed").errors[0]
    assert {r.name for r in registry.list_rewards()} >= {"good-reward", "dup-only"}
    with pytest.raises(PluginError, match="STEERKIT_PLUGINS="):
        get_reward("missing")

    monkeypatch.setenv(registry.ENV_ALLOWLIST, "")
    registry.reset()
    assert all(p.distribution == "steerkit-rad" for p in registry.list_plugins())  # built-ins only
    assert not registry.list_rewards()


def test_in_process_plugin_registration(fake_plugins):
    class Local:
        @registry.hookimpl
        def register_reward_models(self, register):
            register("local", lambda: object.__new__(type("R", (), {"name": "local", "start": lambda *a: None})))

    registry.register_plugin(Local(), name="local-plugin")
    assert get_reward("local").name == "local"
    with pytest.raises(PluginError, match="already registered"):
        registry.register_plugin(Local(), name="local-plugin")
    registry.unregister_plugin("local-plugin")
    with pytest.raises(PluginError, match="Unknown reward 'local'"):
        get_reward("local")

    class Misspelled:
        @registry.hookimpl
        def register_scorer(self, register):  # noqa: D401 - deliberately misspelled
            pass

    with pytest.raises(PluginError, match="unknown hook 'register_scorer'"):
        registry.register_plugin(Misspelled(), name="misspelled-local")


def test_plugins_command_json_and_table(fake_plugins):
    from typer.testing import CliRunner

    from steerkit.cli import app

    result = CliRunner().invoke(app, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["good"]["version"] == "1.2.3" and by_name["good"]["distribution"] == "steerkit-good"
    assert by_name["good"]["rewards"] == ["good-reward", "torch-only", "explodes", "not-a-reward"]
    assert by_name["broken"]["loaded"] is False
    assert data["errors"]["broken"] == ["failed to load: ImportError: needs the frobnicate package"]
    assert {"name": "good-reward", "plugin": "good", "description": "a constant"} in data["rewards"]
    assert any(s["name"] == "good-scorer" for s in data["scorers"])

    result = CliRunner().invoke(app, ["plugins"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "steerkit-good 1.2.3" in result.output and "good-reward" in result.output
    assert "broken: failed to load: ImportError: needs the frobnicate package" in result.output


def test_reward_model_factory(tmp_path, tiny_backbone_dir):
    from steerkit.rewards.model import RewardModel
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    factory = reward_model_factory(tmp_path / "model", name="tox", package="steerkit-tox")
    with pytest.raises(PluginError, match="model files are missing from the steerkit-tox package"):
        factory()
    RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="whatever").save_pretrained(tmp_path / "model")
    scorer = factory(backend="torch", context="full")
    assert isinstance(scorer, RewardModelScorer)
    assert (scorer.name, scorer.context) == ("tox", "full")
    assert factory().model is scorer.model  # loaded once per process


@pytest.mark.parametrize("name", ["toxicity", "sentiment"])
def test_shipped_reward_plugins_register_through_entry_points(name):
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(f"steerkit-{name}")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"not installed: pip install -e plugins/steerkit-{name}")
    assert [ep.value for ep in dist.entry_points if ep.group == "steerkit"] == [f"steerkit_{name}"]
    registry.reset()
    info = plugin(name)
    # the sequence reward and its token-level variants (kind: token, issue 13; toxicity also ships the distilled one)
    token_variants = [f"{name}-token"] + ([f"{name}-token-distilled", f"{name}-lm"] if name == "toxicity" else [])
    assert info.loaded and info.rewards == [name, *token_variants] and info.distribution == f"steerkit-{name}"
    module = __import__(f"steerkit_{name}")
    if not (module.MODEL_DIR / "reward_config.json").is_file():
        with pytest.raises(PluginError, match="model files are missing"):
            get_reward(name)

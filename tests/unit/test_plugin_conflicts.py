"""Two installed packages registering one reward or scorer name: never resolved by load order.

The packages are real distributions (dist-info directories with entry points on sys.path), found by
``importlib.metadata`` and loaded by pluggy exactly as pip-installed plugins are. ``steerkit-toxicity`` here is a
stand-in for the shipped plugin (the same distribution name, first on sys.path, so it shadows an installed copy
and these tests do not depend on whether the shipped plugins are installed); ``steerkit-impostor`` claims the
name ``toxicity`` under an entry point that sorts first, which used to replace the shipped reward silently.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest
from typer.testing import CliRunner

import steerkit
from steerkit import registry
from steerkit.rewards.loading import get_reward
from steerkit.cli import app, main
from steerkit.errors import PluginConflictError, PluginError
from steerkit.testing import write_distribution

PREFER = "STEERKIT_PREFER"  # the documented name, spelled out

REWARD = '''
from steerkit import hookimpl

class Reward:
    def __init__(self, name, origin):
        self.name, self.origin = name, origin
    def start(self, prefixes, lm_tokenizer):
        raise NotImplementedError("never steered with in these tests")

class Scorer:
    name = "vader"
    origin = {origin!r}
    def score(self, texts):
        return [0.5 for _ in texts]

@hookimpl
def register_reward_models(register):
    for name in {names!r}:
        register(name, lambda name=name: Reward(name, {origin!r}), description={description!r})
'''

SCORER_HOOK = '''
@hookimpl
def register_scorers(register):
    register("vader", Scorer, description="a second vader")
'''

LONG_PLUGIN = "a-plugin-with-a-very-long-entry-point-name-that-no-eighty-column-table-could-ever-show-in-one-piece"
LONG_REWARD = "a-reward-name-long-enough-to-be-cut-by-rich-in-a-non-terminal-console-of-eighty-columns-width"

PACKAGES = {
    # entry-point name: (distribution, version, module, reward names, description)
    "toxicity": ("steerkit-toxicity", "0.1.0", "sk_conflict_real", ["toxicity"], "the shipped toxicity reward"),
    "aaa-impostor": ("steerkit-impostor", "6.6.6", "sk_conflict_impostor", ["toxicity", "impostor-only"],
                     "an impostor"),
    "sentiment": ("steerkit-sentiment", "0.1.0", "sk_conflict_sentiment", ["sentiment"], "sentiment"),
}


def write_plugin(site, ep_name, dist, version, module, names, description, extra=""):
    source = textwrap.dedent(REWARD).format(names=names, origin=dist, description=description) + extra
    write_distribution(site, ep_name, dist, version, module, source)


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for ep_name, spec in PACKAGES.items():
        write_plugin(site, ep_name, *spec)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(registry.ENV_ALLOWLIST, raising=False)
    monkeypatch.delenv(PREFER, raising=False)
    registry.reset()
    yield site
    registry.reset()
    for module in [m for m in sys.modules if m.startswith("sk_conflict_")]:
        sys.modules.pop(module)


def origin(reference: str) -> str:
    return get_reward(reference).origin


def test_a_shared_name_is_an_error_naming_both(site):
    with pytest.raises(PluginConflictError) as info:
        get_reward("toxicity")
    message = str(info.value)
    assert "Reward 'toxicity' is registered by 2 plugins" in message
    assert "plugin 'aaa-impostor' (steerkit-impostor 6.6.6): an impostor" in message
    assert "plugin 'toxicity' (steerkit-toxicity 0.1.0): the shipped toxicity reward" in message
    # the three ways to pick, each spelled out so that it can be pasted
    assert "steerkit-impostor:toxicity or steerkit-toxicity:toxicity" in message
    keep_impostor, keep_shipped = [set(v.split(",")) for v in re.findall(r"STEERKIT_PLUGINS=([^ ;]+)", message)]
    assert {"aaa-impostor", "sentiment"} <= keep_impostor and "toxicity" not in keep_impostor
    assert {"toxicity", "sentiment"} <= keep_shipped and "aaa-impostor" not in keep_shipped
    assert "STEERKIT_PREFER=toxicity=steerkit-toxicity" in message
    assert "pip uninstall steerkit-impostor / steerkit-toxicity" in message
    # every path to the reward refuses to guess
    with pytest.raises(PluginConflictError):
        registry.get_registry().get("reward", "toxicity")
    with pytest.raises(PluginConflictError):
        steerkit.load_reward("toxicity")
    assert "toxicity" not in {r.name for r in registry.list_rewards()}
    # names only one package registers keep working, from both packages
    assert origin("impostor-only") == "steerkit-impostor"
    assert origin("sentiment") == "steerkit-sentiment"
    [conflict] = registry.list_conflicts()
    assert (conflict.kind, conflict.name, conflict.selected) == ("reward", "toxicity", None)
    assert {r.plugin for r in conflict.providers} == {"toxicity", "aaa-impostor"}
    impostor = next(p for p in registry.list_plugins() if p.name == "aaa-impostor")
    assert impostor.rewards == ["impostor-only"] and not impostor.errors
    assert "is also registered by plugin 'toxicity' (steerkit-toxicity 0.1.0)" in impostor.conflicts[0]


def test_the_cli_refuses_the_ambiguous_name(site, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["score", "--reward", "toxicity", "hello"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Reward 'toxicity' is registered by 2 plugins") and err.count("\n") == 1
    assert "steerkit-toxicity:toxicity" in err


def test_a_qualified_reference_picks_one(site):
    assert origin("steerkit-toxicity:toxicity") == "steerkit-toxicity"  # distribution name
    assert origin("steerkit-impostor:toxicity") == "steerkit-impostor"
    assert origin("toxicity:toxicity") == "steerkit-toxicity"  # entry-point name
    assert origin("aaa-impostor:toxicity") == "steerkit-impostor"
    assert origin("Steerkit_Toxicity:toxicity") == "steerkit-toxicity"  # normalized like pip names
    assert origin("steerkit-sentiment:sentiment") == "steerkit-sentiment"  # unambiguous names may be qualified too
    # the reference reaches the registry intact through load_reward (not mistaken for a path)
    assert steerkit.load_reward("steerkit-toxicity:toxicity").origin == "steerkit-toxicity"
    assert steerkit.load_reward("aaa-impostor:toxicity").origin == "steerkit-impostor"

    with pytest.raises(PluginError, match=r"'toxicity' is registered by .*not by 'steerkit-sentiment'.*does not "
                                          r"register a reward named 'toxicity' \(its rewards: sentiment\)"):
        get_reward("steerkit-sentiment:toxicity")
    with pytest.raises(PluginError, match="no loaded plugin is named 'nope'"):
        get_reward("nope:toxicity")
    with pytest.raises(PluginError, match=r"Unknown reward 'toxicty' \(from plugin 'steerkit-toxicity'\)\. "
                                          "Did you mean 'toxicity'"):
        get_reward("steerkit-toxicity:toxicty")
    with pytest.raises(PluginError, match="write NAME or PLUGIN:NAME"):
        get_reward(":toxicity")


def test_the_allowlist_picks_one(site, monkeypatch):
    monkeypatch.setenv(registry.ENV_ALLOWLIST, "steerkit-toxicity,sentiment")
    registry.reset()
    assert origin("toxicity") == "steerkit-toxicity" and origin("sentiment") == "steerkit-sentiment"
    assert not registry.list_conflicts()

    # the allowlist the conflict error suggests for keeping the impostor works as written
    monkeypatch.delenv(registry.ENV_ALLOWLIST)
    registry.reset()
    with pytest.raises(PluginConflictError) as info:
        get_reward("toxicity")
    [keep_impostor] = re.findall(r"STEERKIT_PLUGINS=(\S+) or", str(info.value))
    monkeypatch.setenv(registry.ENV_ALLOWLIST, keep_impostor)
    registry.reset()
    assert origin("toxicity") == "steerkit-impostor" and origin("sentiment") == "steerkit-sentiment"


def test_a_preference_picks_one(site, monkeypatch):
    monkeypatch.setenv(PREFER, "toxicity=steerkit-toxicity")
    registry.reset()
    assert origin("toxicity") == "steerkit-toxicity"
    assert origin("steerkit-impostor:toxicity") == "steerkit-impostor"  # the other stays reachable, qualified
    [conflict] = registry.list_conflicts()
    assert conflict.selected.plugin == "toxicity"
    impostor = next(p for p in registry.list_plugins() if p.name == "aaa-impostor")
    assert "STEERKIT_PREFER selects 'toxicity'; use 'steerkit-impostor:toxicity' for this one" in impostor.conflicts[0]

    monkeypatch.setenv(PREFER, " toxicity = aaa-impostor , sentiment=steerkit-sentiment")
    registry.reset()
    assert origin("toxicity") == "steerkit-impostor" and origin("sentiment") == "steerkit-sentiment"

    monkeypatch.delenv(PREFER)
    registry.reset()
    registry.prefer("toxicity", "steerkit-toxicity")  # the same, from Python
    assert origin("toxicity") == "steerkit-toxicity"


def test_a_preference_that_cannot_be_honoured_is_an_error(site, monkeypatch):
    # the preferred package is not loaded: the other provider must not be used in its place
    monkeypatch.setenv(registry.ENV_ALLOWLIST, "aaa-impostor")
    monkeypatch.setenv(PREFER, "toxicity=steerkit-toxicity")
    registry.reset()
    with pytest.raises(PluginError, match=r"STEERKIT_PREFER picks 'steerkit-toxicity' for reward 'toxicity', but "
                                          r"plugin 'toxicity' is installed but not loaded: STEERKIT_PLUGINS="):
        get_reward("toxicity")
    assert origin("aaa-impostor:toxicity") == "steerkit-impostor"  # explicit references still work

    monkeypatch.delenv(registry.ENV_ALLOWLIST)
    monkeypatch.setenv(PREFER, "toxicity=steerkit-sentiment")
    registry.reset()
    with pytest.raises(PluginConflictError, match="does not register a reward named 'toxicity'"):
        get_reward("toxicity")

    for bad, why in [("toxicity", "needs the form NAME=PLUGIN"), ("toxicity=", "needs a plugin"),
                     ("tox city=x", "is not a reward or scorer name"),
                     ("toxicity=a,toxicity=b", "is given twice")]:
        monkeypatch.setenv(PREFER, bad)
        registry.reset()
        with pytest.raises(PluginError, match=f"STEERKIT_PREFER=.* is not valid:\n.*{why}"):
            get_reward("sentiment")


def test_a_clashing_entry_point_name_is_loaded_and_reported(site, tmp_path, monkeypatch):
    """An impostor may declare the entry point `toxicity` itself; it used to win by coming first on sys.path."""
    first = tmp_path / "first"
    first.mkdir()
    write_plugin(first, "toxicity", "steerkit-toxicity-plus", "9.9", "sk_conflict_plus", ["toxicity"], "plus")
    monkeypatch.syspath_prepend(str(first))
    registry.reset()
    with pytest.raises(PluginConflictError, match="plugin 'toxicity@steerkit-toxicity' \\(steerkit-toxicity 0.1.0\\)"):
        get_reward("toxicity")
    assert origin("steerkit-toxicity:toxicity") == "steerkit-toxicity"
    assert origin("steerkit-toxicity-plus:toxicity") == "steerkit-toxicity-plus"
    plugin = next(p for p in registry.list_plugins() if p.name == "toxicity@steerkit-toxicity")
    assert plugin.loaded and "also declares" not in plugin.errors[0] and "like the package steerkit-toxicity-plus" \
        in plugin.errors[0]


def test_scorers_and_in_process_plugins(site):
    class SecondVader:
        @registry.hookimpl
        def register_scorers(self, register):
            register("vader", lambda: type("S", (), {"score": lambda self, t: [0.0] * len(t)})(), description="mine")

        @registry.hookimpl
        def register_reward_models(self, register):
            register("toxicity", lambda: object())

    info = registry.register_plugin(SecondVader(), name="my-vader")  # sharing a name is not a load failure
    assert info.loaded and not info.errors and len(info.conflicts) == 2
    with pytest.raises(PluginConflictError, match=r"(?s)Scorer 'vader' is registered by 2 plugins.*"
                                                  r"STEERKIT_PLUGINS cannot help here"):
        registry.get_scorer("vader")
    with pytest.raises(PluginConflictError, match="registered by 3 plugins"):
        get_reward("toxicity")
    assert registry.get_scorer("my-vader:vader").score(["a"]) == [0.0]
    assert registry.get_registry().get("scorer", "steerkit:vader").plugin == "steerkit.evaluation.builtin_scorers"
    registry.prefer("vader", "steerkit")
    assert registry.get_registry().get("scorer", "vader").plugin == "steerkit.evaluation.builtin_scorers"
    registry.unregister_plugin("my-vader")
    assert registry.get_registry().get("scorer", "vader").plugin == "steerkit.evaluation.builtin_scorers"
    with pytest.raises(PluginError, match="must not contain ':'"):
        registry.register_plugin(SecondVader(), name="my:vader")


def test_plugins_command_shows_the_conflict(site):
    result = CliRunner().invoke(app, ["plugins"])  # not a terminal: plain tab-separated rows
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.splitlines() if "\t" in line]
    assert rows[0] == ["plugin", "version", "provides", "status", "description"]
    assert ["aaa-impostor", "steerkit-impostor 6.6.6", "reward toxicity", "CONFLICT: use steerkit-impostor:toxicity",
            "an impostor"] in rows
    assert ["toxicity", "steerkit-toxicity 0.1.0", "reward toxicity", "CONFLICT: use steerkit-toxicity:toxicity",
            "the shipped toxicity reward"] in rows
    assert ["aaa-impostor", "steerkit-impostor 6.6.6", "reward impostor-only", "ok", "an impostor"] in rows
    assert "CONFLICT: Reward 'toxicity' is registered by 2 plugins" in result.output

    data = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).output)
    [conflict] = data["conflicts"]
    assert conflict["name"] == "toxicity" and conflict["selected"] is None
    assert {p["reference"] for p in conflict["providers"]} == {"steerkit-toxicity:toxicity",
                                                               "steerkit-impostor:toxicity"}
    assert not any(r["name"] == "toxicity" for r in data["rewards"])

    registry.reset()
    result = CliRunner().invoke(app, ["plugins"], env={PREFER: "toxicity=steerkit-toxicity"})
    registry.reset()
    assert "note: reward 'toxicity' is registered by 'aaa-impostor', 'toxicity'; STEERKIT_PREFER selects 'toxicity'." \
        in result.output
    rows = [line.split("\t") for line in result.output.splitlines() if "\t" in line]
    assert ["toxicity", "steerkit-toxicity 0.1.0", "reward toxicity", "selected (STEERKIT_PREFER)",
            "the shipped toxicity reward"] in rows
    assert ["aaa-impostor", "steerkit-impostor 6.6.6", "reward toxicity", "not selected: use steerkit-impostor:toxicity",
            "an impostor"] in rows


def test_plugins_command_never_truncates_names(site):
    write_plugin(site, LONG_PLUGIN, "steerkit-long-names", "1.0", "sk_conflict_long", [LONG_REWARD],
                 "a description that is long as well, " * 4)
    registry.reset()
    result = CliRunner().invoke(app, ["plugins"], env={"COLUMNS": "80"})  # piped: no table, no width
    assert result.exit_code == 0, result.output
    assert f"{LONG_PLUGIN}\tsteerkit-long-names 1.0\treward {LONG_REWARD}\tok\t" in result.output
    assert "…" not in result.output

    registry.reset()
    result = CliRunner().invoke(app, ["plugins"], env={"COLUMNS": "80", "TTY_COMPATIBLE": "1"})  # a terminal
    assert result.exit_code == 0, result.output
    assert "┃" in result.output and "…" not in result.output  # a table whose cells fold long names
    assert "CONFLICT" in result.output

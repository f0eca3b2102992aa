"""``steerkit plugins``: a row's status says whether that name is usable now.

A plugin whose import or hook failed shows ``error: <reason>`` in its own row (not only below the table); a
backend or scorer of steerkit's whose optional package is absent shows ``missing: pip install ...``. The plugins
are real distributions (dist-info directories with entry points on sys.path), loaded as pip-installed ones are.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from steerkit import registry
from steerkit.cli import app
from steerkit.testing import write_distribution

RAISING = '''
from steerkit import hookimpl

@hookimpl
def register_reward_models(register):
    register("half-registered", lambda: None)
    raise RuntimeError("config file not found")

@hookimpl
def register_scorers(register):
    register("still-works", lambda: None, description="a scorer of a plugin whose other hook failed")
'''

ONLY_HOOK_RAISES = '''
from steerkit import hookimpl

@hookimpl
def register_reward_models(register):
    raise KeyError("no such model")
'''

PLUGINS = {
    # entry-point name: (distribution, version, module, source)
    "sk-raising": ("steerkit-sk-raising", "0.2", "sk_status_raising", RAISING),
    "sk-only-raises": ("steerkit-sk-only-raises", "0.3", "sk_status_only_raises", ONLY_HOOK_RAISES),
    "sk-unimportable": ("steerkit-sk-unimportable", "0.1", "sk_status_unimportable",
                        "raise ImportError('needs the frobnicate package')\n"),
}


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for ep_name, (dist, version, module, source) in PLUGINS.items():
        write_distribution(site, ep_name, dist, version, module, textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(registry.ENV_ALLOWLIST, raising=False)
    monkeypatch.delenv(registry.ENV_PREFER, raising=False)
    registry.reset()
    yield site
    registry.reset()
    for _, _, module, _ in PLUGINS.values():
        sys.modules.pop(module, None)


def plain_rows(args=("plugins",), env=None) -> list[list[str]]:
    result = CliRunner().invoke(app, list(args), env=env)  # not a terminal: tab-separated rows
    assert result.exit_code == 0, result.output
    return [line.split("\t") for line in result.output.splitlines() if "\t" in line]


def rows_of(rows, plugin) -> dict[str, str]:
    """provides -> status of one plugin's rows."""
    return {row[2]: row[3] for row in rows if row[0] == plugin}


def test_a_plugin_whose_hook_raised_shows_the_error_in_its_row(site):
    rows = plain_rows()
    assert rows[0] == ["plugin", "version", "provides", "status", "description"]
    assert all(len(row) == 5 for row in rows)
    raising = rows_of(rows, "sk-raising")
    assert raising["register_reward_models"] == "error: RuntimeError: config file not found"
    assert raising["scorer still-works"] == "ok"  # what its other hook registered is usable
    assert "reward half-registered" not in raising  # dropped: nothing a failed hook registered is used
    assert rows_of(rows, "sk-only-raises") == {"register_reward_models": "error: KeyError: 'no such model'"}
    assert rows_of(rows, "sk-unimportable") == {
        "-": "error: failed to load: ImportError: needs the frobnicate package"}


def test_the_table_on_a_terminal_shows_the_error_in_the_row(site):
    result = CliRunner().invoke(app, ["plugins"], env={"COLUMNS": "250", "TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0, result.output
    table = result.output.split("└")[0]  # the table, not the error lines printed below it
    [line] = [line for line in table.splitlines() if "sk-only-raises" in line]
    assert "error: KeyError: 'no such model'" in line
    assert "ok" not in line.split("│")[4]


@pytest.fixture
def absent(monkeypatch):
    """Make ``importlib.util.find_spec`` report the given top-level modules as not installed."""
    real = importlib.util.find_spec
    gone: set[str] = set()

    def find_spec(name, package=None):
        if name.split(".")[0] in gone:
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delenv(registry.ENV_ALLOWLIST, raising=False)
    monkeypatch.delenv(registry.ENV_PREFER, raising=False)
    registry.reset()
    yield gone
    registry.reset()


def _missing() -> set:
    data = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).output)
    return {(m["kind"], m["name"]) for m in data["missing"]}


def test_a_backend_or_scorer_whose_dependency_is_absent_is_missing(absent):
    already = _missing()  # what this environment lacks anyway (e.g. tox-block in the lower-bound venv)
    registry.reset()
    absent.update({"onnxruntime", "vaderSentiment"})
    rows = plain_rows()
    backends = rows_of(rows, "steerkit.rewards.builtin_backends")
    scorers = rows_of(rows, "steerkit.evaluation.builtin_scorers")
    assert backends["backend onnx"].startswith("missing: pip install 'steerkit-rad[onnx]'")
    assert "onnxruntime" in backends["backend onnx"]
    assert backends["backend torch"] == "ok" and backends["backend torch-bf16"] == "ok"
    assert backends["backend onnx-int8"].startswith("missing: pip install 'steerkit-rad[onnx]'")
    assert scorers["scorer vader"].startswith('missing: pip install "steerkit-rad[eval]"')
    assert "vaderSentiment" in scorers["scorer vader"]
    assert scorers["scorer perspective"] == "ok"

    assert _missing() == already | {("backend", "onnx"), ("backend", "onnx-int8"), ("scorer", "vader")}


def test_an_installed_dependency_is_ok(absent):
    spec = importlib.util.find_spec
    rows = rows_of(plain_rows(), "steerkit.evaluation.builtin_scorers")
    assert (rows["scorer vader"] == "ok") == (spec("vaderSentiment") is not None)
    assert rows["scorer reward"] == "ok"


def test_the_terminal_table_shows_missing_with_the_install_command(absent):
    absent.add("textblob")
    result = CliRunner().invoke(app, ["plugins"], env={"COLUMNS": "250", "TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "scorer textblob" in line]
    assert 'missing: pip install "steerkit-rad[eval]"' in line

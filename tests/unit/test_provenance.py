"""steerkit is distributed as ``steerkit-rad``; a distribution named ``steerkit`` (the unrelated PyPI project) or any
other one shipping files inside the ``steerkit`` package is refused (:mod:`steerkit.provenance`), and messages that
quote ``pip install "steerkit-rad[ray]"`` keep their brackets.

The installed distributions are real ones: ``.dist-info`` / ``.egg-info`` directories written to a temporary
directory that is put on ``sys.path`` (or passed as ``path``), read by ``importlib.metadata`` as pip-installed
packages are.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steerkit import provenance, registry
from steerkit.errors import ForeignDistributionError, SteerkitError
from steerkit.rewards.loading import get_reward

ROOT = Path(__file__).resolve().parents[2]


def dist_info(site: Path, name: str, version: str, *, files=(), top_level: str | None = None,
              egg: bool = False) -> Path:
    """A distribution's metadata directory as pip (``.dist-info``, with RECORD) or setuptools (``.egg-info``)
    writes it, plus the files its RECORD lists."""
    stem = f"{name.replace('-', '_')}-{version}"
    meta = site / (f"{name.replace('-', '_')}.egg-info" if egg else f"{stem}.dist-info")
    meta.mkdir(parents=True)
    (meta / ("PKG-INFO" if egg else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    if top_level is not None:
        (meta / "top_level.txt").write_text(top_level + "\n", encoding="utf-8")
    for file in files:
        (site / file).parent.mkdir(parents=True, exist_ok=True)
        (site / file).write_text("", encoding="utf-8")
    if not egg:
        record = [*files, f"{meta.name}/METADATA", f"{meta.name}/RECORD"]
        (meta / "RECORD").write_text("".join(f"{f},,\n" for f in record), encoding="utf-8")
    return meta


def foreign_steerkit(site: Path) -> Path:
    """What ``pip install steerkit`` (the unrelated project, 0.3.0) leaves: its metadata and its own package."""
    return dist_info(site, "steerkit", "0.3.0", files=["steerkit/__init__.py", "steerkit/core.py"])


# -- what counts as foreign -----------------------------------------------------------------------------------------
def test_a_distribution_named_steerkit_is_foreign(tmp_path):
    foreign_steerkit(tmp_path)
    [found] = provenance.foreign_distributions([tmp_path])
    assert (found.name, found.version, found.named) == ("steerkit", "0.3.0", True)
    assert found.location == str(tmp_path.resolve())
    # found by name even with no file in the package (metadata left behind, a wheel of another layout)
    other = tmp_path / "other"
    dist_info(other, "Steerkit", "0.2.0", files=["steerkit_core/__init__.py"])
    assert [f.name for f in provenance.foreign_distributions([other])] == ["Steerkit"]


def test_another_distribution_shipping_the_package_is_foreign(tmp_path):
    by_record = tmp_path / "record"  # no top_level.txt (flit, hatch, poetry wheels): RECORD's first parts
    dist_info(by_record, "steerkit-fork", "1.0", files=["steerkit/__init__.py"])
    by_top_level = tmp_path / "top"
    dist_info(by_top_level, "sk-contrib", "2.0", files=["steerkit/contrib/x.py"], top_level="steerkit")
    module = tmp_path / "module"
    dist_info(module, "steerkit-single", "0.1", files=["steerkit.py"])
    for site, name in ((by_record, "steerkit-fork"), (by_top_level, "sk-contrib"), (module, "steerkit-single")):
        [found] = provenance.foreign_distributions([site])
        assert (found.name, found.named) == (name, False)
        assert "ships files inside the 'steerkit' import package" in found.describe()


def test_steerkit_rad_and_plugins_are_not_foreign(tmp_path):
    # a regular install of steerkit-rad, under any spelling of its name
    dist_info(tmp_path / "wheel", "steerkit-rad", "0.1.0", files=["steerkit/__init__.py"], top_level="steerkit")
    dist_info(tmp_path / "spelled", "Steerkit_RAD", "0.1.0", files=["steerkit/__init__.py"])
    # an editable install as setuptools makes it: RECORD lists a path hook, not the package
    dist_info(tmp_path / "editable", "steerkit-rad", "0.1.0", top_level="steerkit",
              files=["__editable__.steerkit_rad-0.1.0.pth", "__editable___steerkit_rad_0_1_0_finder.py"])
    # plugins: their own packages, their names start with steerkit- but they are not steerkit
    dist_info(tmp_path / "plugins", "steerkit-toxicity", "0.2.0", files=["steerkit_toxicity/__init__.py"])
    dist_info(tmp_path / "plugins", "steerkit-impostor", "0.1.0", files=["steerkit_impostor.py"],
              top_level="steerkit_impostor")
    sites = [tmp_path / d for d in ("wheel", "spelled", "editable", "plugins")]
    assert provenance.foreign_distributions(sites) == []


def test_this_environment_passes(tmp_path):
    """The environment the suite runs in (steerkit-rad installed editable by `pip install -e .`, the plugins too)
    is not refused, and where the checkout holds a pre-rename ``steerkit.egg-info`` that is not refused either."""
    assert provenance.foreign_distributions() == []
    provenance.check_distribution()
    try:
        origin = json.loads(importlib.metadata.distribution("steerkit-rad").read_text("direct_url.json") or "{}")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("steerkit-rad is not installed here (run from a source tree)")
    if origin.get("dir_info", {}).get("editable"):
        assert provenance.reinstall_command() == (
            f"pip install --force-reinstall --no-deps -e {Path(provenance.__file__).resolve().parents[1]}")


def test_a_build_leftover_in_the_checkout_is_not_an_installation(tmp_path, monkeypatch):
    """Building a checkout before the rename wrote ``steerkit.egg-info`` beside ``steerkit/``; it is found only when
    the checkout's root is on sys.path (``python -m steerkit`` from there) and installs nothing: not refused. The
    same metadata anywhere else, or a ``.dist-info`` there, is."""
    checkout = tmp_path / "checkout"
    dist_info(checkout, "steerkit", "0.1.0", egg=True)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'steerkit-rad'\n", encoding="utf-8")
    monkeypatch.setattr(provenance, "_ROOT", checkout.resolve())
    assert provenance.foreign_distributions([checkout]) == []
    (checkout / "pyproject.toml").unlink()  # not a source tree: an egg-info installation
    assert [f.name for f in provenance.foreign_distributions([checkout])] == ["steerkit"]
    site = tmp_path / "site"
    dist_info(site, "steerkit", "0.1.0", egg=True)
    assert [f.name for f in provenance.foreign_distributions([site])] == ["steerkit"]


def test_builtins_belong_to_steerkit_rad_and_answer_to_steerkit_too():
    reg = registry.Registry(entry_points=False)
    assert {p.distribution for p in reg.plugins.values()} == {"steerkit-rad"}
    assert {p.version for p in reg.plugins.values()} == {registry._steerkit_version()} != {"0"}
    for ref in ("steerkit-rad:vader", "steerkit:vader", "steerkit_rad:vader"):
        assert reg.get("scorer", ref).plugin == "steerkit.evaluation.builtin_scorers", ref


# -- who refuses ----------------------------------------------------------------------------------------------------
@pytest.fixture
def foreign_on_path(tmp_path, monkeypatch):
    """A foreign ``steerkit`` distribution installed in a directory on sys.path (its package is not imported:
    Python keeps importing steerkit-rad's, as when both are installed and ours comes first)."""
    site = tmp_path / "site"
    foreign_steerkit(site)
    monkeypatch.syspath_prepend(str(site))
    registry.reset()
    yield site
    registry.reset()


def test_check_names_the_foreign_distribution_and_the_fix(foreign_on_path):
    with pytest.raises(ForeignDistributionError) as info:
        provenance.check_distribution(needed_by="steerkit-toxicity")
    message = str(info.value)
    assert isinstance(info.value, SteerkitError)
    assert message.startswith("steerkit-toxicity needs steerkit-rad, but a distribution named 'steerkit' is installed "
                              f"(steerkit 0.3.0 in {foreign_on_path.resolve()})")
    assert "unrelated project" in message and "pip uninstall steerkit && pip install --force-reinstall" in message


def test_the_registry_refuses_to_load_plugins(foreign_on_path):
    with pytest.raises(ForeignDistributionError, match="pip uninstall steerkit"):
        registry.Registry()
    with pytest.raises(ForeignDistributionError):
        get_reward("toxicity")
    assert registry.Registry(entry_points=False).plugins  # the built-ins alone (tests, embedding) still work


def test_a_shipped_plugin_refuses_when_imported(foreign_on_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "plugins" / "steerkit-toxicity"))
    monkeypatch.delitem(sys.modules, "steerkit_toxicity", raising=False)
    importlib.invalidate_caches()
    with pytest.raises(ForeignDistributionError, match="^steerkit-toxicity needs steerkit-rad, but"):
        importlib.import_module("steerkit_toxicity")
    monkeypatch.delitem(sys.modules, "steerkit_toxicity", raising=False)


@pytest.mark.parametrize("site_packages", [False, True])
def test_a_shipped_plugin_refuses_a_foreign_steerkit_package(tmp_path, site_packages):
    """Python imports the other project's ``steerkit`` package itself (it comes first on sys.path).

    Alone (``-S``: no site-packages), the plugin cannot reach steerkit-rad's check or error classes: ImportError with
    the same fix. Beside this environment's steerkit-rad, what the foreign package lacks may come from steerkit-rad
    (an editable install's finder supplies ``steerkit.provenance``): a mix of both, refused by the check itself."""
    site = tmp_path / "site"
    foreign_steerkit(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "plugins" / "steerkit-toxicity")])}
    flags = [] if site_packages else ["-S"]
    proc = subprocess.run([sys.executable, *flags, "-c", "import steerkit_toxicity"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    fallback = ("ImportError: steerkit-toxicity needs steerkit-rad, which is not what `import steerkit` finds (",
                "pip uninstall steerkit, then pip install --force-reinstall --no-deps steerkit-rad")
    checked = ("steerkit.errors.ForeignDistributionError: steerkit-toxicity needs steerkit-rad, but a distribution "
               "named 'steerkit' is installed", "pip uninstall steerkit && pip install --force-reinstall --no-deps")
    expected = [fallback] if not site_packages else [fallback, checked]
    assert any(last.startswith(start) and fix in last for start, fix in expected), proc.stderr


def test_setup_refuses_before_installing_anything(foreign_on_path, monkeypatch, capsys):
    from steerkit.cli import build_app, main
    from steerkit.cli import setup as setup_module

    ran = []
    monkeypatch.setattr(setup_module.subprocess, "run", lambda *a, **k: ran.append(a))
    # setup's own check (an app without plugin commands does not consult the registry)
    result = CliRunner().invoke(build_app(), ["setup", "--no-warm", "--force"])
    assert isinstance(result.exception, ForeignDistributionError) and not ran
    # the console script: one error line, exit 2
    with pytest.raises(SystemExit) as info:
        main(["setup", "--no-warm", "--force"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and not ran
    assert err.startswith("error: a distribution named 'steerkit' is installed") and len(err.splitlines()) == 1
    assert "pip uninstall steerkit" in err


# -- messages quoting pip commands keep their brackets --------------------------------------------------------------
def test_help_keeps_the_extra_in_brackets(capsys, monkeypatch):
    from steerkit.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # one line per option: nothing wraps inside the command
    with pytest.raises(SystemExit) as info:
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert 'Needs pip install "steerkit-rad[ray]".' in out  # Rich took [ray] for a style tag and dropped it
    assert "[default: the cluster's GPUs, else CPUs ÷ threads]" in out and "\\[" not in out  # escaped by hand


def test_message_console_keeps_brackets(capsys):
    from steerkit.cli.common import err

    err.print('--ray needs the ray package: pip install "steerkit-rad[ray]" (data in /d/[abc]/)')
    assert capsys.readouterr().err.strip() == ('--ray needs the ray package: pip install "steerkit-rad[ray]" '
                                               "(data in /d/[abc]/)")


def test_cli_error_quoting_the_install_command_keeps_brackets(tmp_path):
    """`steerkit serve --ray local --replicas 2` without ray's serve extra, run as a user runs it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys; sys.modules['ray.serve'] = None; from steerkit.cli import main; "
            f"main(['serve', '--ray', 'local', '--replicas', '2', '--port', '{port}'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "COLUMNS": "60"})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and 'pip install "steerkit-rad[ray]"' in line

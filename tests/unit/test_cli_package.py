"""The CLI package: one module per command group, and commands added by plugins through ``register_commands``."""

from __future__ import annotations

import importlib

import pytest

from steerkit import hookimpl, registry
from steerkit.cli import app, build_app, main
from steerkit.cli.app import COMMAND_MODULES, command_names


def run(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


@pytest.fixture
def clean_registry():
    registry.reset()
    yield
    registry.reset()


def test_every_command_module_registers_its_group():
    names = command_names(build_app())
    assert {"generate", "score", "setup", "demo", "train", "average", "plugins", "export", "eval"} <= names
    for module in COMMAND_MODULES:
        assert callable(importlib.import_module(f"steerkit.cli.{module}").register), module


def test_the_importable_app_has_no_plugin_commands_but_the_console_script_does(clean_registry, capsys):
    pytest.importorskip("steerkit_example")
    assert "positive-words" not in command_names(app)
    code, out, _ = run(["positive-words", "a good great day", "a day"], capsys)
    assert code == 0
    assert out.splitlines() == ["0.7500\t2\ta good great day", "0.0000\t0\ta day"]


class TakesGenerate:
    @hookimpl
    def register_commands(self, cli):
        @cli.command("generate")
        def impostor():
            print("impostor")


class Broken:
    @hookimpl
    def register_commands(self, cli):
        raise RuntimeError("no config")


class Adds:
    @hookimpl
    def register_commands(self, cli):
        @cli.command("hello-plugin")
        def hello(name: str = "world"):
            print(f"hello {name}")


def test_plugin_commands_are_isolated(clean_registry, capsys):
    for plugin, name in ((TakesGenerate(), "takes-generate"), (Broken(), "broken-cmd"), (Adds(), "adds-cmd")):
        registry.register_plugin(plugin, name)
    code, out, _ = run(["hello-plugin", "--name", "steerkit"], capsys)
    assert (code, out.strip()) == (0, "hello steerkit")
    infos = {i.name: i for i in registry.list_plugins()}
    assert any("command name(s) generate already taken" in e for e in infos["takes-generate"].errors)
    assert any("register_commands: RuntimeError: no config" in e for e in infos["broken-cmd"].errors)
    # steerkit's own generate is untouched
    code, _, err = run(["generate", "--k", "0", "hi"], capsys)
    assert code == 2 and "impostor" not in err

"""The ``steerkit`` typer app: steerkit's command modules, then the commands plugins add.

Each module of this package owns one command group and exposes ``register(app)``; :data:`COMMAND_MODULES`
is the order they appear in ``steerkit --help``. Plugins add commands through the ``register_commands``
hook (see ``docs/plugins.md``): each plugin's hook runs on its own, so a plugin whose hook fails, or that
reuses a taken command name, is reported by ``steerkit plugins`` and the others still load.
"""

from __future__ import annotations

import importlib
from typing import Optional

import typer

from .. import threads as _threads

COMMAND_MODULES = ("generate", "score", "calibrate", "setup", "train", "plugins", "export", "evaluate", "import_cmd",
                   "serve")


def _root(threads: Optional[int] = typer.Option(None, "--threads", help=_threads.HELP, show_default=False)):
    """Controlled text generation with Reward-Augmented Decoding."""
    _threads.set_threads(threads)


def build_app(*, plugins: bool = False) -> typer.Typer:
    """A fresh app with every built-in command, and with the plugins' commands when ``plugins`` is true."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help="Controlled text generation with Reward-Augmented Decoding.")
    app.callback()(_root)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(app)
    if plugins:
        add_plugin_commands(app)
    return app


def command_names(app: typer.Typer) -> set[str]:
    names = {(c.name or c.callback.__name__).replace("_", "-") for c in app.registered_commands}
    return names | {g.name for g in app.registered_groups if g.name}


def add_plugin_commands(app: typer.Typer) -> None:
    """Run every plugin's ``register_commands(cli)`` on its own; record failures on the plugin, skip them."""
    from ..registry import PluginInfo, get_registry

    registry = get_registry()

    def record_error(plugin: str, message: str) -> None:
        registry.plugins.setdefault(plugin, PluginInfo(plugin)).errors.append(message)

    for impl in registry.pm.hook.register_commands.get_hookimpls():
        taken = command_names(app)
        staged = typer.Typer()
        try:
            impl.function(cli=staged)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not break the command line
            record_error(impl.plugin_name, f"register_commands: {type(exc).__name__}: {exc}")
            continue
        clashes = sorted(command_names(staged) & taken)
        if clashes:
            record_error(impl.plugin_name, f"register_commands: command name(s) {', '.join(clashes)} "
                                  "already taken; its commands were not added.")
            continue
        app.registered_commands.extend(staged.registered_commands)
        app.registered_groups.extend(staged.registered_groups)

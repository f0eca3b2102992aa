"""``steerkit plugins``: installed plugins, their versions, what they register, and load errors."""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console
from rich.table import Table

from .cli import app


@app.command("plugins")
def plugins(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """List plugins (entry-point group 'steerkit'), their versions, the rewards and scorers they provide,
    and any load errors. STEERKIT_PLUGINS=a,b limits which plugins load."""
    from . import registry

    infos = registry.list_plugins()
    rewards = registry.list_rewards()
    scorers = registry.list_scorers()
    if as_json:
        payload = {
            "allowlist": os.environ.get(registry.ENV_ALLOWLIST),
            "plugins": [i.to_dict() for i in infos],
            "rewards": [{"name": r.name, "plugin": r.plugin, "description": r.description} for r in rewards],
            "scorers": [{"name": s.name, "plugin": s.plugin, "description": s.description} for s in scorers],
            "errors": {i.name: i.errors for i in infos if i.errors},
        }
        typer.echo(json.dumps(payload, ensure_ascii=False, indent=2))
        return
    console = Console()
    if not infos:
        console.print("No steerkit plugins installed. Install the bundled ones with "
                      "`pip install ./plugins/steerkit-toxicity ./plugins/steerkit-sentiment`.")
        return
    table = Table("plugin", "version", "provides", "description", title="steerkit plugins")
    by_plugin: dict[str, list] = {}
    for reg in [*rewards, *scorers]:
        by_plugin.setdefault(reg.plugin, []).append(reg)
    for info in infos:
        version = info.version or "-"
        if info.distribution and info.distribution != info.name:
            version = f"{info.distribution} {version}"
        regs = by_plugin.get(info.name) or [None]
        for i, reg in enumerate(regs):
            if reg is not None:
                provides = f"{reg.kind} [bold]{reg.name}[/]"
            else:
                provides = "-" if info.loaded else "[red]failed to load[/]"
            table.add_row(info.name if i == 0 else "", version if i == 0 else "", provides,
                          reg.description if reg else "")
    console.print(table)
    for info in infos:
        for error in info.errors:
            console.print(f"[red]{info.name}[/]: {error}", highlight=False)
    allow = os.environ.get(registry.ENV_ALLOWLIST)
    if allow is not None:
        console.print(f"({registry.ENV_ALLOWLIST}={allow!r}: only these plugins were loaded)")

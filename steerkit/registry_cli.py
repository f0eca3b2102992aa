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
    table = Table("plugin", "version", "rewards", "scorers", "status", title="steerkit plugins")
    for info in infos:
        status = "[green]ok[/]" if info.loaded and not info.errors else (
            "[yellow]partial[/]" if info.loaded else "[red]not loaded[/]")
        version = info.version or "-"
        if info.distribution and info.distribution != info.name:
            version = f"{info.distribution} {version}"
        table.add_row(info.name, version, ", ".join(info.rewards) or "-", ", ".join(info.scorers) or "-", status)
    console.print(table)
    described = [(r.kind, r.name, r.description) for r in [*rewards, *scorers] if r.description]
    for kind, name, description in described:
        console.print(f"  {kind} [bold]{name}[/]: {description}")
    for info in infos:
        for error in info.errors:
            console.print(f"[red]{info.name}[/]: {error}", highlight=False)
    allow = os.environ.get(registry.ENV_ALLOWLIST)
    if allow is not None:
        console.print(f"({registry.ENV_ALLOWLIST}={allow!r}: only these plugins were loaded)")

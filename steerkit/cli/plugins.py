"""``steerkit plugins``: installed plugins, their versions, what they register, conflicts and load errors.

On a terminal the listing is a table whose cells fold long names instead of cutting them; when stdout is not a
terminal (piped, redirected, captured) it is plain tab-separated rows, so nothing is ever truncated to 80 columns.
"""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


COLUMNS = ("plugin", "version", "provides", "status", "description")


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """List plugins (entry-point group 'steerkit'), their versions, the rewards and scorers they provide,
    names claimed by two plugins, and any load errors. STEERKIT_PLUGINS=a,b limits which plugins load;
    STEERKIT_PREFER=NAME=PLUGIN picks the provider of a shared name. Plain tab-separated rows when piped."""
    from .. import registry

    reg = registry.get_registry()
    infos = registry.list_plugins()
    conflicts = registry.list_conflicts()
    if as_json:
        payload = {
            "allowlist": os.environ.get(registry.ENV_ALLOWLIST),
            "prefer": os.environ.get(registry.ENV_PREFER),
            "plugins": [i.to_dict() for i in infos],
            "rewards": [{"name": r.name, "plugin": r.plugin, "description": r.description}
                        for r in registry.list_rewards()],
            "scorers": [{"name": s.name, "plugin": s.plugin, "description": s.description}
                        for s in registry.list_scorers()],
            "backends": [{"name": b.name, "plugin": b.plugin, "description": b.description}
                         for b in registry.list_backends()],
            "conflicts": [_conflict_dict(reg, c) for c in conflicts],
            "errors": {i.name: i.errors for i in infos if i.errors},
        }
        typer.echo(json.dumps(payload, ensure_ascii=False, indent=2))
        return
    console = Console(highlight=False)
    plain = not console.is_terminal
    if not infos:
        typer.echo("No steerkit plugins installed. Install the bundled ones with "
                   "`pip install ./plugins/steerkit-toxicity ./plugins/steerkit-sentiment`.")
        return
    rows = _rows(reg, infos)
    if plain:
        typer.echo("\t".join(COLUMNS))
        for row in rows:
            typer.echo("\t".join(_cell(c) for c in row))
    else:
        table = Table(title="steerkit plugins")
        # keep names whole where the terminal allows (the description wraps instead), and fold rather than
        # ellipsize where it does not: a cut name cannot be typed back
        mins = [min(max(len(row[i]) for row in rows), 30) for i in range(3)]
        if sum(mins) + 12 + 20 + 16 > console.width:  # status, a usable description, borders and padding
            mins = [None] * 3
        for i, column in enumerate(COLUMNS):
            table.add_column(column, overflow="fold", min_width=mins[i] if i < 3 else None)
        previous = None
        for plugin, version, provides, status, description in rows:
            first = plugin != previous
            previous = plugin
            status = status.split(":")[0]  # the references are in the conflict section below the table
            style = {"CONFLICT": "bold red", "not selected": "yellow", "failed to load": "red"}.get(status)
            table.add_row(escape(plugin) if first else "", escape(version) if first else "", escape(provides),
                          f"[{style}]{escape(status)}[/]" if style else escape(status), escape(description))
        console.print(table)
    _print_conflicts(reg, conflicts, console, plain)
    for info in infos:
        for error in info.errors:
            if plain:
                typer.echo(f"{info.name}: {error}")
            else:
                console.print(f"[red]{escape(info.name)}[/]: {escape(error)}")
    allow = os.environ.get(registry.ENV_ALLOWLIST)
    if allow is not None:
        typer.echo(f"({registry.ENV_ALLOWLIST}={allow!r}: only these plugins were loaded)")
    prefer = os.environ.get(registry.ENV_PREFER)
    if prefer is not None:
        typer.echo(f"({registry.ENV_PREFER}={prefer!r})")
    for problem in reg.prefer_errors:
        typer.echo(f"{registry.ENV_PREFER} is not valid: {problem}")


def registry_kinds() -> tuple[str, ...]:
    """What plugins register (rewards, scorers, reward backends), in the order the table lists them."""
    from ..hookspecs import KINDS

    return tuple(KINDS)


def _rows(reg, infos) -> list[tuple[str, str, str, str, str]]:
    """One row per (plugin, registered name), with that name's status."""
    rows = []
    for info in infos:
        version = info.version or "-"
        if info.distribution and info.distribution != info.name:
            version = f"{info.distribution} {version}"
        regs = [r for kind in registry_kinds() for regs in reg.claims[kind].values() for r in regs
                if r.plugin == info.name]
        if not regs:
            rows.append((info.name, version, "-", "ok" if info.loaded else "failed to load", ""))
        for r in regs:
            rows.append((info.name, version, f"{r.kind} {r.name}", _status(reg, r), r.description))
    return rows


def _status(reg, r) -> str:
    conflict = reg.conflicts[r.kind].get(r.name)
    if conflict is None:
        return "ok" if reg.entries[r.kind].get(r.name) is r else "not selected"
    if conflict.selected is r:
        return "selected (STEERKIT_PREFER)"
    if conflict.selected is not None:
        return f"not selected: use {reg.qualified(r)}"
    return f"CONFLICT: use {reg.qualified(r)}"


def _print_conflicts(reg, conflicts, console: Console, plain: bool) -> None:
    for conflict in conflicts:
        if conflict.selected is not None:
            text = (f"{conflict.kind} {conflict.name!r} is registered by "
                    f"{', '.join(repr(r.plugin) for r in conflict.providers)}; STEERKIT_PREFER selects "
                    f"{conflict.selected.plugin!r}.")
            typer.echo(f"note: {text}") if plain else console.print(f"[yellow]note[/]: {escape(text)}")
            continue
        text = reg.conflict_message(conflict)
        if plain:
            typer.echo("CONFLICT: " + text)
        else:
            console.print(f"[bold red]CONFLICT[/]: {escape(text)}")


def _conflict_dict(reg, conflict) -> dict:
    return {
        "kind": conflict.kind,
        "name": conflict.name,
        "providers": [{"plugin": r.plugin, "distribution": reg.plugins[r.plugin].distribution,
                       "version": reg.plugins[r.plugin].version, "reference": reg.qualified(r),
                       "description": r.description} for r in conflict.providers],
        "selected": conflict.selected.plugin if conflict.selected else None,
        "problem": conflict.problem,
    }


def _cell(text: str) -> str:
    return " ".join(str(text).split()) or "-"


def register(app: typer.Typer) -> None:
    app.command("plugins")(plugins)

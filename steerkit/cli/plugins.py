"""``steerkit plugins``: installed plugins, their versions, what they register, conflicts and load errors.

On a terminal the listing is a table whose cells fold long names instead of cutting them; when stdout is not a
terminal (piped, redirected, captured) it is plain tab-separated rows, so nothing is ever truncated to 80 columns.
"""

from __future__ import annotations

import importlib.util
import json
import os

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


COLUMNS = ("plugin", "version", "provides", "status", "description")

_SCORERS = "steerkit.evaluation.builtin_scorers"
_BACKENDS = "steerkit.rewards.builtin_backends"
_EVAL = 'pip install "steerkit-rad[eval]"'
#: What steerkit's own backends and scorers import when used, and the install command that provides it (as in
#: steerkit.rewards.onnx.export.INSTALL_HINT and steerkit.evaluation.scorers.offline): (plugin, kind, name) ->
#: (top-level modules, install command). A status says "missing" when one of the modules cannot be found; the
#: check is ``importlib.util.find_spec``, which imports nothing.
OPTIONAL_DEPENDENCIES: dict[tuple[str, str, str], tuple[tuple[str, ...], str]] = {
    (_BACKENDS, "backend", "onnx"): (("onnxruntime", "onnx"), "pip install 'steerkit-rad[onnx]'"),
    (_BACKENDS, "backend", "onnx-int8"): (("onnxruntime", "onnx"), "pip install 'steerkit-rad[onnx]'"),
    (_SCORERS, "scorer", "tox-block"): (("tox_block", "tf_keras", "tensorflow"),
                                        'pip install "steerkit-rad[eval-tox-block]"'),
    (_SCORERS, "scorer", "alt-profanity-check"): (("profanity_check",), _EVAL),
    (_SCORERS, "scorer", "vader"): (("vaderSentiment",), _EVAL),
    (_SCORERS, "scorer", "textblob"): (("textblob",), _EVAL),
}


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
            "missing": [{"kind": r.kind, "name": r.name, "plugin": r.plugin, "install": missing}
                        for r in _registrations(reg) if (missing := missing_dependency(r)) is not None],
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
            key = status.split(":")[0]
            if key in ("CONFLICT", "not selected"):
                status = key  # the references are in the conflict section below the table
            style = {"CONFLICT": "bold red", "not selected": "yellow", "failed to load": "red", "error": "red",
                     "missing": "yellow"}.get(key)
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
    """One row per (plugin, registered name), with that name's status, then one row per error of the plugin (a
    failed import or hook, a rejected registration), whose status is ``error: <reason>``."""
    rows = []
    registrations = _registrations(reg)
    for info in infos:
        version = info.version or "-"
        if info.distribution and info.distribution != info.name:
            version = f"{info.distribution} {version}"
        regs = [r for r in registrations if r.plugin == info.name]
        errors = [_error_row(error) for error in info.errors]
        if not regs and not errors:
            rows.append((info.name, version, "-", "ok" if info.loaded else "failed to load", ""))
        for r in regs:
            rows.append((info.name, version, f"{r.kind} {r.name}", _status(reg, r), r.description))
        for provides, reason in errors:
            rows.append((info.name, version, provides, f"error: {reason}", ""))
    return rows


def _registrations(reg) -> list:
    """Every registration, in the order the table lists them."""
    return [r for kind in registry_kinds() for regs in reg.claims[kind].values() for r in regs]


def _error_row(error: str) -> tuple[str, str]:
    """A plugin's recorded error as (provides, short reason): the hook that failed (``-`` when the plugin did not
    load) and the first line of what went wrong; the full message is printed below the table."""
    first = (error.strip().splitlines() or ["unknown error"])[0]
    hook, sep, rest = first.partition(": ")
    if sep and hook.startswith("register_"):
        return hook, rest.removesuffix(" (nothing it registered is used)")
    return "-", first


def missing_dependency(r) -> str | None:
    """The install command when a backend or scorer of steerkit's cannot run for want of an optional package
    (the missing modules in parentheses), else None."""
    needs = OPTIONAL_DEPENDENCIES.get((r.plugin, r.kind, r.name))
    if needs is None:
        return None
    modules, install = needs
    absent = [m for m in modules if not _importable(m)]
    return f"{install}  ({', '.join(absent)})" if absent else None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module whose __spec__ is None
        return False


def _status(reg, r) -> str:
    conflict = reg.conflicts[r.kind].get(r.name)
    if conflict is None:
        if reg.entries[r.kind].get(r.name) is not r:
            return "not selected"
        missing = missing_dependency(r)
        return "ok" if missing is None else f"missing: {missing}"
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

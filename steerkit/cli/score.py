"""``steerkit score``: a reward model's ρ of texts, scored from scratch (and of every prefix)."""

from __future__ import annotations

import json
import math
from typing import List

import typer

from .common import BACKEND_HELP
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import InvalidArgumentError, NonFiniteRewardError


def score(
    texts: List[str] = typer.Argument(..., help="Texts to score."),
    reward: str = typer.Option(..., "--reward", "-r", help="Reward reference: registered name or directory."),
    prefixes: bool = typer.Option(False, "--prefixes", help="Also print the reward of every prefix."),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json"),
):
    """Print each text's reward ρ in [0, 1] (scored from scratch)."""
    from ..rewards.loading import load_reward

    scorer = load_reward(reward, backend=backend)
    if not callable(getattr(getattr(scorer, "model", None), "score_texts", None)):
        raise InvalidArgumentError(
            f"Reward {reward!r} is not a reward model (it is a {type(scorer).__name__}): `steerkit score` scores texts "
            "with trained reward models only. See what it does while steering with "
            f"`steerkit generate PROMPT --reward {reward}=BETA --json --traces`.")
    finals, per_prefix = scorer.model.score_texts(list(texts), per_prefix=True)
    bad = [i for i, (final, prefix_rewards) in enumerate(zip(finals, per_prefix))
           if not all(math.isfinite(r) for r in [final, *prefix_rewards])]
    if bad:
        raise NonFiniteRewardError(f"Reward {reward!r} returned NaN or infinity for text {bad[0]} (of {len(texts)}): "
                                   "its weights are corrupt or it overflowed; retrain or re-export it.")
    tokenizer = scorer.model.tokenizer
    records = []
    for text, final, prefix_rewards in zip(texts, finals, per_prefix):
        record = {"text": text, "reward": final}
        if prefixes:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            record["prefixes"] = [{"token": tokenizer.decode([i]), "reward": r} for i, r in zip(ids, prefix_rewards)]
        records.append(record)
    if as_json:
        typer.echo(json.dumps({"reward": reward, "results": records}, ensure_ascii=False))
        return
    table = Table("reward", "text")
    for r in records:
        table.add_row(f"{r['reward']:.4f}", Text(r["text"]))  # Text: no markup in user text
        for p in r.get("prefixes", []):
            table.add_row(f"  {p['reward']:.4f}", Text(f"  …{p['token']!r}"))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command()(score)

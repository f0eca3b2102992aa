"""The ``steerkit`` command line (typer).

Each command lives next to the concept it drives; this module only wires them together:
``generate`` and ``score`` here, ``train`` in :mod:`steerkit.training.cli`, ``export`` in
:mod:`steerkit.export_cli`, ``plugins`` in :mod:`steerkit.registry_cli`, ``eval`` in
:mod:`steerkit.evaluation.cli`. Every :class:`~steerkit.errors.SteerkitError` becomes a one-line
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import InvalidArgumentError, SteerkitError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Controlled text generation with Reward-Augmented Decoding.")
err = Console(stderr=True)


def parse_reward_weight(spec: str) -> tuple[str, float]:
    """``NAME=BETA`` or ``PATH=BETA`` (the last '=' splits, so paths may contain '=')."""
    ref, sep, beta = spec.rpartition("=")
    if not sep or not ref:
        raise InvalidArgumentError(f"--reward expects REF=BETA (e.g. toxicity=-10), got {spec!r}.")
    try:
        value = float(beta)
    except ValueError:
        raise InvalidArgumentError(f"--reward {spec!r}: beta {beta!r} is not a number.") from None
    if not math.isfinite(value):
        raise InvalidArgumentError(f"--reward {spec!r}: beta must be finite.")
    return ref, value


@app.command()
def generate(
    prompts: List[str] = typer.Argument(None, help="Prompt texts (or use --prompts-file / --config)."),
    lm: Optional[str] = typer.Option(None, "--lm", help="LM reference: packaged name, directory, .gguf, hub id."),
    reward: List[str] = typer.Option([], "--reward", "-r", help="REF=BETA, repeatable (β<0 steers away)."),
    k: Optional[int] = typer.Option(None, "--k", "-k", help="Top-k candidates reweighted per step."),
    n: Optional[int] = typer.Option(None, "-n", "--num-return-sequences", help="Continuations per prompt."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", "-t"),
    temperature: Optional[float] = typer.Option(None, "--temperature"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    greedy: bool = typer.Option(False, "--greedy", help="Argmax instead of sampling."),
    chat: bool = typer.Option(False, "--chat", help="Wrap prompts in the LM's chat template."),
    stop: List[str] = typer.Option([], "--stop", help="Stop string, repeatable."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Reward backend: torch or onnx."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device: cpu (default), cuda, cuda:1, mps."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="SteeringConfig YAML/TOML file."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="One prompt per line."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Rows decoded together (progress per batch)."),
    traces: bool = typer.Option(False, "--traces", help="Include per-step traces in --json output."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (see docs/cli.md)."),
):
    """Generate steered continuations."""
    from .config import SteeringConfig

    cfg = SteeringConfig.from_file(config) if config else SteeringConfig()
    overrides = {"lm": lm, "k": k, "num_return_sequences": n, "max_new_tokens": max_new_tokens,
                 "temperature": temperature, "seed": seed, "backend": backend, "device": device}
    cfg = cfg.with_overrides({key: v for key, v in overrides.items() if v is not None})
    if greedy:
        cfg = cfg.with_overrides({"do_sample": False})
    if chat:
        cfg = cfg.with_overrides({"chat_template": True})
    if reward:
        cfg = cfg.with_rewards([parse_reward_weight(s) for s in reward])
    texts = list(prompts or [])
    if prompts_file:
        texts += [line.rstrip("\n") for line in prompts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = texts or list(cfg.prompts)
    out = cfg.generate(texts, stop_strings=stop or None, return_traces=traces, batch_size=batch_size,
                       progress=not as_json)
    if as_json:
        payload = {"lm": cfg.lm, "k": cfg.k, "rewards": [r.model_dump() for r in cfg.rewards],
                   "seconds": out.seconds, "tokens_per_second": out.tokens_per_second,
                   "generations": out.to_records()}
        if traces and out.traces:
            payload["traces"] = [[s.to_dict() for s in chunk] for chunk in out.traces]
        typer.echo(json.dumps(payload, ensure_ascii=False))
        return
    for record in out.to_records():
        typer.echo(f"\033[2m{record['prompt']}\033[0m{record['text']}" if sys.stdout.isatty()
                   else f"{record['prompt']}{record['text']}")
        typer.echo("---")
    err.print(f"{sum(out.num_new_tokens)} tokens in {out.seconds:.1f} s ({out.tokens_per_second:.1f} tok/s)")


@app.command()
def score(
    texts: List[str] = typer.Argument(..., help="Texts to score."),
    reward: str = typer.Option(..., "--reward", "-r", help="Reward reference: registered name or directory."),
    prefixes: bool = typer.Option(False, "--prefixes", help="Also print the reward of every prefix."),
    backend: str = typer.Option("torch", "--backend", help="torch or onnx."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Print each text's reward ρ in [0, 1] (scored from scratch)."""
    from .rewards.loading import load_reward

    scorer = load_reward(reward, backend=backend)
    finals, per_prefix = scorer.model.score_texts(list(texts), per_prefix=True)
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
        table.add_row(f"{r['reward']:.4f}", r["text"])
        for p in r.get("prefixes", []):
            table.add_row(f"  {p['reward']:.4f}", f"  …{p['token']!r}")
    Console().print(table)


# Commands that live with their own concept register themselves on `app` when imported.
for _module in ("steerkit.setup_cli", "steerkit.training.cli", "steerkit.registry_cli", "steerkit.export_cli", "steerkit.evaluation.cli"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as exc:  # a part not built yet, or an optional dependency missing
        if exc.name and not exc.name.startswith("steerkit"):
            raise


def main() -> None:
    try:
        app()
    except SteerkitError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":  # `python -m steerkit.cli`: run the imported module's app, where commands registered
    from steerkit.cli import main as _main

    _main()

"""``steerkit train``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.markup import escape

from .common import err
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..training.config import TrainConfig


def _pair(value: str, flag: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in value.split(","))
    except ValueError:
        raise ConfigError(f"{flag} expects LOW,HIGH (e.g. -4,4), got {value!r}.") from None
    return lo, hi


def _source(path: str, text: str, label: Optional[str], label_value: Optional[float], transform: dict) -> dict:
    weight = 1.0
    if "@" in path and path.rsplit("@", 1)[1].replace(".", "", 1).isdigit():
        path, w = path.rsplit("@", 1)
        weight = float(w)
    source = {"path": path, "text": text, "weight": weight, "transform": transform}
    if label_value is not None:
        source["label_value"] = label_value
    else:
        source["label"] = label or "label"
    return source


def train(
    config: Optional[Path] = typer.Argument(None, help="TrainConfig YAML/TOML/JSON file (flags override it)."),
    data: List[str] = typer.Option([], "--data", "-d", help="Data file (CSV, TSV, JSONL, .txt), repeatable; "
                                   "PATH@WEIGHT sets its mixing weight. Replaces the config's data."),
    text: str = typer.Option("text", "--text", help="Text column or dotted JSON path for --data files."),
    label: Optional[str] = typer.Option(None, "--label", help="Label column or dotted path (e.g. continuation.toxicity). "
                                        "\\[default: label]"),
    label_value: Optional[float] = typer.Option(None, "--label-value", help="Constant label for every --data row."),
    rescale: Optional[str] = typer.Option(None, "--rescale", help="Map labels from LOW,HIGH to [0,1], e.g. -4,4."),
    binary: Optional[float] = typer.Option(None, "--binary", help="Binarise labels: >= threshold -> 1."),
    invert: bool = typer.Option(False, "--invert", help="ρ = 1 − label."),
    eval_files: List[str] = typer.Option([], "--eval", help="Held-out test file (same columns), repeatable."),
    data_root: Optional[str] = typer.Option(None, "--data-root", help="Root for relative data paths "
                                            "(default: the config's data_root, else $STEERKIT_DATA_ROOT)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Reward-model directory to write."),
    backbone: Optional[str] = typer.Option(None, "--backbone", help="Causal LM reference (default smollm2-135m-instruct)."),
    layers: Optional[int] = typer.Option(None, "--num-layers", "--layers", help="Keep only the first N transformer "
                                         "layers (num_layers)."),
    method: Optional[str] = typer.Option(None, "--method", help="lora, head or full."),
    lora_r: Optional[int] = typer.Option(None, "--lora-r", help="LoRA rank (lora.r)."),
    lora_alpha: Optional[int] = typer.Option(None, "--lora-alpha", help="LoRA scaling alpha (lora.alpha)."),
    dev_fraction: Optional[float] = typer.Option(None, "--dev-fraction", help="Share of each source held out as "
                                                 "the dev split, in [0, 1)."),
    loss: Optional[str] = typer.Option(None, "--loss", help="cumulative (paper) or last (last-token MSE)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Tokens per text incl. the start token."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Passes over the (weighted) data, if --steps unset."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size"),
    lr: Optional[float] = typer.Option(None, "--lr"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Dev evaluation every N steps."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every"),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Default: OUTPUT.checkpoints"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu (default), cuda, cuda:1, mps."),
    leave_out: List[str] = typer.Option([], "--leave-out", help="Hold this source (name or group) out of training "
                                        "and test on it; repeatable."),
    assess_model: Optional[str] = typer.Option(None, "--assess", help="Train nothing: measure this existing reward "
                                               "model directory on the config's dev split, test sets and functional "
                                               "cases (the metrics training would report)."),
    cross_source: Optional[Path] = typer.Option(None, "--cross-source", help="Leave-one-source-out validation: "
                                                "train one model per left-out source (plus one on all) into this "
                                                "directory and write cross_source.json/.md; rerun to resume."),
    name: Optional[str] = typer.Option(None, "--name", help="Reward name (shown in cards and traces)."),
    attribute: Optional[str] = typer.Option(None, "--attribute", help="What ρ measures."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output that is a steerkit reward "
                                   "model (anything else there is always refused) and discard an earlier run's "
                                   "checkpoints."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the final metrics as JSON."),
):
    """Train a cached (unidirectional) reward model from labelled text."""
    from ..training.trainer import train as run_training

    transform = _transform(rescale, binary, invert)
    overrides = _overrides({
        "output_dir": output, "backbone": backbone, "num_layers": layers, "method": method, "loss": loss,
        "max_length": max_length, "steps": steps, "epochs": epochs, "batch_size": batch_size, "lr": lr,
        "seed": seed, "eval_every": eval_every, "checkpoint_every": checkpoint_every, "threads": threads,
        "checkpoint_dir": checkpoint_dir, "name": name, "attribute": attribute, "data_root": data_root,
        "device": device, "leave_out": leave_out or None, "dev_fraction": dev_fraction,
    }, data=[_source(p, text, label, label_value, transform) for p in data],
        eval_files=[_source(p, text, label, label_value, transform) for p in eval_files])
    cfg = _config_from_options(config, overrides, {"r": lora_r, "alpha": lora_alpha})
    if data_root is None and cfg.data_root is None and os.environ.get("STEERKIT_DATA_ROOT"):
        err.print(f"data root from $STEERKIT_DATA_ROOT: {os.environ['STEERKIT_DATA_ROOT']}")
    if assess_model is not None:
        _assess(cfg, assess_model, as_json)
        return
    progress = not quiet and not as_json
    try:
        if cross_source is not None:
            _cross_source(cfg, cross_source, progress=progress, as_json=as_json)
            return
        result = run_training(cfg, resume=resume, overwrite=overwrite, progress=progress)
    except KeyboardInterrupt as exc:
        err.print(f"[yellow]interrupted:[/] {escape(str(exc or 'no checkpoint written'))}", markup=True)
        raise typer.Exit(130) from None
    _print_result(result, as_json)


def _transform(rescale: Optional[str], binary: Optional[float], invert: bool) -> dict:
    """The label transform of the --data / --eval files, from --rescale, --binary and --invert."""
    transform = {}
    if rescale:
        transform["rescale"] = _pair(rescale, "--rescale")
    if binary is not None:
        transform["binary"] = binary
    if invert:
        transform["invert"] = True
    return transform


def _overrides(flags: dict, data: list[dict], eval_files: list[dict]) -> dict:
    """The config fields the options set: the flags given (None: not given) and the --data / --eval sources."""
    overrides = dict(flags)
    if data:
        overrides["data"] = data
    if eval_files:
        overrides["eval"] = eval_files
    return {k: v for k, v in overrides.items() if v is not None}


def _config_from_options(path: Optional[Path], overrides: dict, lora: dict) -> TrainConfig:
    """The config file with the options over it or, without a file, a config of the options alone (which then
    need --data and --output); --lora-r / --lora-alpha last, over the file's LoRA settings."""
    from ..training.config import TrainConfig

    if path is not None:
        cfg = TrainConfig.from_file(path, overrides=overrides)
    else:
        if "data" not in overrides:
            raise ConfigError("Give a config file or at least one --data file (see `steerkit train --help`).")
        if "output_dir" not in overrides:
            raise ConfigError("--output is required without a config file.")
        cfg = TrainConfig.from_dict(overrides, source="command-line options")
    lora = {key: value for key, value in lora.items() if value is not None}
    if lora:
        cfg = cfg.with_overrides({"lora": {**cfg.lora.model_dump(), **lora}})
    return cfg


def _assess(cfg: TrainConfig, model_dir: str, as_json: bool) -> None:
    """--assess: measure an existing reward model on the config's evaluation data; train nothing."""
    from ..training.assess import assess

    metrics = assess(cfg, model_dir)
    if as_json:
        typer.echo(json.dumps(metrics))
        return
    _print_metrics(metrics)


def _cross_source(cfg: TrainConfig, directory: Path, *, progress: bool, as_json: bool) -> None:
    """--cross-source: the leave-one-source-out runs; prints the report (JSON, or its markdown table)."""
    from ..training.cross_source import run_cross_source

    report = run_cross_source(cfg, directory, progress=progress)
    typer.echo(json.dumps(report) if as_json else (directory / "cross_source.md").read_text("utf-8"))


def _print_result(result, as_json: bool) -> None:
    """A finished run: its summary as JSON, or the metrics (stderr) and the output directory (stdout)."""
    if as_json:
        typer.echo(json.dumps({"output_dir": str(result.output_dir), "steps": result.steps,
                               "train_seconds": round(result.seconds, 1),
                               "dev": result.metrics.get("dev"), "eval": result.metrics.get("eval")}))
        return
    _print_metrics(result.metrics)
    err.print(f"Choosing β: `steerkit calibrate {result.output_dir}` measures what each β does with this reward "
              "(docs/training.md, \"Choosing β\").")
    typer.echo(str(result.output_dir))


def _print_metrics(metrics: dict) -> None:
    for section in ("eval", "dev"):
        for set_name, m in (metrics.get(section) or {}).items():
            auroc = "n/a" if m["auroc"] is None else f"{m['auroc']:.3f}"
            err.print(f"{section} {set_name}: n={m['n']} mse={m['mse']:.4f} auroc={auroc} acc={m['accuracy']:.3f} "
                      f"mean ρ={m['mean_reward']:.3f} acc@50%={m.get('accuracy_at_50pct', float('nan')):.3f}")


def average(
    models: List[Path] = typer.Argument(..., help="Two or more reward-model directories of one recipe (e.g. the "
                                        "seeds of one training config)."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the averaged reward model to."),
    name: Optional[str] = typer.Option(None, "--name", help="Reward name of the average. \\[default: the first "
                                       "model's]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a reward model already at --output."),
):
    """Average reward models of one recipe into one: the mean of their LoRA updates (exact, as one adapter of the
    summed rank) and of their heads. Scores like their ensemble to first order, at one model's decode cost."""
    from ..training.average import average_reward_models

    out = average_reward_models(models, output, name=name, overwrite=overwrite)
    err.print(f"Averaged {len(models)} reward models; not evaluated: measure it before use (its README.md).")
    typer.echo(str(out))


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.command()(average)

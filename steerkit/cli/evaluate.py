"""``steerkit eval toxicity|sentiment|report|scorers`` ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from . import scaling as _scaling
from .common import BACKEND_HELP, DTYPE_HELP, ENGINE_HELP, EVAL_COMPILE_HELP, err
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..evaluation.config import EvalConfig

eval_app = typer.Typer(no_args_is_help=True, help="Reproduce the paper's experiments: generate, score, report.")


def parse_prompt_set(spec: str, field: str | None, limit: int | None, offset: int | None) -> dict:
    """``PATH`` or ``NAME=PATH``."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = "", spec
    entry = {"name": name, "path": path}
    for key, value in (("field", field), ("limit", limit), ("offset", offset)):
        if value is not None:
            entry[key] = value
    return entry


def build_config(task: str, config: Path | None, **flags) -> "EvalConfig":
    from ..evaluation.config import EvalConfig

    base = EvalConfig.from_file(config) if config else EvalConfig(task=task)
    if config and base.task != task:
        base = base.with_overrides({"task": task})
    prompts = flags.pop("prompts") or []
    field, limit, offset = flags.pop("field"), flags.pop("limit"), flags.pop("offset")
    overrides = {k: v for k, v in flags.items() if v not in (None, [], ())}
    if prompts:
        overrides["prompts"] = [parse_prompt_set(p, field, limit, offset) for p in prompts]
    elif any(v is not None for v in (field, limit, offset)):
        if not base.prompts:
            raise ConfigError("--field/--limit/--offset apply to prompt files: pass --prompts PATH as well.")
        overrides["prompts"] = [{**p.model_dump(), **{k: v for k, v in
                                 (("field", field), ("limit", limit), ("offset", offset)) if v is not None}}
                                for p in base.prompts]
    return base.with_overrides(overrides)


def _command(task: str):
    def command(
        prompts: List[str] = typer.Option([], "--prompts", "-p", help="JSONL prompt file, PATH or NAME=PATH; repeatable."),
        field: Optional[str] = typer.Option(None, "--field", help="Dotted field holding the prompt text (default prompt.text)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N prompts of each file."),
        offset: Optional[int] = typer.Option(None, "--offset", help="Skip the first N prompts of each file."),
        lm: Optional[str] = typer.Option(None, "--lm", help="LM to steer (packaged name, directory, .gguf, hub id)."),
        reward: Optional[str] = typer.Option(None, "--reward", "-r", help=f"Reward for the grid (default: {task})."),
        direction: Optional[str] = typer.Option(None, "--direction", help="increase or decrease the reward."),
        beta: List[float] = typer.Option([], "--beta", "-b", help="β magnitude of the grid; repeatable (default 10 20 50 100)."),
        k: List[int] = typer.Option([], "--k", "-k", help="Top-k of the grid; repeatable (default 20)."),
        no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the unsteered baseline."),
        n: Optional[int] = typer.Option(None, "-n", "--num-continuations", help="Continuations per prompt (default 25)."),
        max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", "-t", help="Default 20."),
        temperature: Optional[float] = typer.Option(None, "--temperature"),
        seed: Optional[int] = typer.Option(None, "--seed"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Rows per decoding forward (default n)."),
        backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP + " \\[default: auto]"),
        scorer: List[str] = typer.Option([], "--scorer", "-s", help="Scorer spec, repeatable (see `steerkit eval scorers`)."),
        eval_lm: Optional[str] = typer.Option(None, "--eval-lm", help="Fluency LM (default gemma3-270m)."),
        no_fluency: bool = typer.Option(False, "--no-fluency", help="Skip perplexity."),
        fluency_samples: Optional[int] = typer.Option(None, "--fluency-samples", help="Perplexity of the first M continuations per prompt only (cheaper)."),
        no_plots: bool = typer.Option(False, "--no-plots"),
        no_trace: bool = typer.Option(False, "--no-trace", help="Skip the per-step trace generation."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help=f"Run directory (default runs/eval-{task})."),
        config: Optional[Path] = typer.Option(None, "--config", "-c", help="EvalConfig YAML/TOML/JSON file."),
        stage: List[str] = typer.Option([], "--stage", help="Run only these stages: generate score fluency trace report."),
        estimate: bool = typer.Option(False, "--estimate", help="Time one prompt per setting and print the cost of the full run."),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch intra-op threads (1 is fastest on a busy machine)."),
        device: Optional[str] = typer.Option(None, "--device", help="torch device for the models: cpu (default), cuda, cuda:1, mps."),
        compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help=EVAL_COMPILE_HELP),
        engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
        dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
        ray_address: Optional[str] = _scaling.RAY_OPTION,
        actors: Optional[int] = _scaling.ACTORS_OPTION,
        threads_per_actor: int = _scaling.THREADS_OPTION,
        gpus_per_actor: Optional[float] = _scaling.GPUS_OPTION,
    ):
        flags = {"prompts": prompts, "field": field, "limit": limit, "offset": offset, "lm": lm, "reward": reward,
                 "direction": direction, "betas": list(beta), "ks": list(k), "num_continuations": n,
                 "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed, "batch_size": batch_size,
                 "backend": backend, "scorers": list(scorer), "eval_lm": eval_lm, "output": output, "fluency_samples": fluency_samples,
                 "threads": threads, "device": device, "compile": compile, "engine": engine, "dtype": dtype}
        if no_baseline:
            flags["baseline"] = False
        if no_fluency:
            flags["fluency"] = False
        if no_plots:
            flags["plots"] = False
        if no_trace:
            flags["trace"] = False
        cfg = build_config(task, config, **flags)
        if ray_address is not None and estimate:
            raise ConfigError("--estimate times one prompt in this process; drop --ray (or --estimate).")
        with _scaling.executor_for(ray_address, actors=actors, threads=threads_per_actor, gpus=gpus_per_actor,
                                   device=cfg.device, log=err.print) as (executor, _plan):
            _run(cfg, quiet, estimate, stage, executor)

    command.__doc__ = f"Evaluate {task} steering over a grid of β and k (resumable)."
    return command


def _run(cfg: "EvalConfig", quiet: bool, estimate: bool, stage: list[str], executor) -> None:
    """Run (or estimate) one eval run; ``executor`` runs its generation stage (None: in this process)."""
    from ..evaluation.runner import STAGES, EvalRunner

    runner = EvalRunner(cfg, progress=not quiet, log=lambda m: err.print(m), executor=executor)
    if estimate:
        est = runner.estimate()
        typer.echo(json.dumps(est, indent=2))
        err.print(f"estimated {est['total_seconds'] / 3600:.2f} h for {est['prompts']} prompts × "
                  f"{est['settings']} settings × {est['continuations_per_prompt']} continuations")
        return
    pending = len(runner.pending())
    total = len(runner.units())
    if pending < total:
        err.print(f"resuming {cfg.output}: {total - pending} of {total} prompt×setting units already done")
    try:
        result = runner.run(stage or STAGES)
    except KeyboardInterrupt:
        done = total - len(runner.pending())
        err.print(f"interrupted: {done} of {total} prompt×setting units are saved in {cfg.output}; "
                  "rerun the same command to resume.")
        raise typer.Exit(130) from None
    _summary(result)
    err.print(f"results in {cfg.output}/ (report.md, metrics.json, generations.jsonl)")


eval_app.command("toxicity")(_command("toxicity"))
eval_app.command("sentiment")(_command("sentiment"))


@eval_app.command("report")
def report(run_dir: Path = typer.Argument(..., help="A run directory written by steerkit eval."),
           no_plots: bool = typer.Option(False, "--no-plots")):
    """Rebuild metrics.json, report.md and plots from a run directory's files (no generation)."""
    from ..evaluation.config import EvalConfig
    from ..evaluation.runner import EvalRunner

    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no config.json; is it a steerkit eval run directory?")
    cfg = EvalConfig.from_file(path, relative_to_file=False, output=str(run_dir),
                               **({"plots": False} if no_plots else {}))
    runner = EvalRunner(cfg, scorers=[], progress=False, prompts_from_run=True, log=lambda m: err.print(m))
    result = runner.compute_metrics()
    runner.write_report(result)
    _summary(result)


@eval_app.command("scorers")
def scorers(as_json: bool = typer.Option(False, "--json")):
    """List the registered evaluation scorers."""
    from ..evaluation.scorers import ensure_builtin_scorers

    entries = sorted(ensure_builtin_scorers().entries["scorer"].values(), key=lambda r: r.name)
    if as_json:
        typer.echo(json.dumps([{"name": e.name, "plugin": e.plugin, "description": e.description} for e in entries]))
        return
    for e in entries:
        typer.echo(f"{e.name:22} {e.description}  [{e.plugin}]")


def _summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ..evaluation.metrics import table_metrics

    def summarised(measures: str | None = None) -> list:  # the registered metrics' columns with a summary label
        return [c for m in table_metrics(measures) for c in m.columns if c.summary]

    def cell(columns: list, values: dict | None) -> str:
        if values is None or any(values.get(c.key) is None for c in columns):
            return "–"
        return "/".join(f"{values[c.key]:.{c.summary_digits}f}" for c in columns)

    row_columns = summarised()
    scorers = {n: summarised(i.get("measures")) for n, i in result.get("scorers", {}).items()}
    heads = [f"{n} " + "/".join(c.summary for c in columns) for n, columns in scorers.items()]
    table = Table("set", "setting", "n", *(c.summary for c in row_columns), *heads)
    for r in result["results"]:
        cells = [cell(columns, r.get("scorers", {}).get(name)) for name, columns in scorers.items()]
        table.add_row(Text(r["prompt_set"]), Text(r["setting"]), str(r["num_prompts"]),
                      *(cell([c], r) for c in row_columns), *cells)
    Console(stderr=True).print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")

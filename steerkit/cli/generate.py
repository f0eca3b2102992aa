"""``steerkit generate``: steered continuations of prompts given as arguments, a file, or a config; with
``--input FILE --output OUT.jsonl``, a resumable batch job (in this process or over Ray actors with ``--ray``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from .. import threads as _threads
from ..errors import DataError, InvalidArgumentError
from ..models import DEFAULT_LM
from . import scaling as _scaling
from .common import BACKEND_HELP, COMPILE_HELP, DTYPE_HELP, ENGINE_HELP, err, parse_reward_weight

if TYPE_CHECKING:
    from ..config import SteeringConfig

# Defaults shown in --help: SteeringConfig's (tests/unit/test_cli_import_cost.py checks that they agree), written
# out because steerkit.config imports torch and --help must not. The options default to None so that a --config
# file can set them.
_DEFAULTS = {"lm": DEFAULT_LM, "k": 20, "n": 1, "max_new_tokens": 20, "temperature": 1.0}


def generate(
    prompts: List[str] = typer.Argument(None, help="Prompt texts (or use --prompts-file / --config)."),
    lm: Optional[str] = typer.Option(None, "--lm", help="LM reference: packaged name, directory, .gguf, hub id. "
                                     f"\\[default: {_DEFAULTS['lm']}]"),
    reward: List[str] = typer.Option([], "--reward", "-r", help="REF=BETA, repeatable (β<0 steers away). "
                                     "\\[default: none: unsteered]"),
    k: Optional[int] = typer.Option(None, "--k", "-k", help=f"Top-k candidates reweighted per step. \\[default: {_DEFAULTS['k']}]"),
    n: Optional[int] = typer.Option(None, "-n", "--num-return-sequences",
                                    help=f"Continuations per prompt. \\[default: {_DEFAULTS['n']}]"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", "-t",
                                                 help=f"Tokens to generate at most. \\[default: {_DEFAULTS['max_new_tokens']}]"),
    temperature: Optional[float] = typer.Option(None, "--temperature",
                                                help=f"Sampling temperature (> 0). \\[default: {_DEFAULTS['temperature']}]"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for reproducible samples. \\[default: none]"),
    greedy: bool = typer.Option(False, "--greedy", help="Argmax instead of sampling."),
    chat: bool = typer.Option(False, "--chat", help="Wrap prompts in the LM's chat template."),
    stop: List[str] = typer.Option([], "--stop", help="Stop string, repeatable."),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP + " \\[default: auto]"),
    device: Optional[str] = typer.Option(None, "--device", help="torch device: cpu, cuda, cuda:1, mps. \\[default: cpu]"),
    engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help=COMPILE_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="SteeringConfig YAML/TOML/JSON file."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="UTF-8 text file, one prompt per line."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1,
                                             help="Rows decoded together. \\[default: 32; with --input: a prompt's "
                                             "return sequences]"),
    traces: bool = typer.Option(False, "--traces", help="Include per-step traces in --json output."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (see docs/cli.md)."),
    input_path: Optional[Path] = typer.Option(None, "--input", "-i", help="JSONL (or .txt) prompt file: a batch job "
                                              "writing --output, resumable. See docs/scaling.md."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --input: the JSONL file of records, "
                                          "one per prompt × return sequence; rerun to resume."),
    prompt_field: str = typer.Option("prompt.text", "--prompt-field", help="With --input: dotted field holding the "
                                     "prompt text in each JSONL record (as eval's prompt `field`)."),
    ray_address: Optional[str] = _scaling.RAY_OPTION,
    actors: Optional[int] = _scaling.ACTORS_OPTION,
    threads_per_actor: int = _scaling.THREADS_OPTION,
    gpus_per_actor: Optional[float] = _scaling.GPUS_OPTION,
):
    """Generate steered continuations."""
    from ..assembly import assemble_config
    from ..config import SteeringConfig

    cfg = SteeringConfig.from_file(config) if config else SteeringConfig()
    overrides = {"lm": lm, "k": k, "num_return_sequences": n, "max_new_tokens": max_new_tokens,
                 "temperature": temperature, "seed": seed, "backend": backend, "device": device, "engine": engine,
                 "compile": compile, "dtype": dtype}
    cfg = cfg.with_overrides({key: v for key, v in overrides.items() if v is not None})
    if greedy:
        cfg = cfg.with_overrides({"do_sample": False})
    if chat:
        cfg = cfg.with_overrides({"chat_template": True})
    if reward:
        cfg = cfg.with_rewards([parse_reward_weight(s) for s in reward])
    if input_path is not None or output is not None:
        if prompts or prompts_file or as_json or traces:
            raise InvalidArgumentError("--input/--output run a batch job: its prompts come from --input and its "
                                       "records go to --output; drop the prompt arguments, --prompts-file, --json "
                                       "and --traces.")
        if input_path is None or output is None:
            raise InvalidArgumentError("A batch job needs both --input PROMPTS.jsonl and --output OUT.jsonl.")
        run_batch(cfg, input_path, output, prompt_field=prompt_field, stop=stop, batch_size=batch_size,
                  ray_address=ray_address, actors=actors, threads_per_actor=threads_per_actor,
                  gpus_per_actor=gpus_per_actor)
        return
    if ray_address is not None:
        raise InvalidArgumentError("--ray shards a batch job: pass --input PROMPTS.jsonl --output OUT.jsonl.")
    batch_size = batch_size or 32
    texts = list(prompts or [])
    if prompts_file:
        texts += read_prompts_file(prompts_file)
    texts = texts or list(cfg.prompts)
    if not texts:
        raise InvalidArgumentError("No prompts: pass prompt texts as arguments, --prompts-file FILE, or `prompts:` "
                                   "in a --config file.")
    out = assemble_config(cfg).generate(texts, stop_strings=stop or None, return_traces=traces, batch_size=batch_size,
                       progress=not as_json)
    if as_json:
        payload = {"lm": cfg.lm, "engine": cfg.engine, "compile": cfg.compile, "dtype": cfg.dtype, "k": cfg.k,
                   "rewards": [r.model_dump() for r in cfg.rewards],
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
    err.print(f"{sum(out.num_new_tokens)} tokens in {out.seconds:.1f} s ({out.tokens_per_second:.1f} tok/s, "
              f"{_threads.describe()}; --threads to change)")


def run_batch(cfg: SteeringConfig, input_path: Path, output: Path, *, prompt_field: str, stop: list[str],
              batch_size: int | None, ray_address: str | None, actors: int | None, threads_per_actor: int,
              gpus_per_actor: float | None) -> None:
    """``--input``/``--output``: the prompts not yet in the output, in this process or over Ray actors."""
    import time

    from ..distributed.batch import BatchJob, BatchSettings, prompt_set_name

    settings = BatchSettings(cfg, prompt_set_name(input_path), prompt_field, tuple(stop), batch_size)
    with _scaling.executor_for(ray_address, actors=actors, threads=threads_per_actor, gpus=gpus_per_actor,
                               device=cfg.device, log=err.print) as (executor, plan):
        if plan is not None:
            settings = settings.with_device(plan.device)
        elif cfg.device:
            from ..devices import resolve_device

            resolve_device(cfg.device)  # a device this machine lacks fails before the prompts are read
        job = BatchJob(settings, input_path, output)
        todo, total = job.pending(), len(job.prompts)
        if len(todo) < total:
            err.print(f"resuming {output}: {total - len(todo)} of {total} prompts already done")
        start = time.perf_counter()
        try:
            with _progress(len(todo)) as advance:
                done = job.run(executor, advance=advance)
        except KeyboardInterrupt:
            left = len(job.pending())
            err.print(f"interrupted: {total - left} of {total} prompts are saved in {output}; rerun the same "
                      "command to resume.")
            raise typer.Exit(130) from None
    seconds = time.perf_counter() - start
    rate = f" ({done / seconds:.2f} prompts/s)" if done and seconds > 0 else ""
    err.print(f"{done} prompts generated in {seconds:.1f} s{rate}; {total} of {total} are in {output}")


def _progress(total: int):
    from contextlib import contextmanager

    @contextmanager
    def bar():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]Generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as progress:
            task = progress.add_task("prompts", total=total)
            yield lambda n=1: progress.advance(task, n)

    return bar()


def read_prompts_file(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file, with a DataError naming the file when it cannot be used."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"--prompts-file {path} does not exist.") from None
    except IsADirectoryError:
        raise DataError(f"--prompts-file {path} is a directory; pass a text file with one prompt per line.") from None
    except OSError as exc:
        raise DataError(f"--prompts-file {path} could not be read: {exc.strerror or exc}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"--prompts-file {path} is not UTF-8 text (line {line}, byte {exc.start}); "
                        "convert it, e.g. `iconv -f latin1 -t utf-8`.") from None
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


def register(app: typer.Typer) -> None:
    app.command()(generate)

"""The ``steerkit`` command line (typer).

Each command lives next to the concept it drives; this module only wires them together:
``generate`` and ``score`` here, ``train`` in :mod:`steerkit.training.cli`, ``export`` in
:mod:`steerkit.export_cli`, ``plugins`` in :mod:`steerkit.registry_cli`, ``eval`` in
:mod:`steerkit.evaluation.cli`. Every :class:`~steerkit.errors.SteerkitError` becomes a one-line
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import errno
import importlib
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from . import threads as _threads
from .config import SteeringConfig
from .errors import DataError, InvalidArgumentError, NonFiniteRewardError, SteerkitError, SteerkitWarning

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Controlled text generation with Reward-Augmented Decoding.")
err = Console(stderr=True)

# Defaults shown in --help (SteeringConfig's); the options default to None so that a --config file can set them.
_DEFAULTS = {name: field.default for name, field in SteeringConfig.model_fields.items()}
_DEFAULTS["n"] = _DEFAULTS["num_return_sequences"]


@app.callback()
def _root(threads: Optional[int] = typer.Option(None, "--threads", help=_threads.HELP, show_default=False)):
    """Controlled text generation with Reward-Augmented Decoding."""
    _threads.set_threads(threads)


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
    backend: Optional[str] = typer.Option(None, "--backend", help="Reward backend: torch or onnx. \\[default: torch]"),
    device: Optional[str] = typer.Option(None, "--device", help="torch device: cpu, cuda, cuda:1, mps. \\[default: cpu]"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="SteeringConfig YAML/TOML/JSON file."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="UTF-8 text file, one prompt per line."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Rows decoded together (progress per batch)."),
    traces: bool = typer.Option(False, "--traces", help="Include per-step traces in --json output."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (see docs/cli.md)."),
):
    """Generate steered continuations."""
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
        texts += read_prompts_file(prompts_file)
    texts = texts or list(cfg.prompts)
    if not texts:
        raise InvalidArgumentError("No prompts: pass prompt texts as arguments, --prompts-file FILE, or `prompts:` "
                                   "in a --config file.")
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
    err.print(f"{sum(out.num_new_tokens)} tokens in {out.seconds:.1f} s ({out.tokens_per_second:.1f} tok/s, "
              f"{_threads.describe()}; --threads to change)")


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


@app.command()
def score(
    texts: List[str] = typer.Argument(..., help="Texts to score."),
    reward: str = typer.Option(..., "--reward", "-r", help="Reward reference: registered name or directory."),
    prefixes: bool = typer.Option(False, "--prefixes", help="Also print the reward of every prefix."),
    backend: str = typer.Option("torch", "--backend", help="Reward backend: torch or onnx."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Print each text's reward ρ in [0, 1] (scored from scratch)."""
    from .rewards.loading import load_reward

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


def main(argv: list[str] | None = None) -> None:
    """The console script: user mistakes print one ``error:`` line on stderr and exit 2, never a traceback.

    Exit codes: 0 success, 1 an internal error (a steerkit bug: set STEERKIT_DEBUG=1 for the traceback),
    2 a usage or input error, 130 interrupted.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    warnings.formatwarning = _format_warning
    try:
        _check_utf8(args)
        command = typer.main.get_command(app)
        _hide_flag_metavars(command)
        code = command.main(args=args, prog_name="steerkit", standalone_mode=False)
    except SteerkitError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", code=130)
    except Exception as exc:  # noqa: BLE001
        if type(exc).__module__.split(".")[0] in {"click", "typer"}:
            _cli_exception(exc)
        if isinstance(exc, OSError):
            if exc.errno == errno.EPIPE:  # `steerkit ... | head`
                raise SystemExit(0) from None
            if os.environ.get("STEERKIT_DEBUG") != "1":
                target = f": {exc.filename}" if exc.filename else ""
                _fail(f"{exc.strerror or exc}{target}")
        if os.environ.get("STEERKIT_DEBUG") == "1":
            raise
        # a bug, not a user mistake: say so in one line
        _fail(f"internal error ({type(exc).__name__}: {_one_line(str(exc))}). This is a steerkit bug; "
              "STEERKIT_DEBUG=1 shows the traceback for a report.", code=1)
    raise SystemExit(code if isinstance(code, int) else 0)


def _cli_exception(exc: Exception):
    """typer/click usage errors (bad option values, unknown options, missing arguments) as one line, exit 2.

    typer >= 0.22 vendors click, so its exceptions are matched by name, not by class.
    """
    name = type(exc).__name__
    ctx = getattr(exc, "ctx", None)
    if name == "NoArgsIsHelpError":  # `steerkit`, `steerkit export`: typer printed the help; exit 2 as click does
        raise SystemExit(2) from None
    if name == "Abort":
        _fail("interrupted", code=130)
    if name == "Exit":
        raise SystemExit(getattr(exc, "exit_code", 0)) from None
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    _fail(message + where, code=getattr(exc, "exit_code", 2) or 2)


_default_formatwarning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """steerkit's own warnings as one ``warning:`` line; anything else in Python's usual format."""
    if issubclass(category, SteerkitWarning):
        return f"warning: {_one_line(str(message))}\n"
    return _default_formatwarning(message, category, filename, lineno, line)


def _one_line(text: str, limit: int = 2000) -> str:
    text = " | ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[:limit] + "…"


def _fail(message: str, code: int = 2):
    sys.stderr.write(f"error: {_one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(code) from None


def _check_utf8(args: list[str]) -> None:
    """Arguments that are not UTF-8 reach Python as lone surrogates; refuse them before they reach a tokenizer."""
    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"command-line argument {i + 1} is not valid UTF-8 (position {exc.start}: {arg[:40]!r}); "
                "pass UTF-8 text (check the terminal's locale or the file the argument came from).") from None


def _hide_flag_metavars(command: click.Command) -> None:
    """Show boolean flags as ``--greedy``, not ``--greedy <bool>``, in every command's --help."""
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _hide_flag_metavars(sub)


if __name__ == "__main__":  # `python -m steerkit.cli`: run the imported module's app, where commands registered
    from steerkit.cli import main as _main

    _main()

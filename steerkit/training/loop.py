"""The one training loop of ``steerkit train``, shared by label training and distillation.

:class:`TrainingLoop` owns everything a run does around the loss: the "nothing to train" check, the optimizer,
the learning-rate schedule, checkpoints (atomic, every ``checkpoint_every`` steps, on Ctrl-C and before raising
on a non-finite loss), ``--resume`` (which refuses a checkpoint of another configuration, other data or other
trainable parameters, see :class:`~.run_state.Checkpointer`), the progress bar and dev monitoring every
``eval_every`` steps. What differs between objectives is a :class:`LossStrategy`:

* label training (:class:`steerkit.training.trainer.LabelLoss`): length-grouped batches of the training rows,
  the paper's cumulative loss against their labels, the dev rows monitored;
* distillation (:class:`steerkit.training.distill.DistillationLoss`): batches of sampled steps, the MSE to the
  teacher's rewards of their candidates (plus the label loss), the dev rows and the teacher agreement monitored.

A strategy's batches are a pure function of the seed and the step, so a resumed run sees the batches an
uninterrupted run would (the optimizer state and torch's RNG come back from the checkpoint).
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from ..errors import ConfigError
from .checkpoint import remove_checkpoints
from .data import collate, tokenize
from .metrics import predict, summarise
from .output import prepare_run_dirs
from .run_state import Checkpointer, RunState, state_flag
from .runtime import StopRequest, log
from .update import apply_update


@dataclass
class Callbacks:
    """Hooks for tests and tools: ``on_step(step, loss)`` after each optimizer step,
    ``on_checkpoint(step, path)`` after a checkpoint is complete."""

    on_step: Callable[[int, float], None] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None


#: What a strategy's monitor reports: the figures added to the history entry of the step, and a log line.
Monitored = tuple[dict, str]


class LossStrategy(Protocol):
    """What one training objective supplies to :class:`TrainingLoop`."""

    per_epoch: int  # optimizer steps in one pass over the training data (``epochs`` x this: the steps)

    def batch(self, step: int) -> Any:
        """The batch of step ``step`` (0-based): a pure function of the seed and the step."""

    def loss(self, model, batch) -> torch.Tensor:
        """The scalar loss of ``batch`` (on the model's device, with its graph)."""

    def size(self, batch) -> int:
        """The examples in ``batch`` (for the examples-per-second figure)."""

    def monitor(self, model) -> Monitored | None:
        """The figures measured every ``eval_every`` steps; None when there is nothing to measure."""

    def describe(self, total: int, trainable: int) -> str:
        """The line logged before the first step."""


def trainable_parameters(model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def learning_rate(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up then linear decay to zero; ``step`` is 0-based."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    return base * max(0.0, (total - step) / max(1, total - warmup))


@dataclass
class RunDirs:
    checkpoints: Path
    created: bool  # whether this run owns the checkpoint directory (removes it once empty)


def prepare_dirs(config, *, resume: bool, overwrite: bool) -> RunDirs:
    """Check the output and checkpoint directories before anything slow (:func:`~.output.prepare_run_dirs`);
    a run that discards an earlier run's checkpoints inherits its ownership of the directory."""
    ckpt_dir = config.checkpoint_path
    created = prepare_run_dirs(
        Path(config.output_dir), ckpt_dir, resume=resume, overwrite=overwrite,
        inherited_owner=lambda: state_flag(ckpt_dir, "created_checkpoint_dir", default=config.checkpoint_dir is None))
    return RunDirs(ckpt_dir, created)


@dataclass
class Tokenized:
    """A dataset's texts as token ids: the training and dev rows, and each held-out set's rows."""

    train: list[list[int]]
    dev: list[list[int]]
    eval_sets: list[list[list[int]]]


def tokenize_examples(tokenizer, examples, max_length: int) -> list[list[int]]:
    """The examples' texts as token rows of at most ``max_length`` (what training and its metrics read)."""
    # a token spans at least one character: cutting far beyond max_length tokens changes nothing kept
    return tokenize(tokenizer, [e.text[: 32 * max_length] for e in examples], max_length)


def tokenize_dataset(model, dataset, config) -> Tokenized:
    """Every text of ``dataset`` tokenized with ``model``'s tokenizer (a held-out set at its own max_length)."""
    tok = model.tokenizer
    return Tokenized(
        tokenize_examples(tok, dataset.train, config.max_length),
        tokenize_examples(tok, dataset.dev, config.max_length),
        [tokenize_examples(tok, ex, src.max_length or config.max_length) for src, ex, _ in dataset.eval_sets])


def label_loss(model, rows: list[list[int]], labels: list[float], loss_fn, device) -> torch.Tensor:
    """``loss_fn`` (:data:`~.loss.LOSSES`) of the model's rewards of token ``rows`` against their ``labels``."""
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batch = {k: v.to(device) for k, v in collate(rows, model.config.start_token_id, pad).items()}
    targets = torch.tensor(labels, dtype=torch.float32, device=device)
    rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"]).rewards
    return loss_fn(rewards, targets, batch["attention_mask"])


class DevMonitor:
    """A seeded sample of at most ``eval_limit`` dev rows, scored against their labels."""

    def __init__(self, dataset, dev_rows: list[list[int]], config):
        rng = random.Random(f"{config.seed}:dev-monitor")
        self.index = sorted(rng.sample(range(len(dev_rows)), min(config.eval_limit, len(dev_rows))))
        self.rows = [dev_rows[i] for i in self.index]
        self.labels = [dataset.dev[i].label for i in self.index]
        self.batch_size = config.eval_batch_size

    def __call__(self, model) -> Monitored | None:
        if not self.index:
            return None
        final, prefix = predict(model, self.rows, batch_size=self.batch_size)
        m = summarise(final, self.labels, prefix)
        return ({"dev": {k: m[k] for k in ("mse", "auroc", "accuracy")}},
                f"dev mse {m['mse']:.4f}  auroc {_fmt(m['auroc'])}  acc {m['accuracy']:.3f}  "
                f"acc@50% {m['accuracy_at_50pct']:.3f}  (n={m['n']})")


@dataclass
class LoopResult:
    state: RunState  # where the run ended (step == total), with its history
    total: int
    trainable: int  # trained parameter values
    examples_seen: int  # in this process
    seconds: float  # this process's seconds in the loop


class TrainingLoop:
    """One run's optimizer, checkpoints and steps; see the module docstring.

    Built before anything slow that follows the model (a distillation's sampling), so that a model with
    nothing to train is refused at once."""

    def __init__(self, config, model, dirs: RunDirs, data_hashes: dict[str, str], *,
                 callbacks: Callbacks | None = None, progress: bool = True,
                 schedule: Callable[[int, int, float, int], float] = learning_rate):
        self.config, self.model, self.dirs, self.data_hashes = config, model, dirs, data_hashes
        self.callbacks, self.progress, self.schedule = callbacks or Callbacks(), progress, schedule
        self.params = trainable_parameters(model)
        if not self.params:
            raise ConfigError("Nothing to train: every parameter is frozen.")
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=config.learning_rate,
                                           weight_decay=config.weight_decay, foreach=False)
        self.checkpoints: Checkpointer | None = None

    @property
    def trainable(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def run(self, strategy: LossStrategy, *, resume: bool = False) -> LoopResult:
        """Train from the start, or from the newest checkpoint with ``resume``, to the configured steps."""
        config = self.config
        total = config.steps or max(1, math.ceil(config.epochs * strategy.per_epoch))
        self.checkpoints = Checkpointer(self.dirs.checkpoints, self.params, self.optimizer, config.run_fingerprint(),
                                        self.data_hashes, total, config.keep_checkpoints, self.dirs.created,
                                        self.callbacks.on_checkpoint)
        state = RunState()
        if resume:
            state = self.checkpoints.restore(default_created=config.checkpoint_dir is None)
            log(f"resuming from {self.dirs.checkpoints / state.resumed_from} (step {state.step}/{total})")
        bar = _progress_bar(config, total, state.step) if self.progress else None
        log(strategy.describe(total, self.trainable), bar)
        start = time.perf_counter()
        try:
            seen = self._steps(strategy, state, total, bar)
        finally:
            if bar is not None:
                bar.close()
        return LoopResult(state, total, self.trainable, seen, time.perf_counter() - start)

    def _steps(self, strategy: LossStrategy, state: RunState, total: int, bar) -> int:
        """The optimizer steps from ``state.step`` to ``total``, with monitoring, periodic checkpoints, and a
        checkpoint before stopping on Ctrl-C or a non-finite loss. Returns the examples seen."""
        config, model, checkpoints, callbacks = self.config, self.model, self.checkpoints, self.callbacks
        params = list(self.params.values())
        warmup = int(round(config.warmup_fraction * total))
        model.train()
        loop_start = time.perf_counter()
        seconds = lambda: state.elapsed_before + time.perf_counter() - loop_start  # noqa: E731
        examples_seen = 0
        with StopRequest() as stop:
            while state.step < total:
                batch = strategy.batch(state.step)
                loss = strategy.loss(model, batch)
                if not torch.isfinite(loss):
                    path = checkpoints.save(state, seconds()) if state.step else None
                    raise ConfigError(f"Loss became {loss.item()} at step {state.step + 1}; lower the learning rate. "
                                      + (f"Last good state saved in {path}." if path else ""))
                apply_update(loss, self.optimizer, params, config.grad_clip,
                             self.schedule(state.step, total, config.learning_rate, warmup))
                state.step += 1
                examples_seen += strategy.size(batch)
                value = float(loss.detach())
                state.record_loss(value, total)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{state.running:.4f}", lr=f"{self.optimizer.param_groups[0]['lr']:.1e}")
                if callbacks.on_step:
                    callbacks.on_step(state.step, value)
                if state.step % config.eval_every == 0 and state.step < total:
                    _monitor(strategy, model, state, bar)
                if state.step % config.checkpoint_every == 0 and state.step < total:
                    checkpoints.save(state, seconds())
                if stop.requested:
                    path = checkpoints.save(state, seconds())
                    raise KeyboardInterrupt(f"stopped at step {state.step}; checkpoint in {path}; "
                                            "continue with --resume")
        return examples_seen

    def finish(self, extra_files: tuple[str, ...] = ()) -> None:
        """After a successful run: remove its checkpoints (and ``extra_files`` of the checkpoint directory)
        unless ``keep_checkpoint_dir``; the directory itself goes only if the run owns it and it is then empty."""
        if self.config.keep_checkpoint_dir:
            return
        for name in extra_files:
            (self.dirs.checkpoints / name).unlink(missing_ok=True)
        remove_checkpoints(self.dirs.checkpoints, remove_dir=self.checkpoints.created_dir)


def _monitor(strategy: LossStrategy, model, state: RunState, bar) -> None:
    """Measure what the strategy monitors, add it to the history and log it."""
    measured = strategy.monitor(model)
    if measured is None:
        return
    figures, line = measured
    state.history.append({"step": state.step, **figures})
    log(f"step {state.step}: {line}", bar)


def _progress_bar(config, total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"train {config.name}", unit="step", dynamic_ncols=True,
                file=sys.stderr, mininterval=0.2 if sys.stderr.isatty() else 10.0)  # logs stay small


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"

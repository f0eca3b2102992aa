"""The training loop behind ``steerkit train``.

Order of work, chosen so that nothing already trained is ever lost:

1. read and validate every data file (a bad row raises DataError before any output is touched);
2. build the reward model (methods ``lora`` via peft, ``head`` with a frozen backbone, ``full``);
3. train with the paper's cumulative loss, periodic dev evaluation and atomic checkpoints; Ctrl-C
   writes a checkpoint and stops; ``resume=True`` continues from the newest checkpoint and, with the
   same seed, reaches the same weights as an uninterrupted run (data order and learning rate are pure
   functions of the step, and the optimizer state and RNG are restored exactly);
4. evaluate on the dev split (per source) and the held-out sets, then write the reward-model directory
   (weights, metrics.json, README.md model card) into a temporary directory and swap it into place.

What is never deleted: an existing ``output_dir`` is refused unless it is safe to replace
(:mod:`steerkit.training.output`). In ``checkpoint_dir`` only what checkpointing writes is removed (``step-*``,
``latest``, the temporaries of interrupted writes), and the directory itself only if this run created it and it
is then empty.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..devices import resolve_device
from ..threads import set_threads
from ..errors import ConfigError, RewardModelFormatError
from ..rewards.model import RewardModel, lora_config, resolve_lora
from .checkpoint import remove_checkpoints
from .augment import augment
from .config import TrainConfig
from .data import Dataset, collate, epoch_indices, length_grouped_batches, tokenize
from .loss import LOSSES
from .output import prepare_run_dirs, write_output
from .metrics import final_metrics, predict, summarise
from .run_state import Checkpointer, RunState, state_flag
from .runtime import StopRequest, hardware, log
from .update import apply_update


@dataclass
class TrainResult:
    output_dir: Path
    metrics: dict
    steps: int
    seconds: float


@dataclass
class Callbacks:
    """Hooks for tests and tools: ``on_step(step, loss)`` after each optimizer step,
    ``on_checkpoint(step, path)`` after a checkpoint is complete."""

    on_step: Callable[[int, float], None] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None


def build_model(config: TrainConfig) -> RewardModel:
    """A fresh reward model set up for ``config.method`` (seeded, so two builds are identical)."""
    torch.manual_seed(config.seed)
    if config.kind == "token":  # a token-level head (rewards/token_model.py); LoRA, freezing and loop as below
        from ..rewards.token_model import TokenRewardModel

        model = TokenRewardModel.from_backbone(config.backbone, config.num_layers, name=config.name,
                                               attribute=config.attribute, max_length=config.max_length,
                                               head=config.token_head)
    else:
        model = RewardModel.from_backbone(config.backbone, config.num_layers, name=config.name,
                                          attribute=config.attribute, max_length=config.max_length)
    lora = None
    if config.method == "lora":  # default targets resolved from the backbone's family and saved explicitly
        try:
            lora = resolve_lora(config.lora, model.backbone)
        except RewardModelFormatError as exc:
            raise ConfigError(str(exc)) from None
    model.config = model.config.model_copy(update={
        "method": config.method, "lora": lora, "tokenizer": config.backbone})  # stated explicitly in the saved config
    if config.method in {"head", "lora"}:
        model.backbone.requires_grad_(False)
    else:  # "full" fine-tunes the kept transformer layers; the token embeddings (shared with the LM) stay frozen
        model.backbone.get_input_embeddings().requires_grad_(False)
    if config.method == "lora":
        try:
            from peft import get_peft_model
        except ImportError:
            raise ConfigError("method 'lora' needs peft: pip install 'steerkit-rad[train]' (or pick method 'head').") from None
        try:
            with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x (harmless)
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model.backbone = get_peft_model(model.backbone, lora_config(lora, model.backbone))
        except ValueError as exc:
            raise ConfigError(f"lora.target_modules {lora.target_modules} do not fit backbone "
                              f"{config.backbone!r}: {exc}") from None
    model.head.requires_grad_(True)
    return model


def trainable_parameters(model: RewardModel) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def learning_rate(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up then linear decay to zero; ``step`` is 0-based."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    return base * max(0.0, (total - step) / max(1, total - warmup))


@dataclass
class _Tokenized:
    train: list[list[int]]
    dev: list[list[int]]
    eval_sets: list[list[list[int]]]


def tokenize_dataset(model: RewardModel, dataset: Dataset, config: TrainConfig) -> _Tokenized:
    tok = model.tokenizer

    def run(examples, max_length):
        # a token spans at least one character: cutting far beyond max_length tokens changes nothing kept
        return tokenize(tok, [e.text[: 32 * max_length] for e in examples], max_length)

    return _Tokenized(
        run(dataset.train, config.max_length), run(dataset.dev, config.max_length),
        [run(ex, src.max_length or config.max_length) for src, ex, _ in dataset.eval_sets])


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
          callbacks: Callbacks | None = None) -> TrainResult:
    """Train a reward model as configured and write its directory to ``config.output_dir``.

    ``overwrite`` (or ``config.overwrite``) allows replacing an existing reward-model directory at
    ``output_dir`` and discarding an earlier run's checkpoints; see the module docstring for what is never
    deleted."""
    callbacks = callbacks or Callbacks()
    if config.distill is not None:  # token-level distillation from a sequence reward model (training/distill.py)
        from .distill import train_distilled

        return TrainResult(*train_distilled(config, resume=resume, overwrite=overwrite, progress=progress,
                                            callbacks=callbacks, build=build_model, schedule=learning_rate))
    overwrite = overwrite or config.overwrite
    set_threads(config.threads)  # None: steerkit's default (see steerkit.threads)
    device = resolve_device(config.device)  # a wrong --device fails before any data is read
    started = time.perf_counter()
    dataset, augmented = read_training_data(config)
    ckpt_dir = config.checkpoint_path
    created_ckpt_dir = prepare_run_dirs(
        Path(config.output_dir), ckpt_dir, resume=resume, overwrite=overwrite,
        inherited_owner=lambda: state_flag(ckpt_dir, "created_checkpoint_dir", default=config.checkpoint_dir is None))

    model = build_model(config).to(device)
    tokens = tokenize_dataset(model, dataset, config)
    params = trainable_parameters(model)
    if not params:
        raise ConfigError("Nothing to train: every parameter is frozen.")
    optimizer = torch.optim.AdamW(list(params.values()), lr=config.learning_rate,
                                  weight_decay=config.weight_decay, foreach=False)
    plan = _BatchPlan(dataset, tokens, config)
    total = config.steps or max(1, math.ceil(config.epochs * plan.per_epoch))
    checkpoints = Checkpointer(ckpt_dir, params, optimizer, config.run_fingerprint(), dataset.file_hashes, total,
                               config.keep_checkpoints, created_ckpt_dir, callbacks.on_checkpoint)
    state = RunState()
    if resume:
        state = checkpoints.restore(default_created=config.checkpoint_dir is None)
        log(f"resuming from {ckpt_dir / state.resumed_from} (step {state.step}/{total})")

    bar = _progress_bar(config, total, state.step) if progress else None
    log(f"{len(dataset.train)} train / {len(dataset.dev)} dev examples from {len(config.data)} source(s), "
        f"{plan.per_epoch} steps per epoch, {total} steps, method {config.method}, "
        f"{model.config.num_layers} layers, {sum(p.numel() for p in params.values()):,} trainable parameters", bar)
    loop_start = time.perf_counter()
    examples_seen = _train_steps(model, dataset, tokens, plan, config, state, total, optimizer, checkpoints,
                                 callbacks, bar, device)
    loop_seconds = time.perf_counter() - loop_start
    train_seconds = state.elapsed_before + loop_seconds

    eval_start = time.perf_counter()
    metrics = final_metrics(model, dataset, tokens.dev, tokens.eval_sets, config)
    model.to("cpu")  # saved from the CPU whatever it trained on
    eval_seconds = time.perf_counter() - eval_start
    metrics["training"] = {
        "steps": total, "batch_size": config.batch_size, "examples_seen_this_process": examples_seen,
        "train_seconds": round(train_seconds, 1), "eval_seconds": round(eval_seconds, 1),
        "examples_per_second": round(examples_seen / max(loop_seconds, 1e-9), 2) if examples_seen else None,
        "wall_seconds_this_process": round(time.perf_counter() - started, 1),
        "resumed_from": state.resumed_from, "hardware": hardware(device), "method": config.method,
        "num_layers": model.config.num_layers, "trainable_parameters": sum(p.numel() for p in params.values()),
        "loss": config.loss, "max_length": config.max_length, "lr": config.learning_rate, "seed": config.seed,
    }
    metrics.update(_data_metrics(dataset, config, augmented, state.history))
    output = write_output(model, config, metrics, overwrite=overwrite)
    if not config.keep_checkpoint_dir:
        remove_checkpoints(ckpt_dir, remove_dir=checkpoints.created_dir)
    log(f"wrote {output} ({train_seconds:.0f} s training, {eval_seconds:.0f} s evaluation)")
    return TrainResult(output, metrics, total, train_seconds)


def read_training_data(config: TrainConfig) -> tuple[Dataset, tuple[list, list[str]]]:
    """The configured data, its training split augmented (dev and test rows never are); ``(added rows,
    obfuscation lexicon)`` for metrics.json. Warns when nothing will measure the trained model."""
    dataset = config.read_dataset()
    sources = dataset.sources
    added, copies, lexicon = augment(dataset.train, [(s.display_name, s.metrics_name) for s in sources],
                                     config.augment, config.seed, [s.path for s in sources])
    dataset.train.extend(added)
    for index, count in copies.items():
        dataset.stats[index].augmented = count
    if not dataset.dev and not dataset.eval_sets:
        # Only reachable with dev_fraction 0 (build_dataset raises when a dev split is asked for and impossible).
        # A warning, not an error: training on every row and evaluating elsewhere (`steerkit eval`) is legitimate,
        # but the user should know that metrics.json and the card will hold no measurement of the model.
        message = ("dev_fraction is 0 and no eval set is given: nothing measures the trained model, so metrics.json "
                   "and the model card will have no dev or test metrics. Set dev_fraction > 0 or add --eval FILE.")
        warnings.warn(message, UserWarning, stacklevel=3)
    return dataset, (added, lexicon)


class _BatchPlan:
    """Which training rows make up step ``s``: a pure function of the seed and the step (so a resumed run sees
    the same batches), length-grouped within each weighted epoch; one epoch's plan is kept at a time."""

    def __init__(self, dataset: Dataset, tokens: _Tokenized, config: TrainConfig):
        self.dataset, self.config = dataset, config
        self.weights = [s.weight for s in dataset.sources]
        self.lengths = [len(r) for r in tokens.train]
        self.per_epoch = len(self._epoch(0))
        self._cached = (-1, [])

    def _epoch(self, epoch: int) -> list[list[int]]:
        order = epoch_indices(self.dataset.train, self.weights, self.config.seed, epoch)
        return length_grouped_batches(order, self.lengths, self.config.batch_size, self.config.seed, epoch)

    def batch(self, step: int) -> list[int]:
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._cached[0]:
            self._cached = (epoch, self._epoch(epoch))
        return self._cached[1][index]


def _progress_bar(config: TrainConfig, total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"train {config.name}", unit="step", dynamic_ncols=True,
                file=sys.stderr, mininterval=0.2 if sys.stderr.isatty() else 10.0)  # logs stay small


def _train_steps(model, dataset, tokens, plan, config, state: RunState, total, optimizer, checkpoints, callbacks,
                 bar, device) -> int:
    """The optimizer steps from ``state.step`` to ``total``, with dev monitoring, periodic checkpoints, and a
    checkpoint before stopping on Ctrl-C or a non-finite loss. Returns the examples seen."""
    params = list(checkpoints.params.values())
    loss_fn = LOSSES[config.loss]
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    warmup = int(round(config.warmup_fraction * total))
    dev_rng = random.Random(f"{config.seed}:dev-monitor")
    monitor = sorted(dev_rng.sample(range(len(tokens.dev)), min(config.eval_limit, len(tokens.dev))))
    model.train()
    loop_start = time.perf_counter()
    seconds = lambda: state.elapsed_before + time.perf_counter() - loop_start  # noqa: E731
    examples_seen = 0
    with StopRequest() as stop:
        while state.step < total:
            batch_idx = plan.batch(state.step)
            batch = {k: v.to(device) for k, v in collate([tokens.train[i] for i in batch_idx],
                                                         model.config.start_token_id, pad).items()}
            targets = torch.tensor([dataset.train[i].label for i in batch_idx], dtype=torch.float32, device=device)
            rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"]).rewards
            loss = loss_fn(rewards, targets, batch["attention_mask"])
            if not torch.isfinite(loss):
                path = checkpoints.save(state, seconds()) if state.step else None
                raise ConfigError(f"Loss became {loss.item()} at step {state.step + 1}; lower the learning rate. "
                                  + (f"Last good state saved in {path}." if path else ""))
            apply_update(loss, optimizer, params, config.grad_clip,
                         learning_rate(state.step, total, config.learning_rate, warmup))
            state.step += 1
            examples_seen += len(batch_idx)
            value = float(loss.detach())
            state.record_loss(value, total)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{state.running:.4f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
            if callbacks.on_step:
                callbacks.on_step(state.step, value)
            if state.step % config.eval_every == 0 and state.step < total and monitor:
                _monitor_dev(model, dataset, tokens, monitor, config, state, bar)
            if state.step % config.checkpoint_every == 0 and state.step < total:
                checkpoints.save(state, seconds())
            if stop.requested:
                path = checkpoints.save(state, seconds())
                if bar is not None:
                    bar.close()
                raise KeyboardInterrupt(f"stopped at step {state.step}; checkpoint in {path}; continue with --resume")
    if bar is not None:
        bar.close()
    return examples_seen


def _monitor_dev(model, dataset, tokens, monitor: list[int], config, state: RunState, bar) -> None:
    """Score the monitored dev rows, add the figures to the history and log them."""
    final, prefix = predict(model, [tokens.dev[i] for i in monitor], batch_size=config.eval_batch_size)
    m = summarise(final, [dataset.dev[i].label for i in monitor], prefix)
    state.history.append({"step": state.step, "dev": {k: m[k] for k in ("mse", "auroc", "accuracy")}})
    log(f"step {state.step}: dev mse {m['mse']:.4f}  auroc {_fmt(m['auroc'])}  acc {m['accuracy']:.3f}  "
        f"acc@50% {m['accuracy_at_50pct']:.3f}  (n={m['n']})", bar)


def _data_metrics(dataset: Dataset, config: TrainConfig, augmented, history: list[dict]) -> dict:
    """metrics.json's account of the data: per source, the held-out sets, augmentation, and the loss history."""
    added, lexicon = augmented
    return {
        "data": [vars(s) for s in dataset.stats],
        "eval_data": [vars(s) for _, _, s in dataset.eval_sets],
        "removed_eval_overlap": dataset.removed_overlap,
        "augmentation": {"views": [v.model_dump() for v in config.augment.views], "copies": len(added),
                         "obfuscation_lexicon_size": len(lexicon), "obfuscation_lexicon_sample": lexicon[:40]},
        "left_out": list(config.leave_out),
        "history": history,
    }


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"

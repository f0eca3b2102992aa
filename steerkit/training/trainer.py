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

import contextlib
import json
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
from ..errors import CheckpointError, ConfigError, RewardModelFormatError
from ..rewards.model import RewardModel, lora_config, resolve_lora
from .checkpoint import (LATEST_NAME, STATE_NAME, clean_interrupted_writes, load_checkpoint, optimizer_from_tensors,
                         remove_checkpoints, save_checkpoint)
from .augment import augment
from .config import TrainConfig
from .data import Dataset, collate, epoch_indices, length_grouped_batches, tokenize
from .loss import LOSSES
from .output import prepare_run_dirs, write_output
from .metrics import final_metrics, predict, summarise
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
    dataset = config.read_dataset()
    sources = dataset.sources
    added, copies, lexicon = augment(dataset.train, [(s.display_name, s.metrics_name) for s in sources],
                                     config.augment, config.seed, [s.path for s in sources])
    dataset.train.extend(added)  # training split only: dev and test rows are never augmented
    for index, count in copies.items():
        dataset.stats[index].augmented = count
    data_hashes = dataset.file_hashes
    if not dataset.dev and not dataset.eval_sets:
        # Only reachable with dev_fraction 0 (build_dataset raises when a dev split is asked for and impossible).
        # A warning, not an error: training on every row and evaluating elsewhere (`steerkit eval`) is legitimate,
        # but the user should know that metrics.json and the card will hold no measurement of the model.
        message = ("dev_fraction is 0 and no eval set is given: nothing measures the trained model, so metrics.json "
                   "and the model card will have no dev or test metrics. Set dev_fraction > 0 or add --eval FILE.")
        warnings.warn(message, UserWarning, stacklevel=2)
    output = Path(config.output_dir)
    ckpt_dir = config.checkpoint_path
    # whether this run owns the checkpoint directory (then removes it once empty); a resumed run inherits it
    created_ckpt_dir = prepare_run_dirs(
        output, ckpt_dir, resume=resume, overwrite=overwrite,
        inherited_owner=lambda: _state_flag(ckpt_dir, "created_checkpoint_dir", default=config.checkpoint_dir is None))

    model = build_model(config).to(device)
    tokens = tokenize_dataset(model, dataset, config)
    params = trainable_parameters(model)
    if not params:
        raise ConfigError("Nothing to train: every parameter is frozen.")
    optimizer = torch.optim.AdamW(list(params.values()), lr=config.learning_rate,
                                  weight_decay=config.weight_decay, foreach=False)
    loss_fn = LOSSES[config.loss]
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    start_id = model.config.start_token_id

    weights = [s.weight for s in sources]
    lengths = [len(r) for r in tokens.train]
    batches_per_epoch = len(length_grouped_batches(epoch_indices(dataset.train, weights, config.seed, 0), lengths,
                                                   config.batch_size, config.seed, 0))
    total = config.steps or max(1, math.ceil(config.epochs * batches_per_epoch))
    warmup = int(round(config.warmup_fraction * total))
    fingerprint = config.run_fingerprint()

    step, history, elapsed_before, running = 0, [], 0.0, None
    resumed_from = None
    if resume:
        for leftover in clean_interrupted_writes(ckpt_dir):  # killed checkpoint writes would pile up otherwise
            log(f"removed {leftover} (left by an interrupted checkpoint write)")
        ckpt = load_checkpoint(ckpt_dir)
        state = ckpt.state
        if state.get("fingerprint") != fingerprint:
            raise CheckpointError(f"{ckpt.path} belongs to a different run (the configuration changed since it was "
                                  "written). Restore the original settings, or start again with --overwrite.")
        if state.get("data_sha256") != data_hashes:
            changed = [p for p in data_hashes if state.get("data_sha256", {}).get(p) != data_hashes[p]]
            raise CheckpointError(f"{ckpt.path}: data files changed since the checkpoint ({', '.join(changed)}). "
                                  "Restore them, or start again with --overwrite.")
        if set(ckpt.trainable) != set(params):
            raise CheckpointError(f"{ckpt.path} does not match the model's trainable parameters.")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(ckpt.trainable[name])
        rng = ckpt.optimizer_tensors.pop("rng.torch")
        optimizer_from_tensors(optimizer, ckpt.optimizer_tensors, state["optimizer_param_groups"])
        torch.set_rng_state(rng)
        step, history, elapsed_before = state["step"], state.get("history", []), state.get("train_seconds", 0.0)
        # the loss moving average goes on where it stopped, so the history equals an uninterrupted run's
        running = state.get("running_loss")
        # (checkpoints written before this was recorded: the default OUTPUT.checkpoints is the run's own)
        created_ckpt_dir = bool(state.get("created_checkpoint_dir", config.checkpoint_dir is None))
        resumed_from = ckpt.path.name
        log(f"resuming from {ckpt.path} (step {step}/{total})")

    dev_rng = random.Random(f"{config.seed}:dev-monitor")
    monitor = sorted(dev_rng.sample(range(len(tokens.dev)), min(config.eval_limit, len(tokens.dev))))

    def dev_metrics(indices):
        final, prefix = predict(model, [tokens.dev[i] for i in indices], batch_size=config.eval_batch_size)
        return summarise(final, [dataset.dev[i].label for i in indices], prefix)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc=f"train {config.name}", unit="step", dynamic_ncols=True,
                   file=sys.stderr, mininterval=0.2 if sys.stderr.isatty() else 10.0)  # logs stay small
    log(f"{len(dataset.train)} train / {len(dataset.dev)} dev examples from {len(config.data)} source(s), "
         f"{batches_per_epoch} steps per epoch, {total} steps, method {config.method}, "
         f"{model.config.num_layers} layers, {sum(p.numel() for p in params.values()):,} trainable parameters", bar)

    def checkpoint(at_step: int, seconds: float) -> Path:
        path = save_checkpoint(ckpt_dir, at_step, {n: p.detach() for n, p in params.items()}, optimizer,
                               {"fingerprint": fingerprint, "data_sha256": data_hashes, "history": history,
                                "train_seconds": seconds, "total_steps": total, "running_loss": running,
                                "created_checkpoint_dir": created_ckpt_dir}, keep=config.keep_checkpoints)
        if callbacks.on_checkpoint:
            callbacks.on_checkpoint(at_step, path)
        return path

    model.train()
    loop_start = time.perf_counter()
    examples_seen = 0
    plan_epoch, plan = -1, []
    with StopRequest() as stop:
        while step < total:
            epoch, index = divmod(step, batches_per_epoch)
            if epoch != plan_epoch:
                order = epoch_indices(dataset.train, weights, config.seed, epoch)
                plan, plan_epoch = length_grouped_batches(order, lengths, config.batch_size, config.seed, epoch), epoch
            batch_idx = plan[index]
            batch = {k: v.to(device) for k, v in collate([tokens.train[i] for i in batch_idx], start_id, pad).items()}
            targets = torch.tensor([dataset.train[i].label for i in batch_idx], dtype=torch.float32, device=device)
            rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"]).rewards
            loss = loss_fn(rewards, targets, batch["attention_mask"])
            if not torch.isfinite(loss):
                path = checkpoint(step, elapsed_before + time.perf_counter() - loop_start) if step else None
                raise ConfigError(f"Loss became {loss.item()} at step {step + 1}; lower the learning rate. "
                                      + (f"Last good state saved in {path}." if path else ""))
            apply_update(loss, optimizer, list(params.values()), config.grad_clip,
                         learning_rate(step, total, config.learning_rate, warmup))
            step += 1
            examples_seen += len(batch_idx)
            value = float(loss.detach())
            running = value if running is None else 0.98 * running + 0.02 * value
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{running:.4f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
            if step % 50 == 0 or step == total:
                history.append({"step": step, "loss": round(running, 6)})
            if callbacks.on_step:
                callbacks.on_step(step, value)
            if step % config.eval_every == 0 and step < total and monitor:
                m = dev_metrics(monitor)
                history.append({"step": step, "dev": {k: m[k] for k in ("mse", "auroc", "accuracy")}})
                log(f"step {step}: dev mse {m['mse']:.4f}  auroc {_fmt(m['auroc'])}  acc {m['accuracy']:.3f}  "
                     f"acc@50% {m['accuracy_at_50pct']:.3f}  (n={m['n']})", bar)
            if step % config.checkpoint_every == 0 and step < total:
                checkpoint(step, elapsed_before + time.perf_counter() - loop_start)
            if stop.requested:
                path = checkpoint(step, elapsed_before + time.perf_counter() - loop_start)
                if bar is not None:
                    bar.close()
                raise KeyboardInterrupt(f"stopped at step {step}; checkpoint in {path}; continue with --resume")
    if bar is not None:
        bar.close()
    loop_seconds = time.perf_counter() - loop_start
    train_seconds = elapsed_before + loop_seconds

    eval_start = time.perf_counter()
    metrics = final_metrics(model, dataset, tokens.dev, tokens.eval_sets, config)
    model.to("cpu")  # saved from the CPU whatever it trained on
    eval_seconds = time.perf_counter() - eval_start
    metrics["training"] = {
        "steps": total, "batch_size": config.batch_size, "examples_seen_this_process": examples_seen,
        "train_seconds": round(train_seconds, 1), "eval_seconds": round(eval_seconds, 1),
        "examples_per_second": round(examples_seen / max(loop_seconds, 1e-9), 2) if examples_seen else None,
        "wall_seconds_this_process": round(time.perf_counter() - started, 1),
        "resumed_from": resumed_from, "hardware": hardware(device), "method": config.method,
        "num_layers": model.config.num_layers, "trainable_parameters": sum(p.numel() for p in params.values()),
        "loss": config.loss, "max_length": config.max_length, "lr": config.learning_rate, "seed": config.seed,
    }
    metrics["data"] = [vars(s) for s in dataset.stats]
    metrics["eval_data"] = [vars(s) for _, _, s in dataset.eval_sets]
    metrics["removed_eval_overlap"] = dataset.removed_overlap
    metrics["augmentation"] = {"views": [v.model_dump() for v in config.augment.views], "copies": len(added),
                               "obfuscation_lexicon_size": len(lexicon), "obfuscation_lexicon_sample": lexicon[:40]}
    metrics["left_out"] = list(config.leave_out)
    metrics["history"] = history
    output = write_output(model, config, metrics, overwrite=overwrite)
    if not config.keep_checkpoint_dir:
        remove_checkpoints(ckpt_dir, remove_dir=created_ckpt_dir)
    log(f"wrote {output} ({train_seconds:.0f} s training, {eval_seconds:.0f} s evaluation)")
    return TrainResult(output, metrics, total, train_seconds)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _state_flag(ckpt_dir: Path, key: str, default: bool) -> bool:
    """``key`` from the state of the newest checkpoint in ``ckpt_dir`` (``default`` when absent or unreadable)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        name = (ckpt_dir / LATEST_NAME).read_text(encoding="utf-8").strip()
        return bool(json.loads((ckpt_dir / name / STATE_NAME).read_text(encoding="utf-8")).get(key, default))
    return default

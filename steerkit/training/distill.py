"""Token-level distillation (``kind: token`` with ``distill:``): fit a teacher's rewards of sampled candidates.

The student is the same token-level model that label training builds (``build``, the trainer's
``build_model``); it learns, at every step of continuations sampled from an LM, to give each of the step's top-k
candidates the teacher's reward (mean squared error on f(⟨W h, e_v⟩ + b·h + c)), optionally plus the label loss
on the training texts (``distill.label_weight``). The samples come from :mod:`.distill_data`.

Everything else is the trainer's machinery: the data recipe (for prompts, the dev split and the held-out sets),
checkpoints (:mod:`.checkpoint`; the data order is a pure function of seed and step, the optimizer state and
the RNG are restored, so a resumed run reaches the same weights), the output swap (:mod:`.output`), the model
card (:mod:`.card`) and the same held-out metrics, plus the student's agreement with the teacher on held-out
samples (``metrics["distillation"]``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..devices import resolve_device
from ..errors import ConfigError
from ..threads import set_threads
from .checkpoint import remove_checkpoints
from .data import collate, tokenize
from .distill_data import agreement, candidate_predictions, load_or_sample
from .loss import LOSSES
from .metrics import final_metrics
from .output import prepare_run_dirs, write_output
from .run_state import Checkpointer, RunState
from .runtime import StopRequest, hardware, log
from .update import apply_update


def train_distilled(config, *, resume: bool, overwrite: bool, progress: bool, callbacks, build, schedule):
    """Train ``config`` (kind token, with ``distill``) and write its directory. Returns (output directory,
    metrics, steps, training seconds). ``build`` makes the student, ``schedule(step, total, lr, warmup)`` the lr."""
    if config.kind != "token":
        raise ConfigError("distill: needs kind: token (a sequence reward model is trained from labels).")
    overwrite = overwrite or config.overwrite
    set_threads(config.threads)
    device = resolve_device(config.device)
    dataset = config.read_dataset()
    output, ckpt_dir = Path(config.output_dir), config.checkpoint_path
    created_ckpt_dir = prepare_run_dirs(output, ckpt_dir, resume=resume, overwrite=overwrite)

    model = build(config)
    tok = model.tokenizer
    samples = load_or_sample(config, [e.text for e in dataset.train], ckpt_dir, tok, model.config.start_token_id, log)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(config.seed))
    n_held = int(round(config.distill.holdout_fraction * len(samples)))
    held, train_rows = samples.rows(order[:n_held]), samples.rows(order[n_held:])
    model.to(device)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(list(params.values()), lr=config.learning_rate, weight_decay=config.weight_decay,
                                  foreach=False)
    label_rows = tokenize(tok, [e.text[: 32 * config.max_length] for e in dataset.train], config.max_length)
    per_epoch = max(1, math.ceil(len(train_rows) / config.batch_size))
    total = config.steps or max(1, math.ceil(config.epochs * per_epoch))
    checkpoints = Checkpointer(ckpt_dir, params, optimizer, config.run_fingerprint(), dataset.file_hashes, total,
                               config.keep_checkpoints, created_ckpt_dir,
                               callbacks.on_checkpoint if callbacks is not None else None)
    state = RunState()
    if resume:
        state = checkpoints.restore(default_created=config.checkpoint_dir is None)
        log(f"resuming from {ckpt_dir / state.resumed_from} (step {state.step}/{total})")
    log(f"distilling {config.distill.teacher!r} into {config.name!r}: {len(train_rows)} train / {len(held)} held-out "
        f"samples, {total} steps, {sum(p.numel() for p in params.values()):,} trainable parameters")

    loop_start = time.perf_counter()
    _distill_steps(model, dataset, train_rows, label_rows, per_epoch, config, state, total, optimizer, checkpoints,
                   callbacks, schedule, progress, device)
    train_seconds = state.elapsed_before + time.perf_counter() - loop_start
    eval_start = time.perf_counter()
    run = lambda examples, n: tokenize(tok, [e.text[: 32 * n] for e in examples], n)  # noqa: E731
    metrics = final_metrics(model, dataset, run(dataset.dev, config.max_length),
                            [run(ex, src.max_length or config.max_length) for src, ex, _ in dataset.eval_sets], config)
    metrics["distillation"] = {"teacher": config.distill.teacher, "lm": config.distill.lm, "samples": len(samples),
                               "held_out": agreement(model, held) if len(held) else None,
                               "settings": config.distill.model_dump(mode="json")}
    model.to("cpu")
    label_weight = config.distill.label_weight
    metrics["training"] = {
        "steps": total, "batch_size": config.batch_size, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - eval_start, 1), "resumed_from": state.resumed_from,
        "hardware": hardware(device), "method": config.method, "num_layers": model.config.num_layers,
        "trainable_parameters": sum(p.numel() for p in params.values()), "loss": "distillation (MSE on top-k)"
        + (f" + {label_weight} x {config.loss}" if label_weight else ""), "max_length": config.max_length,
        "lr": config.learning_rate, "seed": config.seed}
    metrics["data"] = [vars(s) for s in dataset.stats]
    metrics["eval_data"] = [vars(s) for _, _, s in dataset.eval_sets]
    metrics["history"] = state.history
    written = write_output(model, config, metrics, overwrite=overwrite)
    if not config.keep_checkpoint_dir:
        remove_checkpoints(ckpt_dir, remove_dir=False)
        for name in ("distill-samples.safetensors", "distill-samples.json"):
            (ckpt_dir / name).unlink(missing_ok=True)
        if checkpoints.created_dir:
            remove_checkpoints(ckpt_dir, remove_dir=True)
    log(f"wrote {written} ({train_seconds:.0f} s training)")
    return written, metrics, total, train_seconds


def _distill_steps(model, dataset, train_rows, label_rows, per_epoch, config, state: RunState, total, optimizer,
                   checkpoints: Checkpointer, callbacks, schedule, progress, device) -> None:
    """The optimizer steps from ``state.step`` to ``total``: each fits a batch of sampled steps' candidates to the
    teacher's rewards (plus the label loss when ``distill.label_weight``), with periodic checkpoints and one
    before stopping on Ctrl-C."""
    params = list(checkpoints.params.values())
    warmup = int(round(config.warmup_fraction * total))
    model.train()
    loop_start = time.perf_counter()
    with StopRequest() as stop:
        while state.step < total:
            step = state.step
            epoch, index = divmod(step, per_epoch)
            perm = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(config.seed * 1009 + epoch))
            part = train_rows.rows(perm[index * config.batch_size:(index + 1) * config.batch_size])
            loss = _distill_loss(model, part, dataset, label_rows, config, step, device)
            if not torch.isfinite(loss):
                raise ConfigError(f"Loss became {loss.item()} at step {step + 1}; lower the learning rate.")
            apply_update(loss, optimizer, params, config.grad_clip, schedule(step, total, config.learning_rate, warmup))
            state.step += 1
            value = float(loss.detach())
            if state.record_loss(value, total) and progress:
                log(f"step {state.step}/{total}: loss {state.running:.5f}")
            if callbacks is not None and callbacks.on_step:
                callbacks.on_step(state.step, value)
            if state.step % config.checkpoint_every == 0 and state.step < total:
                checkpoints.save(state, state.elapsed_before + time.perf_counter() - loop_start)
            if stop.requested:
                path = checkpoints.save(state, state.elapsed_before + time.perf_counter() - loop_start)
                raise KeyboardInterrupt(f"stopped at step {state.step}; checkpoint in {path}; continue with --resume")


def _distill_loss(model, part, dataset, label_rows, config, step: int, device) -> torch.Tensor:
    """MSE between the student's and the teacher's rewards of the batch's candidates, plus ``label_weight`` times
    the label loss on a seeded batch of training texts."""
    pred = candidate_predictions(model, part)
    valid = part.valid.to(device)[..., None].expand_as(pred)
    loss = ((pred - part.rho.to(device)) ** 2)[valid].mean()
    label_weight = config.distill.label_weight
    if label_weight:
        tok = model.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        g = torch.Generator().manual_seed(config.seed * 7 + step)
        idx = torch.randint(0, len(label_rows), (config.batch_size,), generator=g).tolist()
        batch = {k: v.to(device) for k, v in collate([label_rows[i] for i in idx],
                                                     model.config.start_token_id, pad).items()}
        targets = torch.tensor([dataset.train[i].label for i in idx], dtype=torch.float32, device=device)
        rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"]).rewards
        loss = loss + label_weight * LOSSES[config.loss](rewards, targets, batch["attention_mask"])
    return loss

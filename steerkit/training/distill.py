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
from ..errors import CheckpointError, ConfigError
from ..threads import set_threads
from .checkpoint import (clean_interrupted_writes, load_checkpoint, optimizer_from_tensors, remove_checkpoints,
                         save_checkpoint)
from .data import collate, tokenize
from .distill_data import agreement, candidate_predictions, load_or_sample
from .loss import LOSSES
from .metrics import final_metrics
from .output import prepare_run_dirs, write_output
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
    data_hashes = dataset.file_hashes
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
    label_weight = config.distill.label_weight
    label_rows = tokenize(tok, [e.text[: 32 * config.max_length] for e in dataset.train], config.max_length)
    per_epoch = max(1, math.ceil(len(train_rows) / config.batch_size))
    total = config.steps or max(1, math.ceil(config.epochs * per_epoch))
    warmup = int(round(config.warmup_fraction * total))
    fingerprint = config.run_fingerprint()
    step, history, elapsed_before, running, resumed_from = 0, [], 0.0, None, None
    if resume:
        clean_interrupted_writes(ckpt_dir)
        ckpt = load_checkpoint(ckpt_dir)
        if ckpt.state.get("fingerprint") != fingerprint or ckpt.state.get("data_sha256") != data_hashes:
            raise CheckpointError(f"{ckpt.path} belongs to a different run (configuration or data changed). "
                                  "Restore them, or start again with --overwrite.")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(ckpt.trainable[name])
        torch.set_rng_state(ckpt.optimizer_tensors.pop("rng.torch"))
        optimizer_from_tensors(optimizer, ckpt.optimizer_tensors, ckpt.state["optimizer_param_groups"])
        step, history = ckpt.state["step"], ckpt.state.get("history", [])
        elapsed_before, running = ckpt.state.get("train_seconds", 0.0), ckpt.state.get("running_loss")
        created_ckpt_dir = bool(ckpt.state.get("created_checkpoint_dir", config.checkpoint_dir is None))
        resumed_from = ckpt.path.name
        log(f"resuming from {ckpt.path} (step {step}/{total})")
    log(f"distilling {config.distill.teacher!r} into {config.name!r}: {len(train_rows)} train / {len(held)} held-out "
        f"samples, {total} steps, {sum(p.numel() for p in params.values()):,} trainable parameters")

    def checkpoint(at_step: int, seconds: float) -> Path:
        path = save_checkpoint(ckpt_dir, at_step, {n: p.detach() for n, p in params.items()}, optimizer,
                               {"fingerprint": fingerprint, "data_sha256": data_hashes, "history": history,
                                "train_seconds": seconds, "total_steps": total, "running_loss": running,
                                "created_checkpoint_dir": created_ckpt_dir}, keep=config.keep_checkpoints)
        if callbacks is not None and callbacks.on_checkpoint:
            callbacks.on_checkpoint(at_step, path)
        return path

    model.train()
    loop_start = time.perf_counter()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with StopRequest() as stop:
        while step < total:
            epoch, index = divmod(step, per_epoch)
            perm = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(config.seed * 1009 + epoch))
            part = train_rows.rows(perm[index * config.batch_size:(index + 1) * config.batch_size])
            pred = candidate_predictions(model, part)
            valid = part.valid.to(device)[..., None].expand_as(pred)
            loss = ((pred - part.rho.to(device)) ** 2)[valid].mean()
            if label_weight:
                g = torch.Generator().manual_seed(config.seed * 7 + step)
                idx = torch.randint(0, len(label_rows), (config.batch_size,), generator=g).tolist()
                batch = {k: v.to(device) for k, v in collate([label_rows[i] for i in idx],
                                                             model.config.start_token_id, pad).items()}
                targets = torch.tensor([dataset.train[i].label for i in idx], dtype=torch.float32, device=device)
                rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                                position_ids=batch["position_ids"]).rewards
                loss = loss + label_weight * LOSSES[config.loss](rewards, targets, batch["attention_mask"])
            if not torch.isfinite(loss):
                raise ConfigError(f"Loss became {loss.item()} at step {step + 1}; lower the learning rate.")
            apply_update(loss, optimizer, list(params.values()), config.grad_clip,
                         schedule(step, total, config.learning_rate, warmup))
            step += 1
            value = float(loss.detach())
            running = value if running is None else 0.98 * running + 0.02 * value
            if step % 50 == 0 or step == total:
                history.append({"step": step, "loss": round(running, 6)})
                if progress:
                    log(f"step {step}/{total}: loss {running:.5f}")
            if callbacks is not None and callbacks.on_step:
                callbacks.on_step(step, value)
            if step % config.checkpoint_every == 0 and step < total:
                checkpoint(step, elapsed_before + time.perf_counter() - loop_start)
            if stop.requested:
                path = checkpoint(step, elapsed_before + time.perf_counter() - loop_start)
                raise KeyboardInterrupt(f"stopped at step {step}; checkpoint in {path}; continue with --resume")
    train_seconds = elapsed_before + time.perf_counter() - loop_start
    eval_start = time.perf_counter()
    run = lambda examples, n: tokenize(tok, [e.text[: 32 * n] for e in examples], n)  # noqa: E731
    metrics = final_metrics(model, dataset, run(dataset.dev, config.max_length),
                            [run(ex, src.max_length or config.max_length) for src, ex, _ in dataset.eval_sets], config)
    metrics["distillation"] = {"teacher": config.distill.teacher, "lm": config.distill.lm, "samples": len(samples),
                               "held_out": agreement(model, held) if len(held) else None,
                               "settings": config.distill.model_dump(mode="json")}
    model.to("cpu")
    metrics["training"] = {
        "steps": total, "batch_size": config.batch_size, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - eval_start, 1), "resumed_from": resumed_from,
        "hardware": hardware(device), "method": config.method, "num_layers": model.config.num_layers,
        "trainable_parameters": sum(p.numel() for p in params.values()), "loss": "distillation (MSE on top-k)"
        + (f" + {label_weight} x {config.loss}" if label_weight else ""), "max_length": config.max_length,
        "lr": config.learning_rate, "seed": config.seed}
    metrics["data"] = [vars(s) for s in dataset.stats]
    metrics["eval_data"] = [vars(s) for _, _, s in dataset.eval_sets]
    metrics["history"] = history
    written = write_output(model, config, metrics, overwrite=overwrite)
    if not config.keep_checkpoint_dir:
        remove_checkpoints(ckpt_dir, remove_dir=False)
        for name in ("distill-samples.safetensors", "distill-samples.json"):
            (ckpt_dir / name).unlink(missing_ok=True)
        if created_ckpt_dir:
            remove_checkpoints(ckpt_dir, remove_dir=True)
    log(f"wrote {written} ({train_seconds:.0f} s training)")
    return written, metrics, total, train_seconds

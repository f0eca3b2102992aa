"""Token-level distillation (``kind: token`` with ``distill:``): fit a teacher's rewards of sampled candidates.

The student is the same token-level model that label training builds (``build``, the trainer's
``build_model``); it learns, at every step of continuations sampled from an LM, to give each of the step's top-k
candidates the teacher's reward (mean squared error on f(⟨W h, e_v⟩ + b·h + c)), optionally plus the label loss
on the training texts (``distill.label_weight``). The samples come from :mod:`.distill_data`.

Everything else is the trainer's machinery: the data recipe (for prompts, the dev split and the held-out sets),
the training loop (:mod:`.loop`: checkpoints, resume, the non-finite-loss checkpoint, the "nothing to train"
check, monitoring; the data order is a pure function of seed and step, the optimizer state and the RNG are
restored, so a resumed run reaches the same weights), the output swap (:mod:`.output`), the model card
(:mod:`.card`) and the same held-out metrics, plus the student's agreement with the teacher on held-out samples
(``metrics["distillation"]``, and every ``eval_every`` steps in the history).
"""

from __future__ import annotations

import math
import random
import time

import torch

from ..devices import resolve_device
from ..errors import ConfigError
from ..seeds import mixed_seed
from ..threads import set_threads
from .distill_data import SAMPLES_NAME, SAMPLES_STATE, agreement, candidate_predictions, load_or_sample
from .loop import DevMonitor, TrainingLoop, label_loss, prepare_dirs, tokenize_dataset
from .loss import LOSSES
from .metrics import final_metrics
from .output import portable_data, write_output
from .runtime import hardware, log


def train_distilled(config, *, resume: bool, overwrite: bool, progress: bool, callbacks, build):
    """Train ``config`` (kind token, with ``distill``) and write its directory. Returns (output directory,
    metrics, steps, training seconds). ``build`` makes the student (the trainer's ``build_model``)."""
    if config.kind != "token":
        raise ConfigError("distill: needs kind: token (a sequence reward model is trained from labels).")
    overwrite = overwrite or config.overwrite
    set_threads(config.threads)
    device = resolve_device(config.device)
    dataset = config.read_dataset()
    dirs = prepare_dirs(config, resume=resume, overwrite=overwrite)

    model = build(config).to(device)
    # before the sampling: a student with nothing to train is refused at once
    loop = TrainingLoop(config, model, dirs, dataset.file_hashes, callbacks=callbacks, progress=progress)
    samples = load_or_sample(config, [e.text for e in dataset.train], dirs.checkpoints, model.tokenizer,
                             model.config.start_token_id, log)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(config.seed))
    n_held = int(round(config.distill.holdout_fraction * len(samples)))
    held, train_rows = samples.rows(order[:n_held]), samples.rows(order[n_held:])
    if not len(train_rows):
        raise ConfigError(f"distill: all {len(samples)} samples are held out; lower distill.holdout_fraction or "
                          "raise distill.prompts.")
    tokens = tokenize_dataset(model, dataset, config)
    run = loop.run(DistillationLoss(dataset, tokens, train_rows, held, config, device), resume=resume)
    train_seconds = run.state.elapsed_before + run.seconds

    eval_start = time.perf_counter()
    metrics = final_metrics(model, dataset, tokens.dev, tokens.eval_sets, config)
    metrics["distillation"] = {"teacher": config.distill.teacher, "lm": config.distill.lm, "samples": len(samples),
                               "held_out": agreement(model, held) if len(held) else None,
                               "settings": config.distill.model_dump(mode="json")}
    model.to("cpu")
    label_weight = config.distill.label_weight
    metrics["training"] = {
        "steps": run.total, "batch_size": config.batch_size, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - eval_start, 1), "resumed_from": run.state.resumed_from,
        "hardware": hardware(device), "method": config.method, "num_layers": model.config.num_layers,
        "trainable_parameters": run.trainable, "loss": "distillation (MSE on top-k)"
        + (f" + {label_weight} x {config.loss}" if label_weight else ""), "max_length": config.max_length,
        "lr": config.learning_rate, "seed": config.seed}
    metrics.update(portable_data(dataset, config))
    metrics["history"] = run.state.history
    written = write_output(model, config, metrics, overwrite=overwrite)
    loop.finish(extra_files=(SAMPLES_NAME, SAMPLES_STATE))
    log(f"wrote {written} ({train_seconds:.0f} s training)")
    return written, metrics, run.total, train_seconds


class DistillationLoss:
    """Distillation's :class:`~.loop.LossStrategy`: each step fits a batch of sampled steps' candidates to the
    teacher's rewards (plus the label loss when ``distill.label_weight``); monitored are the dev rows (as in label
    training) and the agreement with the teacher on a seeded sample of the held-out samples."""

    def __init__(self, dataset, tokens, train_rows, held, config, device):
        self.dataset, self.tokens, self.train_rows = dataset, tokens, train_rows
        self.config, self.device = config, device
        self.per_epoch = max(1, math.ceil(len(train_rows) / config.batch_size))
        self.loss_fn = LOSSES[config.loss]
        self.dev = DevMonitor(dataset, tokens.dev, config)
        rng = random.Random(f"{config.seed}:teacher-monitor")
        self.held = held.rows(sorted(rng.sample(range(len(held)), min(config.eval_limit, len(held)))))
        self.n_held = len(held)
        self._order = (-1, None)  # one epoch's order of the training samples at a time

    def batch(self, step: int):
        """``(step, samples)``: the step's slice of its epoch's seeded permutation of the training samples."""
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._order[0]:
            generator = torch.Generator().manual_seed(mixed_seed(self.config.seed, 1009, epoch))
            self._order = (epoch, torch.randperm(len(self.train_rows), generator=generator))
        size = self.config.batch_size
        return step, self.train_rows.rows(self._order[1][index * size:(index + 1) * size])

    def loss(self, model, batch) -> torch.Tensor:
        """MSE between the student's and the teacher's rewards of the batch's candidates, plus ``label_weight``
        times the label loss on a seeded batch of training texts."""
        step, part = batch
        pred = candidate_predictions(model, part)
        valid = part.valid.to(self.device)[..., None].expand_as(pred)
        loss = ((pred - part.rho.to(self.device)) ** 2)[valid].mean()
        label_weight = self.config.distill.label_weight
        if label_weight:
            g = torch.Generator().manual_seed(mixed_seed(self.config.seed, 7, step))
            idx = torch.randint(0, len(self.tokens.train), (self.config.batch_size,), generator=g).tolist()
            loss = loss + label_weight * label_loss(model, [self.tokens.train[i] for i in idx],
                                                    [self.dataset.train[i].label for i in idx], self.loss_fn,
                                                    self.device)
        return loss

    def size(self, batch) -> int:
        return len(batch[1])

    def monitor(self, model):
        figures, lines = {}, []
        dev = self.dev(model)
        if dev is not None:
            figures.update(dev[0])
            lines.append(dev[1])
        if len(self.held):
            a = agreement(model, self.held)
            figures["teacher"] = {"mse": a["mse"], "top1_agreement": a["top1_agreement"]}
            lines.append(f"teacher mse {a['mse']:.5f}  top-1 {a['top1_agreement']:.3f}  (n={len(self.held)})")
        return (figures, "  ".join(lines)) if figures else None

    def describe(self, total: int, trainable: int) -> str:
        return (f"distilling {self.config.distill.teacher!r} into {self.config.name!r}: {len(self.train_rows)} train / "
                f"{self.n_held} held-out samples, {total} steps, {trainable:,} trainable parameters")

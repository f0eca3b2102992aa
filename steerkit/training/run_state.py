"""What a training run carries across checkpoints, shared by ``trainer.train`` and ``distill.train_distilled``.

:class:`RunState` is the loop's progress (step, loss history, running loss, earlier processes' seconds);
:class:`Checkpointer` writes it with the trainable weights and the optimizer, and :meth:`Checkpointer.restore`
reads it back on ``--resume`` after checking that the checkpoint belongs to this run (same configuration, same
data files, same trainable parameters).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..errors import CheckpointError
from .checkpoint import (LATEST_NAME, STATE_NAME, clean_interrupted_writes, load_checkpoint, optimizer_from_tensors,
                         save_checkpoint)
from .runtime import log


@dataclass
class RunState:
    step: int = 0
    history: list[dict] = field(default_factory=list)
    elapsed_before: float = 0.0  # training seconds of the processes before this one (a resumed run)
    running: float | None = None  # the loss's moving average, carried over so a resumed history is identical
    resumed_from: str | None = None  # the checkpoint's name

    def record_loss(self, value: float, total: int) -> bool:
        """Fold this step's loss into the moving average; every 50 steps and at the end it joins the history
        (True then)."""
        self.running = value if self.running is None else 0.98 * self.running + 0.02 * value
        if self.step % 50 == 0 or self.step == total:
            self.history.append({"step": self.step, "loss": round(self.running, 6)})
            return True
        return False


@dataclass
class Checkpointer:
    """Writes and restores one run's checkpoints in ``directory``."""

    directory: Path
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    fingerprint: str  # TrainConfig.run_fingerprint()
    data_hashes: dict[str, str]
    total: int
    keep: int
    created_dir: bool  # whether this run owns the directory (then removes it once empty); a resume inherits it
    on_checkpoint: Callable[[int, Path], None] | None = None

    def save(self, state: RunState, seconds: float) -> Path:
        path = save_checkpoint(self.directory, state.step, {n: p.detach() for n, p in self.params.items()},
                               self.optimizer,
                               {"fingerprint": self.fingerprint, "data_sha256": self.data_hashes,
                                "history": state.history, "train_seconds": seconds, "total_steps": self.total,
                                "running_loss": state.running, "created_checkpoint_dir": self.created_dir},
                               keep=self.keep)
        if self.on_checkpoint:
            self.on_checkpoint(state.step, path)
        return path

    def restore(self, default_created: bool) -> RunState:
        """Load the newest checkpoint into the parameters, the optimizer and torch's RNG; its progress.
        ``default_created``: ownership of the directory for checkpoints written before it was recorded."""
        for leftover in clean_interrupted_writes(self.directory):  # killed checkpoint writes would pile up otherwise
            log(f"removed {leftover} (left by an interrupted checkpoint write)")
        ckpt = load_checkpoint(self.directory)
        state = ckpt.state
        if state.get("fingerprint") != self.fingerprint:
            raise CheckpointError(f"{ckpt.path} belongs to a different run (the configuration changed since it was "
                                  "written). Restore the original settings, or start again with --overwrite.")
        if state.get("data_sha256") != self.data_hashes:
            changed = [p for p in self.data_hashes if state.get("data_sha256", {}).get(p) != self.data_hashes[p]]
            raise CheckpointError(f"{ckpt.path}: data files changed since the checkpoint ({', '.join(changed)}). "
                                  "Restore them, or start again with --overwrite.")
        problem = trainable_mismatch(ckpt.trainable, self.params)
        if problem:
            raise CheckpointError(f"{ckpt.path} does not match the model's trainable parameters ({problem}). "
                                  "Restore the original model and method, or start again with --overwrite.")
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(ckpt.trainable[name])
        rng = ckpt.optimizer_tensors.pop("rng.torch")
        optimizer_from_tensors(self.optimizer, ckpt.optimizer_tensors, state["optimizer_param_groups"])
        torch.set_rng_state(rng)
        self.created_dir = bool(state.get("created_checkpoint_dir", default_created))
        return RunState(state["step"], state.get("history", []), state.get("train_seconds", 0.0),
                        state.get("running_loss"), ckpt.path.name)


def trainable_mismatch(saved: dict[str, torch.Tensor], params: dict[str, torch.nn.Parameter]) -> str:
    """How a checkpoint's trainable tensors differ from the model's trainable parameters ("" when they match:
    the same names, each of the same shape)."""
    missing, extra = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
    reshaped = sorted(n for n in set(params) & set(saved) if tuple(saved[n].shape) != tuple(params[n].shape))
    parts = [f"{label}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
             for label, names in (("not in the checkpoint", missing), ("no longer trained", extra),
                                  ("another shape", reshaped)) if names]
    return "; ".join(parts)


def state_flag(ckpt_dir: Path, key: str, default: bool) -> bool:
    """``key`` from the state of the newest checkpoint in ``ckpt_dir`` (``default`` when absent or unreadable)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        name = (ckpt_dir / LATEST_NAME).read_text(encoding="utf-8").strip()
        return bool(json.loads((ckpt_dir / name / STATE_NAME).read_text(encoding="utf-8")).get(key, default))
    return default

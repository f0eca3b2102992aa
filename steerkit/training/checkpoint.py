"""Training checkpoints: safetensors for every tensor, JSON for the rest. Never pickle, never torch.load.

Layout of ``<checkpoint_dir>/step-0000400/``::

    trainable.safetensors   every trainable parameter, by name
    optimizer.safetensors   optimizer state tensors ("<param index>.<key>") and the torch RNG state
    state.json              step, run fingerprint, data hashes, optimizer hyper-parameters, history

A checkpoint is written into a temporary directory which is renamed into place once complete, and
``latest`` (a one-line text file, replaced atomically) then points at it. A process killed at any moment
leaves either the previous checkpoint or the new one, never a half-written one that looks valid. What a
killed write can leave behind is a ``.step-N.tmpPID`` directory or a ``.latest.XXXXXXXX`` file (the temporary
name of :func:`~steerkit.models.atomic_write_text`); :func:`clean_interrupted_writes` removes exactly those
names when a run resumes. :func:`remove_checkpoints` removes only what checkpointing writes (``step-*``
directories, ``latest`` and those temporaries), never anything else a user keeps in the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..files import atomic_write_text

STATE_NAME = "state.json"
TRAINABLE_NAME = "trainable.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"
LATEST_NAME = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# the temporary names a killed checkpoint write leaves: save_checkpoint's ".step-0000400.tmp<pid>" directory and
# atomic_write_text's mkstemp file for "latest" (prefix ".latest.", then tempfile's 8 characters [a-z0-9_])
_STEP_TMP = re.compile(r"^\.step-\d+\.tmp\d+$")
_LATEST_TMP = re.compile(r"^\.latest\.[a-z0-9_]{8}$")


@dataclass
class Checkpoint:
    path: Path
    state: dict
    trainable: dict[str, torch.Tensor]
    optimizer_tensors: dict[str, torch.Tensor]


def _fsync_file(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Split ``optimizer.state_dict()`` into flat tensors (safetensors) and JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            tensors[f"{index}.{key}"] = value.detach().contiguous().cpu()
    groups = []
    for group in sd["param_groups"]:
        clean = {}
        for key, value in group.items():
            if isinstance(value, tuple):
                value = list(value)
            if isinstance(value, torch.Tensor):
                value = value.item()
            clean[key] = value
        groups.append(clean)
    return tensors, groups


def optimizer_from_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict]) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        index, _, key = name.partition(".")
        state.setdefault(int(index), {})[key] = value
    restored = []
    for group in groups:
        group = dict(group)
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        restored.append(group)
    try:
        optimizer.load_state_dict({"state": state, "param_groups": restored})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"Optimizer state does not match the model being trained: {exc}") from None


def save_checkpoint(directory: Path, step: int, trainable: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                    state: dict, keep: int) -> Path:
    """Write ``step-<step>`` atomically, point ``latest`` at it and prune older checkpoints."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:07d}"
    final = directory / name
    tmp = directory / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        opt_tensors, groups = optimizer_to_tensors(optimizer)
        opt_tensors["rng.torch"] = torch.get_rng_state()
        save_file({k: v.detach().contiguous().cpu() for k, v in trainable.items()}, str(tmp / TRAINABLE_NAME))
        save_file(opt_tensors, str(tmp / OPTIMIZER_NAME))
        full_state = {**state, "step": step, "optimizer_param_groups": groups}
        (tmp / STATE_NAME).write_text(json.dumps(full_state, indent=1), encoding="utf-8")
        for f in tmp.iterdir():
            _fsync_file(f)
        if final.exists():  # a re-run of the same step after a resume: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(directory / LATEST_NAME, name + "\n")
    for old in sorted(_step_dirs(directory))[:-keep]:
        if old[1] != final:
            shutil.rmtree(old[1], ignore_errors=True)
    return final


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for p in directory.iterdir() if directory.is_dir() else []:
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return found


def _interrupted_writes(directory: Path) -> list[Path]:
    found = []
    for p in directory.iterdir() if directory.is_dir() and not directory.is_symlink() else []:
        if p.is_symlink():
            continue
        if (_STEP_TMP.match(p.name) and p.is_dir()) or (_LATEST_TMP.match(p.name) and p.is_file()):
            found.append(p)
    return sorted(found)


def clean_interrupted_writes(directory: Path) -> list[Path]:
    """Remove what killed checkpoint writes left in ``directory`` (only names matching exactly
    ``.step-N.tmpPID`` directories and ``.latest.XXXXXXXX`` files); returns what was removed."""
    removed = []
    for p in _interrupted_writes(directory):
        with contextlib.suppress(FileNotFoundError):
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        removed.append(p)
    return removed


def remove_checkpoints(directory: Path, *, remove_dir: bool) -> None:
    """Delete the checkpoints in ``directory``: its ``step-*`` directories, ``latest`` and the temporaries of
    interrupted writes. Anything else stays; the directory itself goes only if ``remove_dir`` (the run created
    it) and it is then empty."""
    if not directory.is_dir() or directory.is_symlink():
        return
    for _, p in _step_dirs(directory):
        if not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
    latest = directory / LATEST_NAME
    if latest.is_file() and not latest.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            latest.unlink()
    clean_interrupted_writes(directory)
    if remove_dir:
        with contextlib.suppress(OSError):  # not empty: the user put something there, so it stays
            directory.rmdir()


def has_checkpoints(directory: Path) -> bool:
    return bool(_step_dirs(directory)) or (directory / LATEST_NAME).exists()


def load_checkpoint(directory: Path) -> Checkpoint:
    """The newest complete checkpoint (``latest``, else the highest complete ``step-*``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not directory.is_dir():
        raise CheckpointError(f"No checkpoints to resume from: {directory} does not exist. Start without --resume.")
    candidates = []
    latest = directory / LATEST_NAME
    if latest.is_file():
        candidates.append(directory / latest.read_text(encoding="utf-8").strip())
    candidates += [p for _, p in sorted(_step_dirs(directory), reverse=True)]
    problems = []
    for path in dict.fromkeys(candidates):
        try:
            state = json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
            trainable = load_file(str(path / TRAINABLE_NAME))
            optimizer_tensors = load_file(str(path / OPTIMIZER_NAME))
            return Checkpoint(path, state, trainable, optimizer_tensors)
        except (OSError, ValueError, SafetensorError) as exc:
            problems.append(f"{path.name}: {exc}")
    raise CheckpointError(f"No readable checkpoint in {directory}"
                          + (f" ({'; '.join(problems[:3])})" if problems else "")
                          + ". Start without --resume (and with --overwrite) to train from scratch.")

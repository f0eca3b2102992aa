"""Leave-one-source-out validation: ``steerkit train CONFIG --cross-source DIR``.

A reward model that fits its training sources can still fail on text from anywhere else, and that is what
decoding meets. The measure of a recipe is therefore how a model trained on all sources but one does on the
source it never saw. This runs one fold per source (or group) plus one on all sources, each with the same
recipe (usually fewer ``steps`` than the shipped run), and writes ``DIR/cross_source.json`` and ``.md``:

* a fold's model goes to ``DIR/<fold>/`` (its card and metrics.json included) with checkpoints next to it; the
  fold's directory is ``all`` or ``without-<the left-out group's name, lower-case, runs of other characters as
  "-">`` (:func:`fold_dirs`: names that give the same directory, or one too long for a file name, end in a digest);
* a finished fold (``metrics.json`` present) is not trained again, and an interrupted fold resumes from its
  checkpoint, so rerunning the command after a stop continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections import Counter
from pathlib import Path

from ..files import atomic_write_text, file_name
from .card import cross_source_lines
from .checkpoint import has_checkpoints
from .config import TrainConfig
from .runtime import log

ALL_SOURCES = "all sources"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "source"


def fold_dirs(groups: list[str]) -> dict[str | None, str]:
    """Each fold's directory name: ``all`` (key None) and ``without-<slug>`` per left-out group. Two groups whose
    names give one slug ("Reddit!" and "reddit?") get 8 hex digits of their name's SHA-256 after it, so that no
    fold trains into another's directory, and a name too long for a file name is cut by
    :func:`steerkit.files.file_name` (its checkpoints' sibling ``.checkpoints`` still fits)."""
    slugs = {group: _slug(group) for group in groups}
    count = Counter(slugs.values())
    names: dict[str | None, str] = {None: "all"}
    for group, slug in slugs.items():
        digest = f"-{hashlib.sha256(group.encode()).hexdigest()[:8]}" if count[slug] > 1 else ""
        names[group] = file_name(f"without-{slug}{digest}")
    return names


def fold_names(config: TrainConfig) -> list[str]:
    """The groups to leave out, in config order (two views of one group form one fold)."""
    seen: list[str] = []
    for source in config.data:
        if source.metrics_name not in seen:
            seen.append(source.metrics_name)
    return seen


def run_cross_source(config: TrainConfig, directory: Path, *, progress: bool = True,
                     command: str = "") -> dict:
    from .trainer import train

    directory.mkdir(parents=True, exist_ok=True)
    groups = fold_names(config)
    dirs = fold_dirs(groups)
    metric = config.selection_metric
    folds = []
    for left_out in [None] + groups:
        name = ALL_SOURCES if left_out is None else f"all but {left_out}"
        out = directory / dirs[left_out]
        done = out / "metrics.json"
        if not done.is_file():
            ckpt = Path(str(out) + ".checkpoints")
            # the matrix needs the dev splits and the left-out source only: the test sets are not evaluated per fold
            fold = TrainConfig.from_dict({**config.model_dump(), **{
                "leave_out": [left_out] if left_out else [], "output_dir": str(out), "checkpoint_dir": str(ckpt),
                "card": None, "cross_source": None, "overwrite": True, "eval": []}}, source="cross-source fold")
            fold._source_file = config.source_file
            log(f"cross-source fold: {name} -> {out}")
            train(fold, resume=has_checkpoints(ckpt), overwrite=True, progress=progress)
        metrics = json.loads(done.read_text(encoding="utf-8"))
        cells = {g: metrics.get("dev", {}).get(g) for g in groups if g != left_out}
        if left_out is not None:
            cells[left_out] = metrics.get("eval", {}).get(f"left out: {left_out}")
        cells = {k: _short(v) for k, v in cells.items() if v}
        folds.append({"name": name, "left_out": left_out, "dir": out.name, "cells": cells,
                      "left_out_metric": cells.get(left_out, {}).get(metric) if left_out else None})
    held = [f["left_out_metric"] for f in folds if f["left_out_metric"] is not None]
    report = {"sources": groups, "metric": metric, "steps": config.steps, "leave_out_limit": config.leave_out_limit,
              "folds": folds, "mean_left_out": sum(held) / len(held) if held else None,
              "command": command or f"steerkit train {shlex.quote(config.source_file or 'CONFIG')} "
                                    f"--cross-source {shlex.quote(str(directory))} --steps {config.steps}"}
    atomic_write_text(directory / "cross_source.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(directory / "cross_source.md", "\n".join(cross_source_lines(report)) + "\n")
    return report


def _short(m: dict) -> dict:
    return {k: m.get(k) for k in ("n", "auroc", "accuracy", "mse", "accuracy_at_50pct", "mean_reward")}


"""The reward-model directory a training run writes, and what is never destroyed doing so.

An existing output is refused before training starts (and again before the swap) unless it is empty, or
``overwrite`` is set and it is a steerkit reward-model directory (it has ``reward_config.json``); a regular
file, a symbolic link or any other directory there is always refused. The directory is written next to its
destination (weights, metrics.json, README.md model card, training_config.json) and swapped into place, so
the old one survives any failure.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import CheckpointError, ConfigError, OutputExistsError
from ..rewards.model import CONFIG_NAME, RewardModel
from .card import shown_path
from .checkpoint import has_checkpoints, remove_checkpoints
from .config import TrainConfig


def check_output_dir(output: Path, overwrite: bool) -> None:
    """Raise :class:`OutputExistsError` unless writing the reward model to ``output`` destroys nothing.

    Allowed: ``output`` does not exist, is an empty directory, or (only with ``overwrite``) is a steerkit
    reward-model directory. A regular file, a symbolic link or any other non-empty directory is refused."""
    if output.is_symlink():
        raise OutputExistsError(f"Output {output} is a symbolic link; steerkit will not replace it. Give the real "
                                "directory as --output (-o / output_dir), or another path.")
    if not output.exists():
        return
    if not output.is_dir():
        raise OutputExistsError(f"Output {output} exists and is not a directory; steerkit never replaces it, even "
                                "with --overwrite. Choose another --output (-o / output_dir), or move it away.")
    if not any(output.iterdir()):
        return
    if not (output / CONFIG_NAME).is_file():
        raise OutputExistsError(f"Output directory {output} is not empty and is not a steerkit reward model (no "
                                f"{CONFIG_NAME}); steerkit will not replace it, even with --overwrite. Choose "
                                "another --output (-o / output_dir), or empty it yourself.")
    if not overwrite:
        raise OutputExistsError(f"Output {output} already holds a reward model. Pass --overwrite (overwrite: true) "
                                "to replace it, or choose another --output (-o / output_dir).")


def portable_path(source, config: TrainConfig) -> str:
    """A data or evaluation source's path as a model's files record it: one that sits next to the config
    (``relative_to: config``, made absolute when the config was read) relative to the config's directory, as the
    config wrote it (:func:`~steerkit.training.card.shown_path`); a path under ``data_root`` as it is."""
    return shown_path(source.path, config) if source.relative_to == "config" else source.path


def portable_data(dataset, config: TrainConfig) -> dict:
    """metrics.json's ``data`` and ``eval_data``: each training and evaluation source's statistics, its path by
    :func:`portable_path`."""
    def records(pairs) -> list[dict]:
        return [{**vars(stats), "path": portable_path(source, config)} for source, stats in pairs]

    return {"data": records(zip(dataset.sources, dataset.stats)),
            "eval_data": records((source, stats) for source, _, stats in dataset.eval_sets)}


def portable_config(config: TrainConfig) -> dict:
    """The config as written into the output: no path of this machine (the directories by their names, the sources
    beside the config relative to it)."""
    data = config.model_dump(mode="json")
    for key in ("data_root", "output_dir", "checkpoint_dir", "card"):
        data[key] = None if data.get(key) is None else Path(data[key]).name
    if data.get("cross_source"):
        data["cross_source"] = shown_path(data["cross_source"], config)
    for key, sources in (("data", config.data), ("eval", config.eval)):
        for written, source in zip(data[key], sources):
            written["path"] = portable_path(source, config)
    return data


def write_output(model: RewardModel, config: TrainConfig, metrics: dict, *, overwrite: bool = False) -> Path:
    """Write the reward-model directory next to its destination, then swap it in (the old one survives failures)."""
    from ..files import atomic_write_text
    from .card import render_card

    output = Path(config.output_dir)
    check_output_dir(output, overwrite)  # again: something may have appeared there during training
    # the model's LoRA settings have their target modules resolved
    card = render_card(config.model_copy(update={"lora": model.config.lora or config.lora}), metrics)

    def fill(tmp: Path) -> None:
        model.eval()
        model.save_pretrained(tmp, metrics=metrics)
        atomic_write_text(tmp / "README.md", card)
        atomic_write_text(tmp / "training_config.json", json.dumps(portable_config(config), indent=2))

    write_model_dir(output, overwrite, fill)
    if config.card:
        atomic_write_text(Path(config.card), card)
    return output


def write_model_dir(output: Path, overwrite: bool, fill) -> None:
    """Write a reward-model directory next to ``output`` (``fill(tmp)`` writes its files), then swap it into place:
    the old one, which :func:`check_output_dir` must allow again now, is moved aside first and removed only after the
    swap, so it survives any failure. What ``steerkit train`` and ``steerkit average`` write through."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.new."))
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp/mkstemp create owner-only entries; a model directory is meant to be shared
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        old = None
        if output.exists():  # an empty directory or (with overwrite) a reward model: check_output_dir allowed it
            check_output_dir(output, overwrite)
            old = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.old."))
            os.rename(output, old / output.name)
        os.rename(tmp, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_checkpoint_dir(ckpt_dir: Path, output: Path) -> None:
    """Refuse a checkpoint directory that is a file, or inside the output (which the run replaces)."""
    if ckpt_dir.exists() and not ckpt_dir.is_dir():
        raise ConfigError(f"checkpoint_dir {ckpt_dir} exists and is not a directory. Choose another "
                          "--checkpoint-dir.")
    out, ckpt = output.resolve(), ckpt_dir.resolve()
    if ckpt == out or out in ckpt.parents:
        raise ConfigError(f"checkpoint_dir {ckpt_dir} is inside output_dir {output}, which is replaced when "
                          "training ends. Choose a --checkpoint-dir outside it (the default is OUTPUT.checkpoints).")


def prepare_run_dirs(output: Path, ckpt_dir: Path, *, resume: bool, overwrite: bool, inherited_owner=None) -> bool:
    """Check the output and checkpoint directories before training; a fresh run (not ``resume``) discards an
    earlier run's checkpoints, only with ``overwrite``. Returns whether this run owns the checkpoint directory
    (then removes it once empty): True when it does not exist yet, else ``inherited_owner()`` (when given) of
    the discarded run; a resumed run inherits it."""
    check_output_dir(output, overwrite)  # now, not after minutes of training
    check_checkpoint_dir(ckpt_dir, output)
    created_ckpt_dir = not ckpt_dir.exists()
    if not resume and has_checkpoints(ckpt_dir):
        if not overwrite:
            raise CheckpointError(f"{ckpt_dir} holds checkpoints of an earlier run. Pass --resume to continue it, "
                                  "or --overwrite to discard them and start again.")
        if inherited_owner is not None:
            created_ckpt_dir = inherited_owner()
        remove_checkpoints(ckpt_dir, remove_dir=False)  # only the checkpoints: anything else there stays
    return created_ckpt_dir

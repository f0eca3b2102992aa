"""Helpers for plugin authors who ship a trained reward-model directory inside their package.

    from steerkit import hookimpl
    from steerkit.rewards.packaged import describe_reward_model, reward_model_factory

    @hookimpl
    def register_reward_models(register):
        register("toxicity", reward_model_factory(MODEL_DIR, name="toxicity", package="steerkit-toxicity"),
                 description=describe_reward_model(MODEL_DIR, "toxicity"))

The factory serves every registered backend (``torch``, ``onnx``, or one a plugin adds) through the backend table,
and every kind of reward model (sequence or token-level) through the kind table (:mod:`steerkit.rewards.kinds`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import PluginError
from .backends import DEFAULT_BACKEND
from .kinds import DEFAULT_KIND, find_kind, kind_of
from .model_config import CONFIG_NAME


def reward_model_factory(directory: str | os.PathLike, *, name: str, package: str | None = None):
    """A ``register_reward_models`` factory for a trained reward-model directory shipped in a package.

    The directory is checked when the reward is used, not at registration: if its files are missing the
    factory raises :class:`~steerkit.errors.PluginError` saying so. The model is loaded once per process and
    backend; each call wraps it in a fresh reward of its kind (a :class:`~steerkit.rewards.sequence.scorer.RewardModelScorer`
    for a sequence reward model). The factory's
    ``directory`` attribute is the directory (``steerkit export onnx NAME`` hashes its files).
    """
    directory = Path(directory)

    def factory(backend: str = DEFAULT_BACKEND, context: str = "continuation"):
        if not (directory / CONFIG_NAME).is_file():
            where = f"the {package} package" if package else "this plugin"
            raise PluginError(
                f"Reward {name!r}: the model files are missing from {where} ({directory} has no {CONFIG_NAME}). "
                "Train it (`steerkit train ...`), copy the reward-model directory there, and reinstall the "
                "package; or pass a reward-model directory path instead of the name."
            )
        return kind_of(directory).load_reward(directory, backend=backend, context=context, name=name, cached=True)

    factory.directory = directory
    return factory


def describe_reward_model(directory: str | os.PathLike, attribute: str) -> str:
    """A one-line description of a reward-model directory for ``register(..., description=...)``.

    Reads only its small JSON config, so registration stays cheap; ``attribute`` is used when the config does
    not state one, or when the files are missing or unreadable (the description then says so).
    """
    config = Path(directory) / CONFIG_NAME
    if not config.is_file():
        return f"{attribute} (model files missing from {directory})"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{attribute} (unreadable {config})"
    kind = find_kind(data.get("kind", DEFAULT_KIND))
    summary = f", {kind.summary}" if kind is not None and kind.summary else ""
    return (f"{data.get('attribute') or attribute} ({data.get('backbone', '?')}, {data.get('num_layers')} layers, "
            f"{data.get('method', '?')}{summary})")

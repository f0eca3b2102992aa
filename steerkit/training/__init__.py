"""Training cached reward models (``steerkit train``).

    from steerkit.training import TrainConfig, train
    result = train(TrainConfig.from_file("train.yaml"))

Modules: :mod:`.data` (readers, label transforms, mixing, split), :mod:`.loss` (the paper's cumulative
loss), :mod:`.metrics`, :mod:`.config` (TrainConfig), :mod:`.checkpoint`, :mod:`.trainer`, :mod:`.card`.
"""

from __future__ import annotations

__all__ = ["TrainConfig", "train", "TrainResult"]


def __getattr__(name):  # lazy: `steerkit --help` should not pay for importing the trainer
    if name == "TrainConfig":
        from .config import TrainConfig

        return TrainConfig
    if name in {"train", "TrainResult"}:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(name)

"""Turn a reward reference (registered name or reward-model directory) into a decoding-time reward."""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgumentError
from .model import CONFIG_NAME, RewardModel
from .scorer import RewardModelScorer

BACKENDS = ("torch", "onnx")
CONTEXTS = ("continuation", "full")


def load_reward(reference: str, *, backend: str = "torch", context: str = "continuation"):
    """A reward from a registered name (see ``steerkit plugins``) or a path to a reward-model directory."""
    if not isinstance(reference, str) or not reference.strip():
        raise InvalidArgumentError(f"A reward reference must be a registered name or a reward-model directory, "
                                   f"got {reference!r}.")
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"Unknown reward backend {backend!r}; use one of: {', '.join(BACKENDS)}.")
    if context not in CONTEXTS:
        raise InvalidArgumentError(f"Unknown reward context {context!r}; use one of: {', '.join(CONTEXTS)}.")
    path = Path(reference).expanduser()
    if path.is_dir() or (path.exists() and path.name == CONFIG_NAME) or "/" in reference or reference.startswith("."):
        directory = path.parent if path.name == CONFIG_NAME else path
        if backend == "onnx":  # an ONNX export dir, or a reward dir exported into the cache on first use
            from .onnx_backend import OnnxRewardModel

            model = OnnxRewardModel.load(directory)
            return RewardModelScorer(model, name=model.config.name, backend=backend, context=context)
        if (directory / "steerkit_onnx.json").is_file():
            from ..errors import ExportError

            raise ExportError(f"{directory} is an ONNX export: use backend 'onnx' (--backend onnx), or pass "
                              "the reward-model directory it was exported from for backend 'torch'.")
        model = RewardModel.from_pretrained(directory)
        return RewardModelScorer(model, name=model.config.name, backend=backend, context=context)
    from ..registry import get_reward

    return get_reward(reference, backend=backend, context=context)

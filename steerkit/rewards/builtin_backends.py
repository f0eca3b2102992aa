"""steerkit's reward backends, ``torch`` and ``onnx``, registered through the public
``register_reward_backends`` hook.

This module is listed in :data:`steerkit.registry.BUILTIN_PLUGINS`, so it registers exactly as an installed
plugin package would. The backends import their runtimes only when used, so registering stays free.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import hookimpl
from .backends import RewardBackend


class TorchBackend(RewardBackend):
    """The reward model's own PyTorch weights, on any device torch runs on."""

    name = "torch"

    def load(self, directory: Path):
        from .model import RewardModel

        return _from_pretrained(RewardModel, directory)

    def load_token(self, directory: Path):
        from .token.model import TokenRewardModel

        return _from_pretrained(TokenRewardModel, directory)

    def new_cache(self, model, input_ids, attention_mask):
        from .sequence.torch_cache import TorchScoringCache

        return TorchScoringCache(model, input_ids, attention_mask)

    def to_device(self, model, device: str) -> None:
        if hasattr(model, "to"):
            model.to(device)


class OnnxBackend(RewardBackend):
    """onnxruntime on a verified ONNX export; a reward-model directory is exported into the cache on first use.

    The model stays where onnxruntime's execution providers put it (``$STEERKIT_ONNX_PROVIDERS``).
    """

    name = "onnx"

    def recognizes(self, directory: Path) -> bool:
        """An ONNX export (its manifest): what the default backend ``"auto"`` runs here."""
        from .onnx.manifest import is_export_dir

        return is_export_dir(directory)

    def load(self, directory: Path):
        from .onnx.backend import OnnxRewardModel

        return OnnxRewardModel.load(directory)

    def new_cache(self, model, input_ids, attention_mask):
        from .onnx.backend import OnnxScoringCache

        return OnnxScoringCache.for_model(model, input_ids, attention_mask)

    def load_token(self, directory: Path):
        from .onnx.token import OnnxTokenModel

        return OnnxTokenModel.load(directory)


def _from_pretrained(model_class, directory: Path):
    """``model_class.from_pretrained(directory)``, refusing an ONNX export with the backend to use instead."""
    from ..errors import ExportError
    from .onnx.manifest import is_export_dir

    if is_export_dir(directory):
        raise ExportError(f"{directory} is an ONNX export: use backend 'onnx' (--backend onnx, or no --backend: "
                          "'auto' runs an export on onnx), or pass the reward-model directory it was exported from "
                          "for backend 'torch'.")
    return model_class.from_pretrained(directory)


@hookimpl
def register_reward_backends(register):
    register("torch", TorchBackend, description="PyTorch: the reward model's own weights (cpu, cuda, mps)")
    register("onnx", OnnxBackend, description="onnxruntime: a verified ONNX export, made and cached on first use")

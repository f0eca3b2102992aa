"""The ``llama.cpp`` reward backend, registered through the public ``register_reward_backends`` hook (this module
is listed in :data:`steerkit.registry.BUILTIN_PLUGINS`, after the built-in torch and onnx backends).

``llama.cpp`` runs the backbone with float32 weights (rewards equal torch's to ~1e-6), ``llama.cpp-q8`` with Q8_0
weights (faster; rewards within ~1e-2). Both import llama-cpp-python only when used.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import InvalidArgumentError
from ...registry import hookimpl
from ..backends import RewardBackend


class LlamaCppBackend(RewardBackend):
    """A reward model's backbone in llama.cpp (GGUF written and cached on first use), heads in torch."""

    name = "llama.cpp"
    precision = "f32"

    def load(self, directory: Path):
        from .model import LlamaCppRewardModel

        return LlamaCppRewardModel.load(directory, precision=self.precision)

    def load_token(self, directory: Path):
        from .token import LlamaCppTokenModel

        return LlamaCppTokenModel.load(directory, precision=self.precision)

    def new_cache(self, model, input_ids, attention_mask):
        from .model import LlamaCppRewardModel, LlamaCppScoringCache

        if not isinstance(model, LlamaCppRewardModel):
            from .model import as_llama_cpp

            model = as_llama_cpp(model, LlamaCppRewardModel)
            if model.precision != self.precision:  # an in-memory torch model: exported at this backend's precision
                model = LlamaCppRewardModel(model.torch_model, model.reward_hash, self.precision)
        return LlamaCppScoringCache(model, input_ids, attention_mask)

    def to_device(self, model, device: str) -> None:
        import torch

        if torch.device(device).type != "cpu":
            raise InvalidArgumentError(f"backend 'llama.cpp' runs reward models on the CPU; device={device!r} is not "
                                       "supported (use backend 'torch' or 'onnx' on a GPU).")


class LlamaCppQ8Backend(LlamaCppBackend):
    name = "llama.cpp-q8"
    precision = "q8_0"


@hookimpl
def register_reward_backends(register):
    register("llama.cpp", LlamaCppBackend,
             description="llama.cpp: the backbone as a float32 GGUF (made and cached on first use), heads in torch")
    register("llama.cpp-q8", LlamaCppQ8Backend,
             description="llama.cpp with Q8_0 backbone weights (faster, rewards within ~1e-2 of torch)")

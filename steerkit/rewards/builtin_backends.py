"""steerkit's reward backends, registered through the public ``register_reward_backends`` hook: ``torch`` and
``onnx`` (fp32), and their reduced-precision variants ``torch-bf16``, ``torch-bf16-compute``, ``torch-int8`` and
``onnx-int8``
(:mod:`.precision`).

This module is listed in :data:`steerkit.registry.BUILTIN_PLUGINS`, so it registers exactly as an installed
plugin package would. The backends import their runtimes only when used, so registering stays free.
"""

from __future__ import annotations

import json
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

    def runs(self, model):
        """The torch model this backend's sessions run for ``model``: ``model`` itself."""
        return model

    def new_cache(self, model, input_ids, attention_mask):
        from .sequence.torch_cache import TorchScoringCache

        return TorchScoringCache(self.runs(model), input_ids, attention_mask)

    def to_device(self, model, device: str) -> None:
        if hasattr(model, "to"):
            model.to(device)


def torch_backend(name: str) -> TorchBackend | None:
    """The backend registered as ``name`` where it runs torch weights (``torch`` and its reduced-precision variants:
    :meth:`TorchBackend.runs` gives the model it runs), else None."""
    from .backends import get_backend

    backend = get_backend(name)
    return backend if isinstance(backend, TorchBackend) else None


class OnnxBackend(RewardBackend):
    """onnxruntime on a verified ONNX export; a reward-model directory is exported into the cache on first use.

    The model stays where onnxruntime's execution providers put it (``$STEERKIT_ONNX_PROVIDERS``).
    """

    name = "onnx"

    #: the precision of the exports it runs (:mod:`.onnx.quantize`); an export of another precision runs as it is
    precision = "fp32"

    def recognizes(self, directory: Path) -> bool:
        """An ONNX export (its manifest) of this backend's precision: what the default backend ``"auto"`` runs
        here."""
        from .onnx.manifest import MANIFEST_NAME, is_export_dir

        if not is_export_dir(directory):
            return False
        try:
            manifest = json.loads((Path(directory) / MANIFEST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # an unreadable manifest: loading it says what is wrong
            return self.precision == "fp32"
        return isinstance(manifest, dict) and manifest.get("precision", "fp32") == self.precision

    def load(self, directory: Path):
        from .onnx.backend import OnnxRewardModel

        return OnnxRewardModel.load(directory, precision=self.precision)

    def new_cache(self, model, input_ids, attention_mask):
        from .onnx.backend import OnnxScoringCache

        return OnnxScoringCache.for_model(model, input_ids, attention_mask, precision=self.precision)

    def load_token(self, directory: Path):
        from .onnx.token import OnnxTokenModel

        return OnnxTokenModel.load(directory, precision=self.precision)


class TorchReducedBackend(TorchBackend):
    """The torch backend with the backbone's linear layers converted to :attr:`precision`
    (:func:`~steerkit.rewards.precision.reduced_weights`) at load; an in-memory model handed in is converted as a
    copy, once (:func:`~steerkit.rewards.precision.as_reduced`)."""

    #: :data:`~steerkit.rewards.precision.BF16`, :data:`~steerkit.rewards.precision.BF16_COMPUTE` or
    #: :data:`~steerkit.rewards.precision.INT8`
    precision: str

    def load(self, directory: Path):
        from .precision import reduced_weights

        return reduced_weights(super().load(directory), self.precision)

    def load_token(self, directory: Path):
        from .precision import reduced_weights

        return reduced_weights(super().load_token(directory), self.precision)

    def runs(self, model):
        """``model`` converted to :attr:`precision` (itself when loaded by this backend, else a copy made once)."""
        from .precision import as_reduced

        return as_reduced(model, self.precision)


class TorchBf16Backend(TorchReducedBackend):
    """The backbone's linear weights stored in bfloat16 and upcast to float32 for each matmul: half the memory of
    those weights, float32 compute."""

    name = "torch-bf16"
    precision = "bf16"


class TorchBf16ComputeBackend(TorchReducedBackend):
    """The backbone's linear weights in bfloat16 and each matmul run in bfloat16 (input rounded to bf16, output back
    to float32): 3-5x the fp32 matmul speed at 16 or more rows where the hardware multiplies bf16 natively
    (AVX512_BF16 or AMX CPUs, CUDA); where it does not, the same products run through fp32's kernels, no faster than
    fp32 (:mod:`steerkit.linear_precision`)."""

    name = "torch-bf16-compute"
    precision = "bf16-compute"


class TorchInt8Backend(TorchReducedBackend):
    """The backbone's linear weights in int8 (a scale per output channel) and each matmul run in int8, its input
    quantized per row on the fly (``torch._int_mm``, int32 accumulation). CPU only; on a CPU without int8 instructions
    (VNNI, AVX512BW, AMX) the same int32 sums through fp32's kernels, no faster than fp32."""

    name = "torch-int8"
    precision = "int8"

    def to_device(self, model, device: str) -> None:
        if str(device) != "cpu":
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(f"backend 'torch-int8' runs on the CPU only, not on device {device!r}; use "
                                       "'torch-bf16-compute' (or 'torch') on a GPU.")
        super().to_device(model, device)


class OnnxInt8Backend(OnnxBackend):
    """The onnx backend on an int8 export: the backbone's matmul weights in 8 bits, computed in int8 by
    onnxruntime's MatMulNBits (:mod:`steerkit.rewards.onnx.quantize`); made from the fp32 export and cached on first
    use. Needs onnxruntime >= 1.22."""

    name = "onnx-int8"
    precision = "int8"


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
    register("torch-bf16", TorchBf16Backend,
             description="PyTorch, backbone weights stored in bf16 and upcast to fp32 per matmul (half the memory)")
    register("torch-bf16-compute", TorchBf16ComputeBackend,
             description="PyTorch, backbone weights in bf16 and matmuls in bf16 (fast on CPUs with AVX512_BF16 or "
                         "AMX, and on CUDA)")
    register("torch-int8", TorchInt8Backend,
             description="PyTorch on the CPU, backbone weights in int8 and matmuls in int8 (inputs quantized per row; "
                         "fast on CPUs with AVX512_VNNI)")
    register("onnx-int8", OnnxInt8Backend,
             description="onnxruntime: the ONNX export with 8-bit backbone weights and int8 matmuls "
                         "(onnxruntime>=1.22)")

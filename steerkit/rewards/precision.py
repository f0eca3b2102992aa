"""Reduced-precision reward models: what the ``torch-bf16``, ``torch-bf16-compute``, ``torch-int8`` and ``onnx-int8``
backends run (the torch ones on the linear layers of :mod:`steerkit.linear_precision`, which the LM's
``dtype="bfloat16"`` uses too).

A precision is chosen by naming a backend (:mod:`steerkit.rewards.builtin_backends`), so it reaches every place a
backend name does (``load_reward``, ``generate``, config files, ``--backend``, the server):

========== ============ =====================================================================================
backend    precision    what runs
========== ============ =====================================================================================
torch      fp32         the reward model's own weights (the default where ``auto`` picks torch)
onnx       fp32         a verified ONNX export in onnxruntime
torch-bf16 bf16 storage the backbone's linear weights stored in bfloat16 (half their memory), each upcast to the
                        activations' float32 for its matmul (:func:`reduced_weights`, here)
torch-bf16 bf16 matmuls the same weights, and each matmul's input rounded to bfloat16: the product runs in bf16
-compute                (fp32 accumulation) and is returned as float32. Fast only where the hardware multiplies
                        bf16 natively (a CPU with AVX512_BF16 or AMX, a CUDA GPU); elsewhere run through
                        fp32's kernels (the same result, no faster than fp32)
torch-int8 int8 matmuls the backbone's linear weights in int8 (a scale per output channel), each matmul's input
                        quantized per row on the fly and the product accumulated in int32 (``torch._int_mm``).
                        CPU only; fastest at the 16-row, k = 20 batches of a busy server on a CPU with AVX512_VNNI;
                        without int8 instructions (VNNI, AVX512BW, AMX) the same int32 sums through fp32's kernels
onnx-int8  int8         the ONNX export with the backbone's matmul weights in 8 bits, computed in int8 by
                        onnxruntime's MatMulNBits (:mod:`steerkit.rewards.onnx.quantize`)
========== ============ =====================================================================================

What each costs and gains on the shipped models (speed per decoding step, max |Δρ| against fp32 on real text) is
measured by ``benchmarks/bench_reward_precision.py`` and tabulated in docs/backends.md ("Reduced precision").
"""

from __future__ import annotations

import copy

from torch import nn

from ..linear_precision import (BF16, BF16_COMPUTE, INT8, Bf16Linear, Bf16MatmulLinear,  # noqa: F401 (re-exported)
                                Int8MatmulLinear, convert_linears)
from ..errors import RewardModelFormatError
from ..model_copies import converted_copy

#: the attribute that marks a model whose weights :func:`reduced_weights` converted
MARK = "_steerkit_precision"


def reduced_weights(model: nn.Module, precision: str = BF16) -> nn.Module:
    """Convert ``model.backbone``'s linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) to ``precision``, in place
    (:func:`convert_linears`): ``BF16`` (backend ``torch-bf16``) stores each weight in bfloat16 and upcasts it to the
    activations' float32 for its matmul; ``BF16_COMPUTE`` (``torch-bf16-compute``) runs each matmul in bfloat16;
    ``INT8`` (``torch-int8``) stores each weight in int8 and runs each matmul in int8. Biases, norms, the token
    embeddings and the reward (or token) head stay float32, and so do activations and the KV cache.

    Returns ``model``, marked as converted (a second call changes nothing). A backbone without such layers raises
    :class:`~steerkit.errors.RewardModelFormatError`."""
    backend = BACKEND_OF[precision]
    marked = getattr(model, MARK, None)
    if marked == precision:
        return model
    if marked is not None:
        raise RewardModelFormatError(f"backend {backend!r} was given a reward model already converted for "
                                     f"{BACKEND_OF.get(marked, marked)!r}; load it again from its directory.")
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise RewardModelFormatError(f"backend {backend!r} needs a steerkit reward model (with a backbone), got "
                                     f"{type(model).__name__}.")
    if not convert_linears(backbone, precision):
        raise RewardModelFormatError(f"backend {backend!r} found no linear layer in the backbone of "
                                     f"{model.config.name!r} to convert; use backend 'torch'.")
    setattr(model, MARK, precision)
    return model


#: the backend that runs each precision of the torch weights
BACKEND_OF = {BF16: "torch-bf16", BF16_COMPUTE: "torch-bf16-compute", INT8: "torch-int8"}


def as_reduced(model: nn.Module, precision: str = BF16) -> nn.Module:
    """``model`` itself when its weights are already converted for ``precision`` (what the ``torch-bf16``,
    ``torch-bf16-compute`` and ``torch-int8`` backends load), else a converted copy of it, made once per model object
    and precision (the model handed in keeps its float32 weights; changes to them afterwards are not seen by the
    copy)."""
    if getattr(model, MARK, None) == precision:
        return model
    return converted_copy(model, precision, lambda m: reduced_weights(copy.deepcopy(m), precision))

"""The LM's reduced-precision copies: weight-only int8 (``dtype="int8"``) and bfloat16 matmuls
(``dtype="bfloat16"``), for ``steerkit generate/serve --dtype`` (issue 25).

**bfloat16** (:func:`as_bf16_lm`): every ``nn.Linear`` of the LM (projections, MLP, output head) stores its weight in
bf16 and multiplies in bf16 (the input rounded to bf16, fp32 accumulation, the output returned as float32), the
layer :class:`steerkit.linear_precision.Bf16MatmulLinear` that the ``torch-bf16-compute`` reward backend uses.
Embeddings, norms, attention, the KV cache and the logits stay float32. On a CPU with AVX512_BF16 (or AMX) and on
CUDA the products run 2-4x faster than float32 at 16 rows; on a CPU without them, slower. Greedy tokens can differ
from float32's where two candidates are close: docs/performance.md ("bf16 matmuls") has the agreement measured.

**int8**:
Every ``nn.Linear`` of the LM (the attention and MLP projections and the output head) stores its weight as int8
with one float32 scale per output row (symmetric, max-abs / 127); activations, norms, embeddings and the KV cache
stay float32, and each matmul runs on the weight dequantized to float32. Eagerly that dequantization is one more
pass over every weight per step (slower than float32); compiled (``compile=True``, :mod:`steerkit.engine.static_lm`)
it is fused into the product, which then reads a quarter of the bytes. Speed and agreement with float32 are in
docs/performance.md ("CPU decoding").

The int8 model is a copy, made once per LM object (:func:`as_int8`); the float32 LM is left as it was.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ModelFormatError
from ..linear_precision import int8_weight
from ..model_copies import converted_copy


class Int8Linear(nn.Module):
    """A linear layer whose weight is int8 with a float32 scale per output row (:func:`int8_weight`, the
    quantization the ``torch-int8`` reward backend's layers use)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        qweight, scale = int8_weight(linear.weight, 1)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def int8_weights(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by an :class:`Int8Linear`, in place; returns ``model``."""
    targets = [(name, module) for name, module in model.named_modules() if type(module) is nn.Linear]
    if not targets:
        raise ModelFormatError(f"dtype='int8' found no linear layer in {type(model).__name__} to quantize; "
                               "run it with dtype='float32'.")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear(module))
    return model


def as_bf16_lm(model: nn.Module) -> nn.Module:
    """A copy of the LM ``model`` with every ``nn.Linear`` in bf16 with bf16 matmuls, made once per model object."""
    from ..linear_precision import BF16_COMPUTE, convert_linears

    def convert(original):
        lm = copy.deepcopy(original)
        if not convert_linears(lm, BF16_COMPUTE):
            raise ModelFormatError(f"dtype='bfloat16' found no linear layer in {type(original).__name__}; run it "
                                   "with dtype='float32'.")
        return lm.eval()

    return converted_copy(model, "lm-bf16", convert)


def as_int8(model: nn.Module) -> nn.Module:
    """An int8 copy of the LM ``model`` (:func:`int8_weights`), made once per model object."""
    return converted_copy(model, "lm-int8", lambda m: int8_weights(copy.deepcopy(m)).eval())

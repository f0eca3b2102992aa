"""Weight-only int8 for the LM (``dtype="int8"``, ``steerkit generate/serve --dtype int8``; issue 25).

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
from ..model_copies import converted_copy

class Int8Linear(nn.Module):
    """A linear layer whose weight is int8 with a float32 scale per output row."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        self.register_buffer("qweight", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
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


def as_int8(model: nn.Module) -> nn.Module:
    """An int8 copy of the LM ``model`` (:func:`int8_weights`), made once per model object."""
    return converted_copy(model, "lm-int8", lambda m: int8_weights(copy.deepcopy(m)).eval())

"""Reduced-precision reward models: what the ``torch-bf16`` and ``onnx-int8`` backends run.

A precision is chosen by naming a backend (:mod:`steerkit.rewards.builtin_backends`), so it reaches every place a
backend name does (``load_reward``, ``generate``, config files, ``--backend``, the server):

========== ============ =====================================================================================
backend    precision    what runs
========== ============ =====================================================================================
torch      fp32         the reward model's own weights (the default where ``auto`` picks torch)
onnx       fp32         a verified ONNX export in onnxruntime
torch-bf16 bf16 storage the backbone's linear weights stored in bfloat16 (half their memory), each upcast to the
                        activations' float32 for its matmul (:func:`bf16_weights`, here)
onnx-int8  int8         the ONNX export with the backbone's matmul weights in 8 bits, computed in int8 by
                        onnxruntime's MatMulNBits (:mod:`steerkit.rewards.onnx.quantize`)
========== ============ =====================================================================================

What each costs and gains on the shipped models (speed per decoding step, max |Δρ| against fp32 on real text) is
measured by ``benchmarks/bench_reward_precision.py`` and tabulated in docs/backends.md ("Reduced precision").
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import RewardModelFormatError
from ..model_copies import converted_copy

BF16 = "bf16"
#: the attribute that marks a model whose weights :func:`bf16_weights` converted
MARK = "_steerkit_precision"


class Bf16Linear(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in bfloat16 and upcast to the input's dtype for each matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # a transformers without GPT-2's Conv1D: nothing to convert
        return None

    class Bf16Conv1D(Conv1D):
        """GPT-2's ``Conv1D`` (``x @ W + b``, W [in, out]) with W stored in bfloat16, upcast for each matmul."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            size_out = x.size()[:-1] + (self.nf,)
            x = torch.addmm(self.bias.to(x.dtype), x.view(-1, x.size(-1)), self.weight.to(x.dtype))
            return x.view(size_out)

    return Conv1D, Bf16Conv1D


def bf16_weights(model: nn.Module) -> nn.Module:
    """Store the weights of ``model.backbone``'s linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) in bfloat16,
    in place, and have each upcast its weight to the activations' dtype (float32) for its matmul. Biases, norms,
    the token embeddings and the reward (or token) head stay float32, and so do activations and the KV cache.

    Returns ``model``, marked as converted (a second call changes nothing). A backbone without such layers raises
    :class:`~steerkit.errors.RewardModelFormatError`."""
    if getattr(model, MARK, None) == BF16:
        return model
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise RewardModelFormatError(f"backend 'torch-bf16' needs a steerkit reward model (with a backbone), got "
                                     f"{type(model).__name__}.")
    conv = _conv1d_class()
    converted = 0
    for module in backbone.modules():
        if type(module) is nn.Linear:
            module.__class__ = Bf16Linear
        elif conv is not None and type(module) is conv[0]:
            module.__class__ = conv[1]
        else:
            continue
        module.weight = nn.Parameter(module.weight.detach().to(torch.bfloat16), requires_grad=False)
        converted += 1
    if not converted:
        raise RewardModelFormatError(f"backend 'torch-bf16' found no linear layer in the backbone of "
                                     f"{model.config.name!r} to store in bfloat16; use backend 'torch'.")
    setattr(model, MARK, BF16)
    return model


def as_bf16(model: nn.Module) -> nn.Module:
    """``model`` itself when its weights are already bf16 (what the ``torch-bf16`` backend loads), else a bf16 copy
    of it, made once per model object (the model handed in keeps its float32 weights; changes to them afterwards
    are not seen by the copy)."""
    if getattr(model, MARK, None) == BF16:
        return model
    return converted_copy(model, BF16, lambda m: bf16_weights(copy.deepcopy(m)))

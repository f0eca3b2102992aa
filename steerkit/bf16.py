"""bfloat16 linear layers, shared by the LM's ``dtype="bfloat16"`` (:mod:`steerkit.engine.lm_int8`) and the reward
backends ``torch-bf16`` and ``torch-bf16-compute`` (:mod:`steerkit.rewards.precision`).

Two precisions, both storing the weight in bfloat16 (half the memory) with biases in float32:

* :data:`BF16`: each weight is upcast to the activations' float32 for its matmul (float32 compute);
* :data:`BF16_COMPUTE`: each matmul runs in bfloat16 (its input rounded to bf16, float32 accumulation, the output
  rounded to bf16 and returned as float32). Fast only where the hardware multiplies bf16 natively: a CPU with
  AVX512_BF16 or AMX (3-5x float32's products at 16 or more rows on the CPU it was measured on), a CUDA GPU;
  elsewhere slower than float32.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

BF16 = "bf16"
BF16_COMPUTE = "bf16-compute"


class Bf16Linear(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in bfloat16 and upcast to the input's dtype for each matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


class Bf16MatmulLinear(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in bfloat16 and whose product runs in bfloat16: the input is rounded
    to bf16, the output is returned in the input's dtype, and the bias (kept float32) is added in that dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # as a 2-D product: a strided 3-D bf16 input (transformers' logits_to_keep slice) would send F.linear down
        # a batched path that copies the whole weight per call (38 ms for SmolLM2's output head)
        y = F.linear(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), self.weight).to(x.dtype)
        y = y.view(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias.to(x.dtype)


@functools.cache
def _conv1d_classes():
    """GPT-2's ``Conv1D`` and its two bf16 forms (storage only, bf16 matmul), or None where transformers lacks it;
    made once per process, so every converted model's layers share one class each."""
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

    class Bf16MatmulConv1D(Conv1D):
        """GPT-2's ``Conv1D`` with W stored in bfloat16 and the product run in bfloat16 (bias added in float32)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            size_out = x.size()[:-1] + (self.nf,)
            y = torch.mm(x.reshape(-1, x.size(-1)).to(torch.bfloat16), self.weight).to(x.dtype) + self.bias.to(x.dtype)
            return y.view(size_out)

    return Conv1D, {BF16: Bf16Conv1D, BF16_COMPUTE: Bf16MatmulConv1D}


_LINEAR = {BF16: Bf16Linear, BF16_COMPUTE: Bf16MatmulLinear}


def bf16_linears(root: nn.Module, precision: str = BF16) -> int:
    """Store the weights of every linear layer under ``root`` (``nn.Linear`` and GPT-2's ``Conv1D``) in bfloat16,
    in place: ``precision=BF16`` upcasts each weight for its matmul, ``BF16_COMPUTE`` runs the matmul in bfloat16.
    Biases stay float32. Returns how many layers were converted. A weight shared with another module (tied
    embeddings) is not changed for that module: the layer gets its own bf16 copy."""
    conv = _conv1d_classes()
    converted = 0
    for module in root.modules():
        if type(module) is nn.Linear:
            module.__class__ = _LINEAR[precision]
        elif conv is not None and type(module) is conv[0]:
            module.__class__ = conv[1][precision]
        else:
            continue
        module.weight = nn.Parameter(module.weight.detach().to(torch.bfloat16), requires_grad=False)
        converted += 1
    return converted

"""Reduced-precision linear layers, shared by the LM's ``dtype="bfloat16"`` (:mod:`steerkit.engine.lm_int8`) and the
reward backends ``torch-bf16``, ``torch-bf16-compute`` and ``torch-int8`` (:mod:`steerkit.rewards.precision`).

Three precisions; biases stay float32 in all of them:

* :data:`BF16`: each weight is stored in bfloat16 (half the memory) and upcast to the activations' float32 for its
  matmul (float32 compute);
* :data:`BF16_COMPUTE`: the weight in bfloat16 and each matmul run in bfloat16 (its input rounded to bf16, float32
  accumulation, the output rounded to bf16 and returned as float32). Fast only where the hardware multiplies bf16
  natively: a CPU with AVX512_BF16 or AMX (3-5x float32's products at 16 or more rows on the CPU it was measured
  on), a CUDA GPU; elsewhere slower than float32;
* :data:`INT8`: the weight in int8 with a float32 scale per output channel (symmetric, max-abs / 127), and each
  matmul run in int8: every input row is quantized on the fly with its own scale (symmetric, max-abs / 127), the
  product is accumulated exactly in int32 (``torch._int_mm``) and rescaled to float32. On the CPU only; about 1.5x
  bf16's products at 320 rows on a CPU with AVX512_VNNI, about 2x float32's where torch is held to AVX2
  (docs/backends.md, "int8 matmuls").

**A CPU without the instructions** (AVX2 only: no AVX512BW/VL/DQ, AVX-NE-CONVERT or AMX for bf16; no VNNI,
AVX512BW or AMX for int8). There oneDNN has no bf16 or int8 kernel and torch multiplies element by element: on an
AVX2-only EPYC a [320 x 576] x [576 x 1536] product took 73 ms in bf16 and 282 ms in int8 against 11 ms in float32
(``benchmarks/bench_products.py``). So there the same products are computed through float32's kernels, with the same
result:

* bf16: the bf16 input and weight are exact in float32, the sum is accumulated in float32 and the output rounded to
  bf16, as in oneDNN's bf16 product (the order of the sums may differ);
* int8: every product of two int8 values and every partial sum of up to 1,024 of them is an integer below 2**24,
  which float32 holds exactly, so the int32 result is bitwise ``torch._int_mm``'s (longer sums are added in int32).

Neither is faster than float32 there: the reduced precisions pay only on a CPU that multiplies them natively.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn
from torch.nn import functional as F

BF16 = "bf16"
BF16_COMPUTE = "bf16-compute"
INT8 = "int8"

_TINY = torch.finfo(torch.float32).tiny


class Bf16Linear(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in bfloat16 and upcast to the input's dtype for each matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


#: each reduced-precision layer's weight in the form its CPU product reads, made on its first product (oneDNN's packed
#: bf16 layout, or a float32 copy where this CPU has no bf16 or int8 kernels): ``{layer: (the weight tensor it was made
#: from, that weight's version, the form, or None where torch lacks oneDNN's packing op)}``. Kept beside the layer, not
#: in it, so that copying, pickling or saving a layer never meets oneDNN's opaque tensor.
_PACKED: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _product_weight(layer: nn.Module, make):
    """``make()``, the form of ``layer.weight`` that its product reads, made once and again only when the weight changes
    (another tensor, or an in-place write): the per-token product never converts a weight twice."""
    weight = layer.weight
    cached = _PACKED.get(layer)
    if cached is None or cached[0] is not weight or cached[1] != weight._version:
        cached = _PACKED[layer] = (weight, weight._version, make())
    return cached[2]


def _packed_or_float32(plain: torch.Tensor) -> torch.Tensor | None:
    try:  # 16: a row-count hint only; any number of rows multiplies
        return torch.ops.mkldnn._reorder_linear_weight(plain, 16)
    except RuntimeError:  # this CPU's oneDNN has no bf16 product (AVX2 only): float32's kernels, same sums
        return plain.float()
    except AttributeError:  # a torch without the op
        return None


def packed_bf16_product(layer: nn.Module, x: torch.Tensor, transposed: bool = False) -> torch.Tensor | None:
    """``x`` [M, K] (bfloat16) times ``layer.weight`` (bfloat16; [N, K], or [K, N] where ``transposed``: GPT-2's
    ``Conv1D``) as [M, N] bfloat16, through a copy of the weight packed once in oneDNN's blocked layout; on a CPU whose
    oneDNN lacks bf16 products (AVX512_BF16, AVX512BW or AVX-NE-CONVERT), through a float32 copy of the weight made
    once (module docstring). None where neither applies (not on the CPU, under ``torch.compile``, with autograd
    recording, a torch without oneDNN's packing op), and the caller multiplies as before.

    ``F.linear`` hands oneDNN the plain weight and it is reordered on every call: on the CPU this was measured on
    (AVX512_BF16), SmolLM2's bf16 decode step took 1.37x as long at 16 rows and 1.41x at one row (medians), with
    bitwise the same logits (docs/performance.md, "Packed bf16 weights"). The packed copy is a second copy of the
    layer's weight; it is made again when the weight changes (another tensor, or an in-place write)."""
    weight = layer.weight
    if x.device.type != "cpu" or torch.compiler.is_compiling() or (
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return None
    packed = _product_weight(layer, lambda: _packed_or_float32((weight.t() if transposed else weight).contiguous()))
    if packed is None:
        return None
    if packed.dtype == torch.float32:
        return F.linear(x.float(), packed).to(torch.bfloat16)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


class Bf16MatmulLinear(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in bfloat16 and whose product runs in bfloat16: the input is rounded
    to bf16, the output is returned in the input's dtype, and the bias (kept float32) is added in that dtype. On a
    CPU the product uses a packed copy of the weight (:func:`packed_bf16_product`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # as a 2-D product: a strided 3-D bf16 input (transformers' logits_to_keep slice) would send F.linear down
        # a batched path that copies the whole weight per call (38 ms for SmolLM2's output head)
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = packed_bf16_product(self, x2)
        y = (F.linear(x2, self.weight) if y is None else y).to(x.dtype)
        y = y.view(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias.to(x.dtype)


class Int8MatmulLinear(nn.Linear):
    """An ``nn.Linear`` whose weight is int8 (``weight_scale``: float32, one per output row) and whose product runs in
    int8 (:func:`int8_product`); the output is returned in the input's dtype with the float32 bias added."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = int8_product(x.reshape(-1, x.shape[-1]), self.weight.t(), self.weight_scale, self).to(x.dtype)
        y = y.view(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias.to(x.dtype)


def int8_product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 layer: nn.Module | None = None) -> torch.Tensor:
    """``x`` [M, K] (float) times the int8 ``weight`` [K, N], whose column ``n`` stands for ``weight[:, n] *
    weight_scale[n]``: each row of ``x`` is quantized to int8 with its own max-abs scale, the product is accumulated
    in int32 and rescaled. float32 [M, N]. On a CPU without int8 kernels the product runs through float32's
    (:func:`int8_mm_through_float32`), on a float32 copy of ``weight`` kept for ``layer`` (the layer that owns it)."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True).clamp_(min=_TINY).div_(127.0)
    quantized = torch.round(x / scale).to(torch.int8)
    if cpu_multiplies_int8():
        product = torch._int_mm(quantized, weight)
    else:
        keep = layer is not None and not torch.compiler.is_compiling()  # a traced graph keeps no copy beside it
        product = int8_mm_through_float32(quantized, _product_weight(layer, weight.float) if keep else weight)
    return product.to(torch.float32).mul_(scale).mul_(weight_scale)


#: the longest sum of int8 products that float32 holds exactly: 128 * 128 * 1024 = 2**24
_EXACT_FLOAT32_TERMS = 1024


def int8_mm_through_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(a, b)`` (int8 [M, K] x int8 [K, N], int32 [M, N]) bitwise, computed with float32 products:
    each block of at most 1,024 terms is exact in float32; the blocks are added in int32. ``b`` may already be the
    float32 copy of the int8 weight. For a CPU without int8 kernels (:func:`cpu_multiplies_int8`), where
    ``torch._int_mm`` takes 18-33x float32's time."""
    if torch.get_float32_matmul_precision() != "highest":  # float32 products may run in bf16 or tf32: not exact
        return torch.mm(a.double(), b.double()).to(torch.int32)
    out = None
    for start in range(0, a.shape[1], _EXACT_FLOAT32_TERMS):
        end = start + _EXACT_FLOAT32_TERMS
        block = torch.mm(a[:, start:end].float(), b[start:end].float()).to(torch.int32)
        out = block if out is None else out.add_(block)
    return out


_INT8_INSTRUCTIONS = any(torch.cpu.get_capabilities().get(name, False)
                         for name in ("avx512_vnni", "avx_vnni", "amx_int8", "avx512_bw"))


def cpu_multiplies_int8() -> bool:
    """Whether this CPU has int8 dot-product instructions that oneDNN's int8 kernels use (VNNI, AVX512BW, AMX):
    without them ``torch._int_mm`` is scalar code (:func:`int8_mm_through_float32` instead). Read once at import, a
    plain constant, so that a compiled step traces it without a cache wrapper (dynamo warns about those)."""
    return _INT8_INSTRUCTIONS


def int8_weight(weight: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` as int8 with a float32 max-abs scale (/ 127, symmetric) per slice along ``dim``, the input
    dimension: ``(int8 weight, scale)``. Also the LM's weight-only ``dtype="int8"`` (:mod:`steerkit.engine.lm_int8`)."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim).clamp_(min=_TINY).div_(127.0)
    return torch.round(weight / scale.unsqueeze(dim)).clamp_(-127, 127).to(torch.int8), scale


@functools.cache
def _conv1d_classes():
    """GPT-2's ``Conv1D`` and its forms per precision (bf16 storage, bf16 matmul, int8 matmul), or None where
    transformers lacks it; made once per process, so every converted model's layers share one class each."""
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
            x2 = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
            y = packed_bf16_product(self, x2, transposed=True)
            y = torch.mm(x2, self.weight) if y is None else y
            return (y.to(x.dtype) + self.bias.to(x.dtype)).view(size_out)

    class Int8MatmulConv1D(Conv1D):
        """GPT-2's ``Conv1D`` with W in int8 (a scale per output column) and the product run in int8."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = int8_product(x.reshape(-1, x.size(-1)), self.weight, self.weight_scale, self).to(x.dtype)
            return (y + self.bias.to(x.dtype)).view(x.size()[:-1] + (self.nf,))

    return Conv1D, {BF16: Bf16Conv1D, BF16_COMPUTE: Bf16MatmulConv1D, INT8: Int8MatmulConv1D}


_LINEAR = {BF16: Bf16Linear, BF16_COMPUTE: Bf16MatmulLinear, INT8: Int8MatmulLinear}


def convert_linears(root: nn.Module, precision: str = BF16) -> int:
    """Convert every linear layer under ``root`` (``nn.Linear`` and GPT-2's ``Conv1D``) to ``precision``, in place:
    :data:`BF16` stores each weight in bfloat16 and upcasts it for its matmul, :data:`BF16_COMPUTE` runs the matmul in
    bfloat16, :data:`INT8` stores the weight in int8 and runs the matmul in int8. Biases stay float32. Returns how
    many layers were converted. A weight shared with another module (tied embeddings) is not changed for that
    module: the layer gets its own copy."""
    conv = _conv1d_classes()
    converted = 0
    for module in root.modules():
        if type(module) is nn.Linear:
            module.__class__, in_dim = _LINEAR[precision], 1  # weight [out, in]
        elif conv is not None and type(module) is conv[0]:
            module.__class__, in_dim = conv[1][precision], 0  # weight [in, out]
        else:
            continue
        if precision == INT8:
            weight, scale = int8_weight(module.weight, in_dim)
            module.weight = nn.Parameter(weight, requires_grad=False)
            module.register_buffer("weight_scale", scale)
        else:
            module.weight = nn.Parameter(module.weight.detach().to(torch.bfloat16), requires_grad=False)
        converted += 1
    return converted

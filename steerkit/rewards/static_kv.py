"""A torch reward model's KV on preallocated tensors: what the compiled engine's reward sessions keep their cached
text in (``compile=True``, issue 25): :class:`~steerkit.rewards.sequence.static_cache.StaticScoringCache` (sequence
rewards) and :class:`~steerkit.rewards.token.session.StaticTokenSession` (token-level rewards).

:class:`StaticKV` is one transformers ``StaticCache`` of ``slots`` rows × ``width`` columns per layer, allocated at
once, with the copies a session needs when rows leave or join or the width grows (:meth:`StaticKV.allocate`,
:meth:`StaticKV.copy`), and the inputs of a forward that writes its tokens at chosen columns
(:meth:`StaticKV.inputs`): a fixed shape per (slots, width, new tokens), so that a step is one graph that
``torch.compile`` captures once (:class:`~steerkit.compiling.CompiledStep`).
"""

from __future__ import annotations

import copy

import torch

from ..compiling import bucket
from ..hf_compat import set_static_write_column, static_cache
from .attention import additive
from .model import RewardModel

#: The fewest cached columns a static reward session allocates (then 128, 256, ...).
MIN_COLUMNS = 64


def supports_static(model) -> bool:
    """Whether ``model`` (a torch reward model, sequence or token-level) can keep its KV in a :class:`StaticKV`: a
    backbone transformers compiles with its ``StaticCache`` whose layers all attend to every column (a
    sliding-window layer, as Gemma 3's, keeps only its window: the layouts here need every column)."""
    from transformers import StaticCache

    backbone = getattr(model, "backbone", None)
    if not isinstance(model, RewardModel) or not getattr(backbone, "_can_compile_fullgraph", False):
        return False
    layers = StaticCache(config=backbone.config, max_cache_len=1).layers
    return not any(getattr(layer, "is_sliding", False) for layer in layers)


def static_form(reward, compiled: bool | None = None, *, pays_on_cpu: bool = False):
    """``reward`` (a torch reward of this package: ``backend``, ``model`` and ``static`` attributes) as
    ``compile=True`` runs it: a copy whose sessions keep the KV in a :class:`StaticKV`, its step compiled
    (``compiled=False``: the same layout run eagerly). ``None``: where that pays. On a CUDA device it does (the eager
    step is bound by kernel launches). On a CPU where the reward says so (``pays_on_cpu``, measured in
    docs/performance.md: a token-level commit yes; a float32 sequence reward's candidate scoring, bound by its matrix
    products, no), and wherever the backend multiplies in int8 on a CPU that does (``torch-int8`` with VNNI or AMX:
    "A compiled step's attention"), else ``reward`` itself. Also ``reward`` itself for another backend, a model
    :func:`supports_static` refuses, or a reward already in that form. A reduced-precision torch backend
    (``torch-bf16``, ``torch-bf16-compute``, ``torch-int8``) keeps its precision: the copy runs the model that backend
    runs (:meth:`~steerkit.rewards.builtin_backends.TorchBackend.runs`), its activations and KV in float32."""
    from .builtin_backends import torch_backend

    backend = torch_backend(reward.backend)
    if reward.static or backend is None:
        return reward
    if compiled is None:
        from ..linear_precision import INT8, cpu_multiplies_int8

        compiled = (pays_on_cpu or next(reward.model.parameters()).device.type == "cuda"
                    or (getattr(backend, "precision", None) == INT8 and cpu_multiplies_int8()))
        if not compiled:
            return reward
    if not supports_static(reward.model):  # it builds a (tiny) StaticCache to look at its layers: asked last
        return reward
    other = copy.copy(reward)
    other.model = backend.runs(reward.model)
    other.static = "compiled" if compiled else "eager"
    return other


class StaticKV:
    """``static``: a ``StaticCache`` of :attr:`slots` rows × :attr:`width` columns over ``model``'s backbone (None
    until :meth:`allocate`)."""

    def __init__(self, model: RewardModel):
        self.backbone = model.backbone
        parameter = next(model.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        config = self.backbone.config
        self.heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.static = None
        self.slots = self.width = 0

    def allocate(self, slots: int, width: int):
        """New (zero) tensors of ``slots`` × ``width``; returns the previous cache (None at first) to copy from."""
        old = self.static
        # CUDA graphs need the cache's fixed addresses marked; on a CPU the mark would make a compiled step with frozen
        # weights fold the first cache into its graph (hf_compat.static_cache)
        self.static = static_cache(self.backbone, slots, width, self.heads, self.head_dim, self.dtype, self.device,
                                   static_addresses=self.device.type == "cuda")
        self.slots, self.width = slots, width
        return old

    def copy(self, old, rows: torch.Tensor, lo: int, hi: int, first_row: int = 0, column: int = 0) -> None:
        """Copy columns ``[lo, hi)`` of rows ``rows`` of the cache ``old`` to rows ``first_row…`` of this one, from
        ``column`` on."""
        n = len(rows)
        if not n or hi <= lo:
            return
        rows = rows.to(old.layers[0].keys.device)
        for new_layer, old_layer in zip(self.static.layers, old.layers):
            for name in ("keys", "values"):
                src = getattr(old_layer, name).index_select(0, rows)[:, :, lo:hi]
                getattr(new_layer, name)[first_row:first_row + n, :, column:column + hi - lo] = src

    def resize(self, slots: int, width: int, rows: int, columns: int) -> None:
        """Move to ``slots`` × ``width``, keeping columns ``[0, columns)`` of the first ``rows`` rows."""
        old = self.allocate(slots, width)
        if old is not None:
            self.copy(old, torch.arange(rows, device=self.device), 0, columns)

    def take(self, index: torch.Tensor, lo: int, hi: int, width: int) -> None:
        """Keep rows ``index`` (in that order) and their columns ``[lo, hi)``, moved to column 0, in the smallest
        bucket of rows that holds them × ``width``."""
        old = self.allocate(bucket(len(index)), width)
        self.copy(old, index, lo, hi)

    def join(self, rows: int, columns: int, pad: int, other: "StaticKV", other_rows: int, other_columns: int,
             other_pad: int, width: int) -> None:
        """This cache's first ``rows`` rows (columns ``[0, columns)`` moved right by ``pad``) then ``other``'s first
        ``other_rows`` rows (``[0, other_columns)`` moved right by ``other_pad``), in a bucket of rows × ``width``."""
        old = self.allocate(bucket(rows + other_rows), width)
        self.copy(old, torch.arange(rows, device=self.device), 0, columns, 0, pad)
        self.copy(other.static, torch.arange(other_rows, device=self.device), 0, other_columns, rows, other_pad)

    def inputs(self, ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor, cached: int, first: int,
               queries: int) -> dict:
        """Keyword arguments of a backbone forward over ``ids`` [B, n] at ``position_ids`` [B, n] whose KV is written
        to columns ``[first, first + n)``; ``allowed`` [B, 1, n, cached + n] is what each token sees among the
        ``cached`` columns ``[0, cached)`` and the new ones. Rows beyond B (the slots' padding) and queries beyond n
        (up to ``queries``) read token 0 at position 0 and see only themselves, so the shape is ``slots`` ×
        ``queries`` whatever B and n are; their outputs are to be dropped."""
        B, n = ids.shape
        slots, device = self.slots, self.device
        padded = torch.zeros((slots, queries), dtype=torch.long, device=device)
        padded[:B, :n] = ids
        positions = torch.zeros((slots, queries), dtype=torch.long, device=device)
        positions[:B, :n] = position_ids
        visible = torch.zeros((slots, 1, queries, self.width), dtype=torch.bool, device=device)
        visible[:B, :, :n, :cached] = allowed[..., :cached]
        visible[:B, :, :n, first:first + n] = allowed[..., cached:]
        # padding sees itself (no empty softmax row): the diagonal of the new columns, filled in place (one kernel; an
        # indexed assignment of the Python scalar True made the host wait for the GPU on every step)
        visible[..., first:first + queries].diagonal(dim1=-2, dim2=-1).fill_(True)
        set_static_write_column(self.static, first)
        return dict(input_ids=padded, attention_mask=additive(visible, self.dtype), position_ids=positions,
                    past_key_values=self.static, use_cache=True,
                    cache_position=torch.arange(first, first + queries, device=device))

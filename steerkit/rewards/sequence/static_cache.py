"""The torch reward model's shared-prefix cache on preallocated tensors, its block scoring compiled once per shape
(``compile=True``, issue 25): the reward side of the engine's static-shape step (:mod:`steerkit.engine.static_lm`).

:class:`~steerkit.rewards.sequence.torch_cache.TorchScoringCache` keeps the KV in a ``DynamicCache`` that grows by
``torch.cat``, appends k candidate blocks to it, and crops them again, each step a different shape.
:class:`StaticScoringCache` keeps the same :class:`~steerkit.rewards.cache.SharedPrefixCache` bookkeeping (masks,
positions, pending blocks, rollbacks, rows leaving and joining) on one transformers ``StaticCache`` per session:

* **Layout:** ``slots`` rows × ``prefix + scratch`` columns per layer. Column ``j < prefix`` holds the cached
  column ``j`` of :attr:`mask` (``T`` = :attr:`length` columns are in use). The k candidate blocks of a step are
  written into the scratch columns ``[prefix, prefix + k·m)``; on commit the chosen block is copied from there to
  ``[T, T + m)``, and the others are simply overwritten by the next step. A prefix extension is written straight to
  ``[T, T + n)``. Nothing is concatenated or cropped per step.
* **Buckets:** ``slots`` is the rows rounded up to a power of two, ``prefix`` the columns needed rounded up to a
  power of two (at least :data:`MIN_PREFIX`; a step needs ``T + m``: the cached columns and the block it commits),
  ``scratch`` the block tokens (k·m) rounded up to a multiple of :data:`SCRATCH_STEP` (a power of two above
  4 · :data:`SCRATCH_STEP`). Padded rows and queries read token 0 at position 0 and see only themselves; their rewards
  are dropped.
* **Compiled:** the block scoring of a step (the forward over the k candidate blocks) runs through the model's
  :class:`~steerkit.compiling.CompiledStep`, once per (slots, prefix, scratch) shape and process, with the
  kernels cached on disk as the LM's are; so does the commit's copy of the chosen block (:func:`compiled_keep`).
  Prefix extensions (the start, a rollback's re-synchronisation, a chunked step's re-run) vary in length and run
  eagerly on the same tensors.

The rewards are the eager cache's up to floating-point reordering: the same model code, positions and visible
columns; masked columns contribute nothing (tests/unit/test_static_scoring.py compares them).
"""

from __future__ import annotations

import torch

from ...compiling import CompiledStep, bucket
from ...model_copies import converted_copy
from ..cache import SharedPrefixCache, column_index
from ..model import RewardModel
from ..static_kv import MIN_COLUMNS, StaticKV

#: The fewest prefix columns a static scoring cache allocates.
MIN_PREFIX = MIN_COLUMNS
#: Scratch columns come in multiples of this (k = 20 single-token candidates: 24 columns).
SCRATCH_STEP = 8
#: Whether a compiled session's commit is compiled too (:func:`compiled_keep`); False: its copies run eagerly, what
#: ``benchmarks/bench_gpu.py``'s ``compiled-eager-commit`` mode compares it with.
COMPILE_COMMIT = True


def scratch_bucket(n: int) -> int:
    """Scratch columns for ``n`` block tokens: a multiple of :data:`SCRATCH_STEP` up to 4 of them, then a power of
    two (k = 20 single tokens: 24; bridged blocks of a few tokens each: 64 or 128)."""
    step = SCRATCH_STEP
    return -(-max(1, n) // step) * step if n <= 4 * step else bucket(n, 4 * step)


def _rewards_of(model):
    """The reward model's forward as the compiled function: its rewards tensor alone."""
    def forward(**kwargs):
        return model(**kwargs).rewards
    return forward


def compiled_scoring(model):
    """The reward model's compiled block scoring, made once per model object and process."""
    return converted_copy(model, "compiled reward scoring",
                          lambda m: CompiledStep(m, _rewards_of(m), what="a reward's candidate scoring"))


def keep_columns(static, scratch: torch.Tensor, columns: torch.Tensor) -> None:
    """Copy columns ``scratch`` [slots, m] of every row to ``columns`` [m], in each key and value tensor of the
    ``StaticCache`` ``static``: a gather and an index copy per tensor (every tensor has the same shape, so one gather
    index serves them all)."""
    where = column_index(scratch, static.layers[0].keys)
    for layer in static.layers:
        for t in (layer.keys, layer.values):
            t.index_copy_(2, columns, t.gather(2, where))


def compiled_keep(model):
    """:func:`keep_columns` compiled for ``model``'s caches, made once per model object and process: the commit of a
    compiled session, one CUDA graph on a GPU instead of two kernel launches per layer and tensor."""
    return converted_copy(model, "compiled reward commit",
                          lambda m: CompiledStep(m, keep_columns, what="a reward's commit"))


class StaticScoringCache(SharedPrefixCache):
    """A reward model's KV over B rows in a :class:`~steerkit.rewards.static_kv.StaticKV` (:attr:`kv`) of
    ``prefix + scratch`` columns, its block scoring compiled (``compiled=False``: the same layout, run eagerly;
    what the tests check the layout with)."""

    def __init__(self, model: RewardModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 compiled: bool = True):
        self.model = model
        self.kv = StaticKV(model)
        super().__init__(input_ids.shape[0], self.kv.device)
        self.compiled = compiled_scoring(model) if compiled else None
        self.compiled_keep = compiled_keep(model) if compiled and COMPILE_COMMIT else None
        self.prefix = self.scratch = 0
        self._block_tokens = 0  # m, a block's tokens, while score_blocks runs its forward (the compiled one); else 0
        self.append(input_ids, attention_mask)

    @property
    def static(self):
        """The transformers ``StaticCache`` holding the KV."""
        return self.kv.static

    # -- layout --------------------------------------------------------------------------------------------
    def _room(self, rows: int, columns: int, scratch: int) -> None:
        """Make the layout hold ``rows`` rows, ``columns`` prefix columns and ``scratch`` scratch columns, keeping
        the cached columns; a layout that holds them already stays."""
        if (self.kv.static is not None and self.kv.slots >= rows and self.prefix >= columns
                and self.scratch >= scratch):
            return
        self.prefix = max(self.prefix, bucket(columns, MIN_PREFIX))
        self.scratch = max(self.scratch, scratch_bucket(scratch))
        self.kv.resize(bucket(rows), self.prefix + self.scratch, self.mask.shape[0], self.length)

    # -- the forward ---------------------------------------------------------------------------------------
    def _score_chunk(self, blocks, block_mask):
        self._block_tokens = blocks.shape[-1]  # m: the prefix needs room for the chosen block only, not all k of them
        try:
            return super()._score_chunk(blocks, block_mask)
        finally:
            self._block_tokens = 0

    @torch.no_grad()
    def _forward(self, ids, position_ids, allowed):
        """Run ``ids`` [B, n]: candidate blocks into the scratch columns (the compiled shape: all of the scratch;
        the prefix keeps room for the block the commit copies to ``[T, T + m)``), a prefix extension straight into its
        columns ``[T, T + n)`` (eager: its length varies)."""
        B, n = ids.shape
        T = self.length
        self._room(B, T + (self._block_tokens or n), n if self._block_tokens else 0)
        first, queries = (self.prefix, self.scratch) if self._block_tokens else (T, n)
        kwargs = self.kv.inputs(ids, position_ids, allowed, T, first, queries)
        if self._block_tokens and self.compiled is not None:
            shape = (f"{self.kv.slots} row(s)", f"{self.prefix} prefix", f"{queries} candidate tokens")
            rewards = self.compiled(shape, kwargs)
        else:
            rewards = self.model(**kwargs).rewards
        return rewards[:B, :n], None

    # -- what SharedPrefixCache asks of a backend ----------------------------------------------------------
    def _store(self, kv) -> None:
        pass  # a prefix extension was written in place, at [T, T + n)

    def _discard_blocks(self, kv, count: int) -> None:
        pass  # the next forward writes over the scratch

    def _keep_block(self, kv, index: torch.Tensor) -> None:
        """Copy the chosen block's columns (``index`` [B, m], counted as if the blocks followed the T cached
        columns) from the scratch to ``[T, T + m)``."""
        T, m, B = self.length, index.shape[1], index.shape[0]
        scratch = index - T + self.prefix
        if B < self.kv.slots:  # the padding slots copy their column `prefix` to columns no row reads
            scratch = torch.cat([scratch, scratch.new_full((self.kv.slots - B, m), self.prefix)])
        # one compiled call (a compiled session's), or two operations per tensor: on a GPU each is a kernel launch
        # from the host (benchmarks/count_step_ops.py)
        columns = torch.arange(T, T + m, device=scratch.device)
        if self.compiled_keep is None:
            keep_columns(self.static, scratch, columns)
        else:
            shape = (f"{self.kv.slots} row(s)", f"{self.kv.width} columns", f"{m} token(s)")
            self.compiled_keep(shape, dict(static=self.static, scratch=scratch, columns=columns))

    def _truncate(self, keep: int) -> None:
        pass  # columns past `keep` are no longer in the mask; the next extension writes over them

    def _take_rows(self, index: torch.Tensor, start: int) -> None:
        self.prefix = bucket(self.length - start + 1, MIN_PREFIX)
        self.kv.take(index, start, self.length, self.prefix + self.scratch)

    def _join_rows(self, other: "StaticScoringCache", pad_self: int, pad_other: int) -> None:
        self.prefix = max(self.prefix, bucket(self.length + pad_self + 1, MIN_PREFIX))
        self.scratch = max(self.scratch, other.scratch)
        self.kv.join(self.mask.shape[0], self.length, pad_self, other.kv, other.mask.shape[0], other.length, pad_other,
                     self.prefix + self.scratch)

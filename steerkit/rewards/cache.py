"""The bookkeeping every shared-prefix scoring cache needs, whatever runs the forward.

:class:`SharedPrefixCache` implements :class:`~steerkit.rewards.base.ScoringCache` once: the per-row mask of
cached columns (holes left by rollbacks included), the next position of each row, the 4D masks and position
ids of a prefix extension or of k candidate blocks, which candidate block is pending, which columns a commit
keeps and which a rollback drops. A backend subclasses it and supplies only what differs:

* :meth:`~SharedPrefixCache._forward` runs new tokens over the cached KV and returns ``(rewards [B, n], kv)``;
* :meth:`~SharedPrefixCache._store` keeps the KV of an appended prefix extension;
* :meth:`~SharedPrefixCache._discard_blocks` forgets the KV of the pending candidate blocks;
* :meth:`~SharedPrefixCache._keep_block` keeps one block's KV per row after the cached columns;
* :meth:`~SharedPrefixCache._truncate` crops the cached KV to its first columns;
* :meth:`~SharedPrefixCache._take_rows` and :meth:`~SharedPrefixCache._join_rows` select / merge rows (for
  rows leaving and joining a running batch); a backend without them still works everywhere except there;
* :meth:`~SharedPrefixCache._forward_rows` and :meth:`~SharedPrefixCache._keep_columns` run new tokens over some
  rows' KV without changing the cache, and append one block's columns to every row: with them, a call that marks
  the blocks it needs (``active``) scores each row only on its own blocks (:meth:`~SharedPrefixCache.score_blocks`);
  without them every block is scored, as before.

Shapes: B rows, k candidate blocks of m tokens each, T cached columns (``length``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from .attention import append_mask_4d, block_mask_4d


def column_index(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Column indices [B, m] as the ``gather`` index [B, heads, m, d] of KV tensors shaped like ``like``."""
    return index[:, None, :, None].expand(-1, like.shape[1], -1, like.shape[3])


def pick_columns(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, :, index[b, j], :]`` for a KV tensor [B, heads, T, d] and column indices [B, m] -> [B, heads, m, d]."""
    return t.gather(2, column_index(index, t))


#: Marks pending blocks scored in chunks: their KV is gone, the chosen block is run again on commit.
_RESCORE = object()

#: Blocks (candidates) scored in one forward at most (``SharedPrefixCache.max_blocks``).
MAX_BLOCKS_PER_FORWARD = 64
#: A forward's own cost, in blocks of one row: what grouping the rows by the blocks they need must save to run one
#: more forward (:func:`row_groups`). Measured on the shipped ``toxicity``, 16 rows, the candidates each row needed in
#: a real run: onnxruntime int8 scored as fast with any value from 3 to 24, torch fastest from 12 to 24 (its eager
#: forward's fixed cost is larger), both far faster than one forward as wide as the neediest row
#: (docs/performance.md).
FORWARD_COST = 12
#: Forwards a ragged :meth:`SharedPrefixCache.score_blocks` call runs at most.
MAX_GROUPS = 4
#: Whether caches that can score ragged do (False: every row on every block; for before/after benchmarks).
RAGGED_SCORING = True


def row_groups(counts: list[int], max_groups: int | None = None, forward_cost: float | None = None) -> list[list[int]]:
    """Rows grouped for ragged scoring: row ``b`` needs ``counts[b]`` blocks, and each group is one forward as wide as
    its neediest row. The rows, in order of need, are cut into at most ``max_groups`` runs so that the blocks scored
    (padding included) plus ``forward_cost`` per forward are least (defaults: :data:`MAX_GROUPS`,
    :data:`FORWARD_COST`). Returns the groups' row numbers, least need first.

    >>> row_groups([2, 3, 2, 17, 3, 2])
    [[0, 2, 5, 1, 4], [3]]
    """
    max_groups = MAX_GROUPS if max_groups is None else max_groups
    forward_cost = FORWARD_COST if forward_cost is None else forward_cost
    needs = sorted(set(counts))  # a cut between rows of equal need never pays: cut between distinct needs only
    rows_upto = [0]
    for need in needs:
        rows_upto.append(rows_upto[-1] + counts.count(need))
    n = len(needs)
    # best[g][j]: the least cost of the rows of the first j needs in g forwards, and where its last one starts
    best = [[(0.0, 0)] + [(float("inf"), 0)] * n]
    for g in range(1, max_groups + 1):
        best.append([(float("inf"), 0)] + [
            min((best[g - 1][i][0] + (rows_upto[j] - rows_upto[i]) * needs[j - 1] + forward_cost, i) for i in range(j))
            for j in range(1, n + 1)])
    g = min(range(1, max_groups + 1), key=lambda g: best[g][n][0]) if n else 0
    order = sorted(range(len(counts)), key=lambda b: counts[b])
    groups, j = [], n
    while g and j:
        i = best[g][j][1]
        groups.append(order[rows_upto[i]:rows_upto[j]])
        g, j = g - 1, i
    return groups[::-1]


class _Grouped(list):
    """Pending blocks scored in groups of rows, each group its own forward over those rows' KV (the cache itself
    unchanged): per group, ``(rows [G], the blocks each row scored in order [G, w], the forward's KV)``."""


class SharedPrefixCache(ABC):
    """Incremental state of one reward model over B rows, in the reward model's token ids.

    ``mask`` [B, T] marks the real cached tokens of each row (left padding and rollback holes are False);
    ``next_pos`` [B] is the position id of each row's next token (real tokens counted). Rewards come back on
    the device the scored tokens came from.
    """

    #: Candidates scored in one forward at most; more are scored in chunks of this many (:meth:`score_blocks`).
    max_blocks: int = MAX_BLOCKS_PER_FORWARD

    def __init__(self, batch_size: int, device: torch.device | str):
        self.device = device
        self.mask = torch.zeros((batch_size, 0), dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._pending: tuple[int, int, torch.Tensor, Any] | None = None  # (k, m, block_mask, kv) of the last score

    # -- what a backend supplies -------------------------------------------------------------------
    @abstractmethod
    def _forward(self, ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Run ``ids`` [B, n] at ``position_ids`` [B, n] over the cached KV; ``allowed`` [B, 1, n, T + n] is the
        boolean attention mask. Returns the rewards [B, n] and the KV of the cache extended by the n tokens."""

    @abstractmethod
    def _store(self, kv: Any) -> None:
        """Keep ``kv`` (what :meth:`_forward` returned for a prefix extension) as the cached KV."""

    @abstractmethod
    def _discard_blocks(self, kv: Any, count: int) -> None:
        """Forget the ``count`` pending block columns that :meth:`_forward` returned as ``kv``."""

    @abstractmethod
    def _keep_block(self, kv: Any, index: torch.Tensor) -> None:
        """Make the cache the T cached columns followed by columns ``index`` [B, m] of ``kv`` (the pending
        blocks' KV, T + k·m columns)."""

    @abstractmethod
    def _truncate(self, keep: int) -> None:
        """Keep only the first ``keep`` columns of the cached KV."""

    def _take_rows(self, index: torch.Tensor, start: int) -> None:
        """Keep rows ``index`` [B'] of the cached KV, and only its columns from ``start`` on."""
        raise NotImplementedError(f"{type(self).__name__} cannot drop or reorder rows")

    def _forward_rows(self, rows: torch.Tensor, ids: torch.Tensor, position_ids: torch.Tensor,
                      allowed: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`_forward` over the KV of rows ``rows`` [V] only, leaving the cache as it is: the rewards [V, n]
        and the KV of those rows extended by the n tokens, as tensors [V, heads, T + n, d]."""
        raise NotImplementedError(f"{type(self).__name__} scores every row on every block")

    def _keep_columns(self, columns: list[torch.Tensor]) -> None:
        """Append ``columns`` (one [B, heads, m, d] per tensor :meth:`_forward_rows` returns, in its order) to every
        row's cached KV."""
        raise NotImplementedError(f"{type(self).__name__} scores every row on every block")

    def _join_rows(self, other: "SharedPrefixCache", pad_self: int, pad_other: int) -> None:
        """Make the cached KV this cache's rows, left-padded by ``pad_self`` columns, followed by ``other``'s
        rows left-padded by ``pad_other`` columns (both then have the same length). Padding is never attended
        to (its mask is False), so its values do not matter; zeros are fine."""
        raise NotImplementedError(f"{type(self).__name__} cannot merge rows")

    @property
    def supports_row_changes(self) -> bool:
        cls = type(self)
        return cls._take_rows is not SharedPrefixCache._take_rows and cls._join_rows is not SharedPrefixCache._join_rows

    @property
    def scores_ragged(self) -> bool:
        """Whether :meth:`score_blocks` scores each row only on the blocks ``active`` marks."""
        cls = type(self)
        return (RAGGED_SCORING and cls._forward_rows is not SharedPrefixCache._forward_rows
                and cls._keep_columns is not SharedPrefixCache._keep_columns)

    # -- the ScoringCache contract ----------------------------------------------------------------
    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def _drop_pending(self) -> None:
        if self._pending is not None:
            k, m, _, kv = self._pending
            self._pending = None
            if kv is not _RESCORE and not isinstance(kv, _Grouped):
                self._discard_blocks(kv, k * m)

    def score_blocks(self, blocks: torch.Tensor, block_mask: torch.Tensor | None = None,
                     active: torch.Tensor | None = None) -> torch.Tensor:
        """Score k blocks per row ([B, k, m], right-padded, mask [B, k, m]) over the shared prefix, at most
        :attr:`max_blocks` blocks per forward (one forward for k up to it); the reward of a block is read at its
        last real token. Returns [B, k].

        The attention mask of one forward is [B, 1, k·m, T + k·m], quadratic in k; chunks keep a step's memory
        bounded for any k. When there is more than one chunk, each chunk's KV is dropped at once and
        :meth:`commit_choice` runs the chosen block again (one forward of m tokens per row).

        ``active`` [B, k] bool marks the blocks the caller reads (at least one a row, else its first). Where
        :attr:`scores_ragged`, the rows are then scored in groups (:func:`row_groups`), each as wide as its
        neediest row, not all as wide as k; an inactive block's reward is 0, and choosing it commits the row's first
        active block."""
        self._drop_pending()
        device = blocks.device  # rewards go back where the candidates came from (the LM's device)
        blocks = blocks.to(self.device)
        B, k, m = blocks.shape
        block_mask = (torch.ones_like(blocks, dtype=torch.bool) if block_mask is None
                      else block_mask.to(self.device).bool())
        if active is not None and k <= self.max_blocks and self.scores_ragged:
            return self._score_groups(blocks, block_mask, active.to(self.device).bool()).to(device)
        if k <= self.max_blocks:
            rewards, kv = self._score_chunk(blocks, block_mask)
            self._pending = (k, m, block_mask, kv)
            return rewards.to(device)
        parts = []
        for start in range(0, k, self.max_blocks):
            chunk = slice(start, start + self.max_blocks)
            rewards, kv = self._score_chunk(blocks[:, chunk], block_mask[:, chunk])
            self._discard_blocks(kv, rewards.shape[1] * m)
            parts.append(rewards)
        self._pending = (blocks, m, block_mask, _RESCORE)
        return torch.cat(parts, 1).to(device)

    def _score_chunk(self, blocks: torch.Tensor, block_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """One forward of blocks [B, c, m] after the prefix: each block's reward [B, c] and the forward's KV."""
        return self._score_over(blocks, block_mask)

    def _score_over(self, blocks: torch.Tensor, block_mask: torch.Tensor, rows: torch.Tensor | None = None):
        """One forward of blocks [G, c, m] after the prefix of every row (``rows`` None: :meth:`_forward`) or of rows
        ``rows`` [G] (:meth:`_forward_rows`): each block's reward [G, c] and the forward's KV."""
        G, c, m = blocks.shape
        next_pos, mask = ((self.next_pos, self.mask) if rows is None
                          else (self.next_pos.index_select(0, rows), self.mask.index_select(0, rows)))
        offsets = (block_mask.long().cumsum(-1) - 1).clamp(min=0)
        position_ids = (next_pos[:, None, None] + offsets).reshape(G, c * m)
        args = (blocks.reshape(G, c * m), position_ids, block_mask_4d(mask, block_mask))
        rewards, kv = self._forward(*args) if rows is None else self._forward_rows(rows, *args)
        last = (block_mask.long().sum(-1) - 1).clamp(min=0)  # [G, c]
        return rewards.reshape(G, c, m).gather(-1, last[..., None]).squeeze(-1), kv

    def _score_groups(self, blocks: torch.Tensor, block_mask: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """:meth:`score_blocks` of the ``active`` blocks only: one forward per group of rows (:func:`row_groups`),
        each row's active blocks in order, padded with its first to the group's width."""
        B, k, m = blocks.shape
        order = torch.sort((~active).long(), dim=1, stable=True).indices  # [B, k]: each row's active blocks first
        counts = active.sum(-1).clamp(min=1)
        rewards = torch.zeros((B, k), dtype=torch.float32, device=self.device)
        pending = _Grouped()
        for rows in row_groups(counts.tolist()):
            rows = torch.tensor(rows, dtype=torch.long, device=self.device)
            n = counts.index_select(0, rows)
            width = int(n.max())
            take = order.index_select(0, rows)[:, :width]
            real = torch.arange(width, device=self.device)[None, :] < n[:, None]
            take = torch.where(real, take, take[:, :1])  # [G, w]
            index = take[..., None].expand(-1, -1, m)
            got, kv = self._score_over(blocks.index_select(0, rows).gather(1, index),
                                       block_mask.index_select(0, rows).gather(1, index), rows)
            rewards[rows[:, None].expand_as(take)[real], take[real]] = got[real].float()
            pending.append((rows, take, kv))
        self._pending = (k, m, block_mask, pending)
        return rewards

    def _keep_grouped(self, pending: _Grouped, choice: torch.Tensor, m: int) -> torch.Tensor:
        """Commit a ragged score: each row's chosen block's columns, from its group's forward, after its cache. A
        row's inactive choice (a finished row's padding) keeps its first active block. Returns the blocks kept."""
        columns, kept = None, choice.clone()
        for rows, take, kv in pending:
            at = (take == choice.index_select(0, rows)[:, None]).long().argmax(-1)  # no hit: 0, the first active
            kept.index_copy_(0, rows, take.gather(1, at[:, None])[:, 0])
            index = self.length + at[:, None] * m + torch.arange(m, device=self.device)[None, :]
            picked = [pick_columns(t, index) for t in kv]
            if columns is None:
                columns = [p.new_zeros((self.mask.shape[0], *p.shape[1:])) for p in picked]
            for whole, part in zip(columns, picked):
                whole.index_copy_(0, rows, part)
        self._keep_columns(columns)
        return kept

    def commit_choice(self, choice: torch.Tensor) -> None:
        """Keep the KV of block ``choice[b]`` of the last :meth:`score_blocks` call for each row; drop the rest."""
        if self._pending is None:
            raise RuntimeError("commit_choice() needs a preceding score_blocks() call")
        k, m, block_mask, kv = self._pending
        if kv is _RESCORE:  # scored in chunks: run the chosen block again, as an append
            self._pending = None
            pick = choice.to(self.device).long()[:, None, None].expand(-1, 1, m)
            self.append(k.gather(1, pick).squeeze(1), block_mask.gather(1, pick).squeeze(1))
            return
        choice = choice.to(self.device).long()
        if isinstance(kv, _Grouped):
            choice = self._keep_grouped(kv, choice, m)
        else:
            index = self.length + choice[:, None] * m + torch.arange(m, device=self.device)[None, :]  # [B, m]
            self._keep_block(kv, index)
        chosen = block_mask.gather(1, choice[:, None, None].expand(-1, 1, m)).squeeze(1)  # [B, m]
        self.mask = torch.cat([self.mask, chosen], dim=1)
        self.next_pos = self.next_pos + chosen.long().sum(-1)
        self._pending = None

    def append(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Run new tokens [B, n] (mask [B, n]) through the model and keep their KV."""
        self._drop_pending()
        tokens = tokens.to(self.device)
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.to(self.device).bool()
        if tokens.shape[1] == 0:
            return
        position_ids = self.next_pos[:, None] + (mask.long().cumsum(-1) - 1).clamp(min=0)
        _, kv = self._forward(tokens, position_ids, append_mask_4d(self.mask, mask))
        self._store(kv)
        self.mask = torch.cat([self.mask, mask], dim=1)
        self.next_pos = self.next_pos + mask.long().sum(-1)

    def rollback(self, counts: torch.Tensor) -> None:
        """Forget the last ``counts[b]`` real tokens of each row (their columns become holes)."""
        self._drop_pending()
        counts = counts.to(self.device).long()
        real_after = self.mask.long().flip(-1).cumsum(-1).flip(-1)  # real tokens at or after each position
        self.mask = self.mask & ~(real_after <= counts[:, None])
        self.next_pos = self.next_pos - torch.minimum(counts, self.next_pos)
        # physically drop trailing columns that are holes in every row
        keep = int(self.mask.any(0).nonzero().max().item()) + 1 if self.mask.any() else 0
        if keep < self.length:
            self._truncate(keep)
            self.mask = self.mask[:, :keep]

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order; drop the others (see ``RewardSession.keep_rows``). Leading
        columns that no kept row uses (left padding of a longer row that left) are dropped too."""
        self._drop_pending()
        index = torch.as_tensor(index, dtype=torch.long).to(self.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(0)
        start = int(used.nonzero()[0].item()) if used.any() else self.length
        self._take_rows(index, start)
        self.mask = mask[:, start:]
        self.next_pos = self.next_pos.index_select(0, index)

    def add_rows(self, other: "SharedPrefixCache") -> None:
        """Append ``other``'s rows (a cache of the same model and backend) after this cache's rows. The
        shorter cache is left-padded with masked columns; positions stay per row, so rewards do not change."""
        if type(other) is not type(self):
            raise TypeError(f"cannot add the rows of a {type(other).__name__} to a {type(self).__name__}")
        self._drop_pending()
        other._drop_pending()
        width = max(self.length, other.length)
        pad_self, pad_other = width - self.length, width - other.length
        self._join_rows(other, pad_self, pad_other)
        self.mask = torch.cat([_left_pad(self.mask, pad_self), _left_pad(other.mask.to(self.device), pad_other)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos.to(self.device)])


def _left_pad(mask: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros((mask.shape[0], columns)), mask], dim=1) if columns else mask


def left_pad_kv(t: torch.Tensor, columns: int) -> torch.Tensor:
    """A KV tensor [B, heads, T, d] with ``columns`` zero columns in front: [B, heads, columns + T, d]."""
    return torch.nn.functional.pad(t, (0, 0, columns, 0)) if columns else t

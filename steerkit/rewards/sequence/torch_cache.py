"""Torch backend: the shared-prefix KV cache of a :class:`RewardModel`.

All k candidates of a row are scored in *one* forward as k blocks appended after the cached prefix,
with a 4D additive mask (each block sees the prefix and itself). The cache is never copied per
candidate: memory stays O(B·L) instead of O(B·k·L). After the choice, the chosen block's KV is moved
into place and the other k-1 blocks are cropped away.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ...hf_compat import cache_of_rows, take_cache_rows
from ..attention import additive
from ..cache import SharedPrefixCache, left_pad_kv, pick_columns
from ..model import RewardModel


class TorchScoringCache(SharedPrefixCache):
    """Incremental KV state of a reward model over B rows in a transformers ``DynamicCache`` (``self.cache``).

    Only the forward and the KV storage are torch-specific; the bookkeeping is :class:`SharedPrefixCache`'s.
    The pending blocks' KV is appended to the ``DynamicCache`` in place by the forward, so dropping it is a crop
    and keeping one block moves its columns into place before the crop.
    """

    def __init__(self, model: RewardModel, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model = model
        self.dtype = next(model.parameters()).dtype
        super().__init__(input_ids.shape[0], next(model.parameters()).device)
        self.cache = DynamicCache(config=model.backbone.config)
        self.append(input_ids, attention_mask)

    def _forward(self, ids, position_ids, allowed):
        return self._run(self.cache, ids, position_ids, allowed), None  # the new KV is in self.cache already

    def _forward_rows(self, rows, ids, position_ids, allowed):
        cache = cache_of_rows(self.cache, rows.to(self.device))
        return (self._run(cache, ids, position_ids, allowed),
                [t for layer in cache.layers for t in (layer.keys, layer.values)])

    def _run(self, cache, ids, position_ids, allowed) -> torch.Tensor:
        """The rewards [B, n] of ``ids`` over ``cache``, which the forward extends in place."""
        with torch.no_grad():
            return self.model(ids, attention_mask=additive(allowed, self.dtype).to(self.device),
                              position_ids=position_ids, past_key_values=cache, use_cache=True).rewards

    def _keep_columns(self, columns) -> None:
        columns = iter(columns)
        for layer in self.cache.layers:  # a layer's own update appends (and sets up a layer still empty)
            layer.update(next(columns).to(self.device), next(columns).to(self.device))

    def _store(self, kv) -> None:
        pass  # the forward appended the new KV to self.cache in place

    def _discard_blocks(self, kv, count: int) -> None:
        self.cache.crop(-count)

    def _keep_block(self, kv, index: torch.Tensor) -> None:
        T, m = self.length, index.shape[1]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)  # [B, heads, T + k*m, d]
                t[:, :, T:T + m] = pick_columns(t, index)
                setattr(layer, name, t[:, :, : T + m])

    def _truncate(self, keep: int) -> None:
        self.cache.crop(-(self.length - keep))

    def _take_rows(self, index: torch.Tensor, start: int) -> None:
        take_cache_rows(self.cache, index, start)

    def _join_rows(self, other: "TorchScoringCache", pad_self: int, pad_other: int) -> None:
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            for name in ("keys", "values"):
                a, b = getattr(mine, name), getattr(theirs, name).to(self.device)
                setattr(mine, name, torch.cat([left_pad_kv(a, pad_self), left_pad_kv(b, pad_other)]))

"""Torch backend: the shared-prefix KV cache of a :class:`RewardModel`.

All k candidates of a row are scored in *one* forward as k blocks appended after the cached prefix,
with a 4D additive mask (each block sees the prefix and itself). The cache is never copied per
candidate: memory stays O(B·L) instead of O(B·k·L). After the choice, the chosen block's KV is moved
into place and the other k-1 blocks are cropped away.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .attention import additive, append_mask_4d, block_mask_4d
from .model import RewardModel


class TorchScoringCache:
    """Incremental KV state of a reward model over B rows (see :class:`~steerkit.rewards.base.ScoringCache`)."""

    def __init__(self, model: RewardModel, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache(config=model.backbone.config)
        self.mask = torch.zeros((input_ids.shape[0], 0), dtype=torch.bool, device=self.device)
        self.next_pos = torch.zeros(input_ids.shape[0], dtype=torch.long, device=self.device)
        self._pending: tuple[int, int, torch.Tensor] | None = None  # (k, m, block_mask) of the last score
        self.append(input_ids.to(self.device), attention_mask.to(self.device).bool())

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def _forward(self, ids, position_ids, allowed):
        with torch.no_grad():
            out = self.model(ids, attention_mask=additive(allowed, self.dtype).to(self.device),
                             position_ids=position_ids, past_key_values=self.cache, use_cache=True)
        return out.rewards

    def _drop_pending(self) -> None:
        if self._pending is not None:
            k, m, _ = self._pending
            self.cache.crop(-(k * m))
            self._pending = None

    def score_blocks(self, blocks: torch.Tensor, block_mask: torch.Tensor | None = None) -> torch.Tensor:
        self._drop_pending()
        blocks = blocks.to(self.device)
        B, k, m = blocks.shape
        block_mask = torch.ones_like(blocks, dtype=torch.bool) if block_mask is None else block_mask.to(self.device).bool()
        offsets = (block_mask.long().cumsum(-1) - 1).clamp(min=0)
        position_ids = (self.next_pos[:, None, None] + offsets).reshape(B, k * m)
        allowed = block_mask_4d(self.mask, block_mask)
        rewards = self._forward(blocks.reshape(B, k * m), position_ids, allowed).reshape(B, k, m)
        self._pending = (k, m, block_mask)
        last = (block_mask.long().sum(-1) - 1).clamp(min=0)  # [B, k]
        return rewards.gather(-1, last[..., None]).squeeze(-1)

    def commit_choice(self, choice: torch.Tensor) -> None:
        if self._pending is None:
            raise RuntimeError("commit_choice() needs a preceding score_blocks() call")
        k, m, block_mask = self._pending
        T = self.length
        choice = choice.to(self.device)
        index = (T + choice[:, None] * m + torch.arange(m, device=self.device)[None, :])  # [B, m]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)  # [B, heads, T + k*m, d]
                picked = t.gather(2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))
                t[:, :, T:T + m] = picked
                setattr(layer, name, t[:, :, : T + m])
        chosen = block_mask.gather(1, choice[:, None, None].expand(-1, 1, m)).squeeze(1)  # [B, m]
        self.mask = torch.cat([self.mask, chosen], dim=1)
        self.next_pos = self.next_pos + chosen.long().sum(-1)
        self._pending = None

    def append(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self._drop_pending()
        tokens = tokens.to(self.device)
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.to(self.device).bool()
        if tokens.shape[1] == 0:
            return
        position_ids = self.next_pos[:, None] + (mask.long().cumsum(-1) - 1).clamp(min=0)
        self._forward(tokens, position_ids, append_mask_4d(self.mask, mask))
        self.mask = torch.cat([self.mask, mask], dim=1)
        self.next_pos = self.next_pos + mask.long().sum(-1)

    def rollback(self, counts: torch.Tensor) -> None:
        self._drop_pending()
        counts = counts.to(self.device)
        real_after = self.mask.long().flip(-1).cumsum(-1).flip(-1)  # real tokens at or after each position
        self.mask = self.mask & ~(real_after <= counts[:, None])
        self.next_pos = self.next_pos - torch.minimum(counts, self.next_pos)
        # physically drop trailing columns that are holes in every row
        keep = int(self.mask.any(0).nonzero().max().item()) + 1 if self.mask.any() else 0
        if keep < self.length:
            self.cache.crop(-(self.length - keep))
            self.mask = self.mask[:, :keep]

"""Additive 4D attention masks for shared-prefix ("tree") scoring."""

from __future__ import annotations

import torch


def additive(allowed: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """0 where attention is allowed, the dtype's minimum elsewhere (SDPA-friendly float mask)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def block_mask_4d(prefix_mask: torch.Tensor, block_mask: torch.Tensor) -> torch.Tensor:
    """Allowed-attention mask [B, 1, k*m, T + k*m] for k blocks of m tokens appended after a prefix.

    ``prefix_mask`` [B, T] marks the real cached tokens; ``block_mask`` [B, k, m] the real block tokens.
    A block token sees every real prefix token and the real tokens of its own block up to itself.
    Padding queries see themselves only, so no row of the softmax is empty.
    """
    B, k, m = block_mask.shape
    n = k * m
    device = block_mask.device
    q = torch.arange(n, device=device)
    same_block = (q[:, None] // m) == (q[None, :] // m)
    causal = (q[None, :] % m) <= (q[:, None] % m)
    keys_valid = block_mask.reshape(B, 1, n)
    inner = (same_block & causal)[None] & keys_valid  # [B, n, n]
    inner = inner | torch.eye(n, dtype=torch.bool, device=device)[None]
    prefix = prefix_mask.to(device).bool()[:, None, :].expand(B, n, prefix_mask.shape[1])
    return torch.cat([prefix, inner], dim=-1)[:, None]


def append_mask_4d(prefix_mask: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
    """Allowed-attention mask [B, 1, n, T + n] for n new tokens appended causally after a prefix."""
    return block_mask_4d(prefix_mask, new_mask[:, None, :])

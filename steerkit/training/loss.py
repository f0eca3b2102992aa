"""Training losses over per-position rewards ``r`` [B, T] (start token + text, padded).

The paper's cumulative squared error (RAD §2.1) asks every prefix of a text to predict its label::

    L(r, r̂) = Σ_{t=1..l} t · (r_t − r̂)² / S_l,    S_l = l (l + 1) / 2

where ``r_t`` is the reward after the first ``t`` text tokens and ``l`` the text length. The position
of each token inside its text is ``cumsum(mask) − 1``: the start token gets t = 0 (it carries no text,
so it has weight zero) and the k-th text token t = k, whatever side the padding is on. One masked sum,
no loop over examples.
"""

from __future__ import annotations

from typing import Literal

import torch

LossName = Literal["cumulative", "last"]


def prefix_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """t for every position: 0 at padding and at the start token, k at the k-th text token."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp(min=0) * mask


def cumulative_loss(rewards: torch.Tensor, targets: torch.Tensor, attention_mask: torch.Tensor,
                    reduction: Literal["mean", "none"] = "mean") -> torch.Tensor:
    """The paper's cumulative loss, averaged over the batch (``reduction="none"``: one value per text)."""
    t = prefix_positions(attention_mask).to(rewards.dtype)
    length = t.amax(-1)  # l: number of text tokens (the start token is not counted)
    normaliser = (length * (length + 1) / 2).clamp(min=1)
    per_text = (t * (rewards - targets.to(rewards.dtype)[:, None]) ** 2).sum(-1) / normaliser
    return per_text.mean() if reduction == "mean" else per_text


def last_token_loss(rewards: torch.Tensor, targets: torch.Tensor, attention_mask: torch.Tensor,
                    reduction: Literal["mean", "none"] = "mean") -> torch.Tensor:
    """Plain MSE of the reward at each text's last token."""
    per_text = (final_rewards(rewards, attention_mask) - targets.to(rewards.dtype)) ** 2
    return per_text.mean() if reduction == "mean" else per_text


def final_rewards(rewards: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The reward at each row's last real token (works for left and right padding)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    last = (attention_mask.long() * (positions + 1)).argmax(-1)
    return rewards.gather(-1, last[:, None]).squeeze(-1)


LOSSES = {"cumulative": cumulative_loss, "last": last_token_loss}

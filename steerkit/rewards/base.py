"""The reward contract the decoder relies on, and nothing about how a backend caches.

A :class:`Reward` is started once per batch of prompts and returns a :class:`RewardSession`. At every
decoding step the session scores the k candidate tokens of each row (``score``) and is then told which
token was appended (``commit``). Token ids are the *language model's*; a session translates them to its
own tokenizer when the families differ.

Backends (torch, onnxruntime) implement :class:`ScoringCache`: the incremental KV state of one reward
model over B rows, in the reward model's own token space.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class RewardSession(Protocol):
    def score(self, candidates: torch.Tensor) -> torch.Tensor:
        """Rewards in [0, 1], shape [B, k], of each row's text extended by each candidate LM token [B, k]."""

    def commit(self, tokens: torch.Tensor) -> None:
        """Append the chosen LM token of each row [B] to the scored text."""


@runtime_checkable
class Reward(Protocol):
    name: str

    def start(self, prefixes: list[str], lm_tokenizer) -> RewardSession:
        """Begin scoring B rows whose text so far is ``prefixes`` (empty strings for continuation-only scoring)."""


class ScoringCache(Protocol):
    """Incremental state of one reward model over B rows (reward-model token ids).

    Rows may contain holes (masked entries) left by rollbacks; positions count real tokens only.
    """

    def score_blocks(self, blocks: torch.Tensor, block_mask: torch.Tensor) -> torch.Tensor:
        """Score k blocks per row ([B, k, m], right-padded, mask [B, k, m]) in one forward over the shared
        prefix. Each block attends to the prefix and causally to itself; the reward is read at its last
        real token. Returns [B, k]. The blocks stay pending until :meth:`commit_choice` or the next call."""

    def commit_choice(self, choice: torch.Tensor) -> None:
        """Keep the KV of block ``choice[b]`` of the last ``score_blocks`` call for each row; drop the rest."""

    def append(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """Run new tokens [B, n] (mask [B, n]) through the model and keep their KV."""

    def rollback(self, counts: torch.Tensor) -> None:
        """Forget the last ``counts[b]`` real tokens of each row."""

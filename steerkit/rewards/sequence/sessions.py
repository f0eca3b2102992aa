"""Reward sessions: the decoder-facing side of a reward model, in the language model's token ids."""

from __future__ import annotations

import torch

from ..base import ScoringCache


class SameTokenizerSession:
    """LM and reward model share a vocabulary: each candidate is one token, scored as a block of size 1."""

    def __init__(self, cache: ScoringCache, pad_token_id: int | None = None):
        self.cache = cache
        self.pad_token_id = pad_token_id
        self._candidates: torch.Tensor | None = None

    @property
    def ragged(self) -> bool:
        """Whether :meth:`score` scores each row only on the candidates ``active`` marks (the cache's
        ``scores_ragged``)."""
        return bool(getattr(self.cache, "scores_ragged", False))

    def score(self, candidates: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Rewards [B, k] of the candidates [B, k]; ``active`` [B, k]: the ones the caller reads (the others may
        score anything, and are not chosen), for a :attr:`ragged` session."""
        self._candidates = candidates
        if active is not None and self.ragged:
            return self.cache.score_blocks(candidates[..., None], None, active)
        return self.cache.score_blocks(candidates[..., None], None)

    def commit(self, tokens: torch.Tensor) -> None:
        tokens = tokens.to(self._candidates.device) if self._candidates is not None else tokens
        if self._candidates is None:
            self.cache.append(tokens[:, None], None)
            return
        hits = self._candidates == tokens[:, None]
        found = hits.any(-1)
        self.commit_chosen(tokens, hits.long().argmax(-1))
        # A token that was not a candidate: a finished row padded by generate() (ignored), or a token forced
        # by someone else; the latter is re-synchronised by replacing the kept candidate with the real token.
        redo = ~found
        if self.pad_token_id is not None:
            redo &= tokens != self.pad_token_id
        if redo.any():
            self.cache.rollback(redo.long())
            self.cache.append(tokens[:, None], redo[:, None])

    def commit_chosen(self, tokens: torch.Tensor, chosen: torch.Tensor) -> None:
        """:meth:`commit` for a caller that knows each row's token is its candidate ``chosen`` [B] of the last
        :meth:`score` (the engine does; a finished row's padding: any index): no search for the tokens, so nothing
        here waits for the device (:meth:`commit`'s check for a forced token reads a flag back)."""
        if self._candidates is None:
            self.commit(tokens)
            return
        self.cache.commit_choice(chosen.to(self._candidates.device))
        self._candidates = None

    @property
    def supports_row_changes(self) -> bool:
        return bool(getattr(self.cache, "supports_row_changes", False))

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` in that order (:meth:`RewardSession.keep_rows`); a pending score is discarded."""
        self._candidates = None
        self.cache.keep_rows(index)

    def add_rows(self, other: "SameTokenizerSession") -> None:
        """Append the rows of a session of the same reward (:meth:`RewardSession.add_rows`)."""
        if not isinstance(other, SameTokenizerSession):
            raise TypeError(f"cannot add the rows of a {type(other).__name__} to a SameTokenizerSession")
        self._candidates = other._candidates = None
        self.cache.add_rows(other.cache)

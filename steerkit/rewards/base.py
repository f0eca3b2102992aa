"""The reward contract the decoder relies on, and nothing about how a backend caches.

A :class:`Reward` is started once per batch of prompts and returns a :class:`RewardSession`. At every
decoding step the session scores the k candidate tokens of each row (``score``) and is then told which
token was appended (``commit``). Token ids are the *language model's*; a session translates them to its
own tokenizer when the families differ.

A continuous-batching decoder (``steerkit.serving``) also changes the rows of a live session: rows leave
(``keep_rows``) and newcomers join (``add_rows``) between steps. Both are optional: a session without them
(see :func:`supports_row_changes`) is run by such a decoder as one session per row.

A session may also offer ``commit_chosen(tokens, chosen)``: ``commit`` for a caller that knows each row's token is
its candidate ``chosen`` [B] (an index into the candidates of the last ``score``). The engine, whose tokens are always
candidates (or a finished row's padding), calls it where present, so that the session need not search for the
tokens, which on a GPU makes the host wait (:class:`~steerkit.rewards.sequence.sessions.SameTokenizerSession`).

A session of a reward that declares :func:`candidate_bounds` may also declare ``ragged = True`` and take
``score(candidates, active=None)``: ``active`` [B, k] marks the candidates each row needs (the others are padding,
whose rewards are not read), so that a batch's rows are scored each on its own (:mod:`steerkit.engine.pruning`).

Backends (torch, onnxruntime) implement :class:`ScoringCache`: the incremental KV state of one reward
model over B rows, in the reward model's own token space.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class RewardSession(Protocol):
    def score(self, candidates: torch.Tensor) -> torch.Tensor:
        """Rewards in [0, 1], shape [B, k], of each row's text extended by each candidate LM token [B, k]."""

    def commit(self, tokens: torch.Tensor) -> None:
        """Append the chosen LM token of each row [B] to the scored text."""

    def keep_rows(self, index: torch.LongTensor) -> None:
        """Keep only rows ``index`` [B'] (distinct old row numbers), in that order: new row ``i`` is old row
        ``index[i]``; every other row is dropped and its state freed.

        Called between steps (after ``commit``, before the next ``score``); a pending ``score`` whose
        ``commit`` has not come is discarded. Afterwards ``score`` takes ``[B', k]`` candidates and every kept
        row scores exactly what it scored before (the same text, the same rewards up to float rounding).
        An empty ``index`` is allowed (a session of zero rows, which a decoder normally discards instead).
        """

    def add_rows(self, other: "RewardSession") -> None:
        """Append the rows of ``other`` after this session's rows (B + B' rows; ``other``'s row ``j``
        becomes row ``B + j``).

        ``other`` was started by the *same* :class:`Reward` object (``reward.start(newcomer_prefixes,
        lm_tokenizer)``) and may have committed tokens of its own; it is consumed: do not use it afterwards.
        Called between steps, like :meth:`keep_rows`; pending scores of both sessions are discarded.
        Caches of different lengths are merged by left-padding the shorter one with masked columns, so
        every row's rewards are those of scoring its own text alone, from scratch (up to float rounding).
        Raises ``TypeError`` when ``other`` is not a session of the same kind.
        """


@runtime_checkable
class Reward(Protocol):
    name: str

    def start(self, prefixes: list[str], lm_tokenizer) -> RewardSession:
        """Begin scoring B rows whose text so far is ``prefixes`` (empty strings for continuation-only scoring)."""


def supports_row_changes(session) -> bool:
    """True when ``session`` implements :meth:`RewardSession.keep_rows` and :meth:`RewardSession.add_rows`.

    A session may also declare ``supports_row_changes = False`` (e.g. when its backend cache lacks them)."""
    flag = getattr(session, "supports_row_changes", None)
    if flag is not None:
        return bool(flag)
    return callable(getattr(session, "keep_rows", None)) and callable(getattr(session, "add_rows", None))


def scores_ragged(session) -> bool:
    """True for a session that declares ``ragged`` and whose ``score`` takes ``active``: it may be handed each row's
    own candidates (module docstring). A wrapper that forwards its attributes to a ragged session, ``ragged`` included,
    but whose ``score`` does not take ``active`` is not ragged: it gets every row as wide as the neediest."""
    return bool(getattr(session, "ragged", False)) and _score_takes_active(type(session))


@functools.lru_cache(maxsize=None)
def _score_takes_active(cls: type) -> bool:
    try:
        return "active" in inspect.signature(cls.score).parameters
    except (AttributeError, TypeError, ValueError):  # no score on the class, or one inspect cannot read
        return False


def reads_lm_state(reward) -> bool:
    """True for a reward that scores from the language model's own final hidden state (``reads_lm_state = True``,
    :mod:`steerkit.rewards.token.lm_state`): the engine starts its sessions with ``start(prefixes, lm_tokenizer,
    lm=LM)`` and calls ``score(candidates, lm_state)`` with the rows' hidden states [B, d]."""
    return bool(getattr(reward, "reads_lm_state", False))


def candidate_bounds(reward) -> tuple[float, float] | None:
    """``(lo, hi)`` for a reward that declares ``candidate_bounds``: every ρ it returns lies in ``[lo, hi]``, and its
    cost grows with the candidates it is given (a sequence reward model scores each as a block). The engine may then
    score only the candidates that can still be chosen (:mod:`steerkit.engine.pruning`). None: the engine scores all
    k candidates (a reward that declares nothing, or a token-level one, whose cost hardly depends on k)."""
    bounds = getattr(reward, "candidate_bounds", None)
    if bounds is None:
        return None
    lo, hi = (float(v) for v in bounds)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo <= hi else None  # else: no bound to use


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

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order (see :meth:`RewardSession.keep_rows`)."""

    def add_rows(self, other: "ScoringCache") -> None:
        """Append the rows of a cache of the same model, left-padding the shorter KV with masked columns."""

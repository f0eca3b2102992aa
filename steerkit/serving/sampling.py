"""One decoding step's choice for each row of a mixed batch: its own k, β, rewards, temperature and generator.

The maths is :func:`steerkit.steering.reweight`'s, done per row so that rows with different settings share one
batch: ``combined = z + Σ β(t)·f(ρ)`` over the row's own top-k (terms added in the row's order, a term whose β
is 0 adds nothing), a :class:`~steerkit.errors.NonFiniteRewardError` for a NaN/inf reward or an overflow (that
row only), the row-max shift, ``-inf`` outside the top-k, then the row's argmax (temperature 0) or a sample
from ``softmax(scores / T)`` drawn with the row's own ``torch.Generator``. Done on a ``[1, V]`` row exactly as
:func:`steerkit.decoding.sample_token` does on a batch of one, so a seeded row draws what
``steerkit.generate([prompt], seed=seed)`` draws from the same logits and rewards.

The batch shares one candidate set: the top-``K`` at the largest k of the batch. A row with a smaller k keeps
its first k candidates (``topk`` is sorted, so they are its own top-k) and excludes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..steering import _raise_non_finite, combine, shifted_scores
from .rows import Row


@dataclass
class Choice:
    token: int
    index: int  # position of the token among the row's candidates
    rewards: dict[str, float] | None  # term name -> reward of the chosen token (when traced)


def row_combined(row: Row, topk_logits: torch.Tensor, topk_ids: torch.Tensor,
                 rho: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``z + Σ β·f(ρ)`` of one row over its own k candidates ([k]) and each term's shaped reward ([k]).

    ``topk_logits`` / ``topk_ids`` are the batch's top-K of this row ([K], K >= row.k); ``rho`` maps each
    reward object of the row's terms to its rewards [K]. Raises NonFiniteRewardError like ``reweight``.
    """
    k, step = row.k, row.step
    z = topk_logits[:k]
    combined, rewards, ok = combine(z, row.terms, (rho[id(term.reward)][:k] for term in row.terms), step)
    if not ok:
        _raise_non_finite(topk_ids[None, :k], z[None], {n: r[None] for n, r in rewards.items()}, row.terms, step)
    return combined, rewards


def choose(row: Row, combined: torch.Tensor, topk_ids: torch.Tensor, vocab_size: int,
           rewards: dict[str, torch.Tensor]) -> Choice:
    """The row's token from its combined scores [k] (candidates ``topk_ids[:k]``)."""
    ids = topk_ids[: row.k]
    scores = shifted_scores(combined[None], ids[None], vocab_size)
    if row.temperature == 0:
        token = int(scores.argmax(-1))
    else:
        probs = torch.softmax(scores / row.temperature, dim=-1)
        token = int(torch.multinomial(probs, num_samples=1, generator=row.generator))
    index = int((ids == token).nonzero()[0].item())
    traced = {n: float(r[index]) for n, r in rewards.items()} if row.spec.trace else None
    return Choice(token, index, traced)

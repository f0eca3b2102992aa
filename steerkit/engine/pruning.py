"""The RAD step scoring only the candidates that can still be chosen: the same choice, fewer reward forwards.

A reward that declares ``candidate_bounds = (lo, hi)`` (every ρ it returns lies in ``[lo, hi]``, and its cost grows
with the candidates it is given: a sequence reward model, :func:`~steerkit.rewards.base.candidate_bounds`) bounds
each candidate's score before it is scored: ``z_i + Σ β·f(ρ)`` lies between ``z_i + Σ min(β·f(lo), β·f(hi))`` and
``z_i + Σ max(...)`` (``f`` a term's transform: none, invert or clamp, all monotone). The step's choice is an
argmax: greedy, of the scores; sampled, of ``scores - T·log q`` with ``q ~ Exp(1)`` drawn per candidate (the order
of ``scores / T - log q``: the race :func:`~steerkit.engine.step.sample` runs, ``argmax p / q``), drawn here *before*
scoring. So a candidate whose
upper bound (with its draw) is below a scored candidate's key cannot be chosen and need not be scored:

1. every other reward is scored on all K candidates (its values enter the bounds exactly);
2. round one scores the candidates of highest upper bound: those within ``GUESS_MARGIN`` of the best key that each
   row's last chosen ρ predicts (a text's reward moves little from one token to the next), or on a batch's first
   step ``ROUND_ONE`` of them (none whose upper bound is below the row's best lower bound);
3. round two, only where some row has an unscored candidate whose upper bound reaches its best key: those
   candidates and the row's best, padded to one width with the best (a row's session must score every row).

Unscored candidates score ``-inf``: the choice is then the one a step scoring all K makes, token for token for
greedy rows. A sampled row draws from the same distribution with the same ``q``; its token is the same unless two
candidates tie to float32 rounding (the shift and the softmax's sum see fewer candidates). Each reward's sessions are
told the choice by its index among the candidates they scored last (:attr:`PrunedOutput.scored_ids`).

This pays on the CPU: at batch 1 about half the reward forwards of the shipped ``toxicity`` at k = 20, β = -20. In a
batch, rows need different numbers of candidates; where the bounded rewards' sessions are ``ragged`` (the torch,
onnxruntime and llama.cpp caches: :meth:`~steerkit.rewards.cache.SharedPrefixCache.score_blocks` with ``active``),
each row is scored on its own, in groups of rows of like need; otherwise every row is as wide as the neediest, and at
16 rows little is saved (docs/performance.md). The engine core runs it on the CPU only (each round reads the widths
back) and not where a caller keeps every candidate's rewards (traces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .step import (BatchPlan, StepOutput, _candidate_draws_match, _slot_rewards, candidate_noise, candidates,
                   chosen_index, combine_slots, k_mask, sample, slot_betas, step_output)

#: Candidates per row in round one when nothing is known of the rewards yet (a batch's first step).
ROUND_ONE = 4
#: Round one's reach below the best key guessed from each row's last chosen ρ (in nats of the scores).
GUESS_MARGIN = 1.0
# Round one scores at least 2 candidates a row: a backend may take another path for a product of one row (one row
# and one candidate), and onnxruntime's int8 one does (the shipped toxicity's ρ moved by up to 0.004), which would
# move ρ away from the unpruned step's, where a row's k candidates share each product.


@dataclass
class PrunedOutput(StepOutput):
    scored_ids: dict | None = None  # reward key -> [B, m]: the candidates its sessions scored last
    width: float = 0  # candidates a row handed the bounded rewards, over all rounds (K: as many as unpruned; ragged:
    # each row's own, averaged over the rows)
    chosen_rho: dict | None = None  # reward key -> [B]: each row's ρ of its chosen token (the next step's guess)


class Gate:
    """Whether a batch's next step prunes. A pruned step that hands the rewards nearly K candidates a row (a batch
    whose neediest row needs most of them, or an LM whose top logits are close) costs more than the unpruned one:
    an extra forward per round. So pruning pauses for ``PAUSE`` steps once the running mean of the candidates its
    steps scored, as a fraction of K, passes ``LIMIT``, then tries again. Only the cost changes: a pruned step and
    an unpruned one choose the same tokens."""

    LIMIT = 0.75
    PAUSE = 16
    KEEP = 0.7  # the running mean's weight on its past

    def __init__(self):
        self.mean, self.paused = 0.0, 0

    def open(self) -> bool:
        if self.paused:
            self.paused -= 1
            return False
        return True

    def record(self, width: int, K: int) -> None:
        self.mean = self.KEEP * self.mean + (1 - self.KEEP) * width / K
        if self.mean > self.LIMIT:
            self.mean, self.paused = 0.0, self.PAUSE


def prunable(plan: BatchPlan, bounds: dict) -> dict:
    """The keys of ``bounds`` (``{reward key: (lo, hi)}``) that every slot of ``plan`` shapes with a monotone
    transform (none, or one marked ``monotone``), with their bounds; a key some row shapes otherwise is scored in
    full."""
    keys = dict(bounds)
    for slot in plan.slots:
        for _, key, transform in slot.groups:
            if transform is not None and not getattr(transform, "monotone", False):
                keys.pop(key, None)
    return keys


def can_prune(plan: BatchPlan, device) -> bool:
    """Whether the pruned step can run on this batch: a CPU batch of more than ``ROUND_ONE`` candidates whose draws
    are made at the candidates (:func:`~steerkit.engine.step.candidate_noise`)."""
    return (torch.device(device).type == "cpu" and plan.K > ROUND_ONE
            and (plan.sampling.all_greedy or _candidate_draws_match()))


def pruned_step(logits: torch.Tensor, plan: BatchPlan, score: Callable[..., dict],
                steps: Sequence[int], bounds: dict, live: torch.Tensor | None = None,
                guess: dict | None = None, ragged: bool = False) -> PrunedOutput:
    """One RAD step scoring the rewards of ``bounds`` (:func:`prunable`'s) only where the choice may need them.

    ``score(ids, keys)`` scores the rewards ``keys`` (a set of reward keys) on candidates ``ids`` [B, m] and
    returns ``{key: [B, m]}``. ``live`` [B] bool: rows whose choice counts (a finished row of a shared batch is fed
    padding whatever it draws, so it never widens round two). ``guess``: each row's ρ [B] of every bounded reward
    at the last step (:attr:`PrunedOutput.chosen_rho`): a text's reward moves little from one token to the next, so
    round one takes the candidates whose upper bound comes within ``GUESS_MARGIN`` of the best key that guess
    gives, and round two is rarely needed (NaN: a row with no last ρ, a newcomer: :func:`carry_guess`).
    ``ragged``: the bounded rewards' sessions score each row only on the candidates marked active (``score(ids,
    keys, active)``, active [B, m]), so a round hands each row its own candidates, not as many as the neediest
    row's. Returns the step's output with ``tokens`` chosen."""
    z, ids = candidates(logits, plan.K)
    B, K = z.shape
    betas = [slot_betas(slot, steps, z.device) for slot in plan.slots]
    keys = set(bounds)
    others = {key for slot in plan.slots for _, key, _ in slot.groups} - keys
    rho = score(ids, others) if others else {}  # the rewards without bounds, on every candidate
    upper, lower = _bounds(z, plan, rho, betas, bounds)
    in_k = k_mask(plan, z.device)
    in_k = torch.ones_like(z, dtype=torch.bool) if in_k is None else in_k
    noise, q = _race(plan, ids, logits.shape[-1])
    top = (upper + noise).masked_fill(~in_k, float("-inf"))
    floor = (lower + noise).masked_fill(~in_k, float("-inf")).amax(-1, keepdim=True)
    live = torch.ones(B, dtype=torch.bool) if live is None else live
    wanted = ((top >= floor) & live[:, None]).sum(-1).clamp(max=ROUND_ONE)  # a row without a guess: ROUND_ONE
    if guess is not None and set(guess) == keys:
        guess = {key: g.to(z.device, z.dtype) for key, g in guess.items()}
        known = torch.stack([~g.isnan() for g in guess.values()]).all(0)  # [B]: rows with a last ρ
        at_guess = {**rho, **{key: g.nan_to_num(0.0)[:, None].expand(B, K) for key, g in guess.items()}}
        guessed = (combine_slots(z, plan, at_guess, betas)[0] + noise).masked_fill(~in_k, float("-inf"))
        reach = guessed.amax(-1, keepdim=True) - GUESS_MARGIN
        wanted = torch.where(known, ((top >= reach) & live[:, None]).sum(-1), wanted)
    first = max(2, int(wanted.max()))
    last = top.argsort(dim=-1, descending=True, stable=True)[:, :first]
    active = torch.arange(first)[None, :] < wanted.clamp(2, first)[:, None]  # each row's own; the rest padding
    values = {key: torch.zeros_like(z) for key in keys}
    scored = torch.zeros_like(z, dtype=torch.bool)
    width = 0.0
    while True:
        # a session that is not ragged scores the padding too, and its values count
        entered = active if ragged else torch.ones_like(active)
        _enter(values, scored, last, score(ids.gather(1, last), keys, active if ragged else None), entered)
        combined, shaped, reward_sum = combine_slots(z, plan, {**rho, **values}, betas)
        best, at = (combined + noise).masked_fill(~scored | ~in_k, float("-inf")).max(-1)
        need = ~scored & in_k & live[:, None] & (top >= best[:, None] - _margin(best)[:, None])
        more, bad, handed = torch.stack([need.sum(-1).max(), _outside(values, scored, bounds),
                                         entered.sum()]).tolist()
        width += handed / B
        if bad:  # a reward returned ρ outside the bounds it declares: score every candidate, as an unpruned step
            need = ~scored
            more = int(need.sum(-1).max())
        if not more:
            break
        rank = torch.where(need, torch.arange(K, 0, -1, device=z.device), 0)  # needed first, in candidate order
        extra = rank.topk(more, dim=-1).indices
        needed = need.gather(1, extra)
        extra = torch.where(needed, extra, at[:, None])  # a row with fewer: its best again
        last = torch.cat([at[:, None], extra], dim=1)  # each row's best first: its sessions must hold the winner
        active = torch.cat([torch.ones_like(needed[:, :1]), needed], dim=1)
    out = step_output(z, ids, plan, combined.masked_fill(~scored, float("-inf")), shaped, reward_sum, betas,
                      logits.shape[-1])
    out.tokens = sample(out.scores, plan.temperatures, plan.generators, plan.sampling, ids, q)
    pos = chosen_index(ids, out.tokens)[:, None]
    return PrunedOutput(**vars(out), scored_ids={key: ids.gather(1, last) for key in keys}, width=width,
                        chosen_rho={key: values[key].gather(1, pos)[:, 0] for key in keys})


def carry_guess(where: dict | None, guess: dict | None, rows: Sequence) -> dict | None:
    """The last step's guess (:attr:`PrunedOutput.chosen_rho`, rows at ``where[row]``) for a batch whose rows are now
    ``rows``: a row that stayed keeps its ρ, a newcomer gets NaN (its round one is the first step's)."""
    if not where or not guess:
        return None
    index = torch.tensor([where.get(row, -1) for row in rows], dtype=torch.long)
    if not (index >= 0).any():
        return None
    return {key: torch.where(index >= 0, g[index.clamp(min=0)], float("nan")) for key, g in guess.items()}


def _bounds(z: torch.Tensor, plan: BatchPlan, rho: dict, betas: list, bounds: dict):
    """Each candidate's least and greatest ``z + Σ β·f(ρ)`` [B, K], the bounded rewards anywhere in their bounds,
    summed slot by slot as :func:`~steerkit.engine.step.combine_slots` sums (so float rounding keeps the order)."""
    at_lo = {**rho, **{key: torch.full_like(z, lo) for key, (lo, _) in bounds.items()}}
    at_hi = {**rho, **{key: torch.full_like(z, hi) for key, (_, hi) in bounds.items()}}
    upper, lower = z.clone(), z.clone()
    for slot, beta in zip(plan.slots, betas):
        a, b = _slot_rewards(slot, at_lo, z), _slot_rewards(slot, at_hi, z)
        if isinstance(beta, float):
            if not beta:
                continue
            a, b = beta * a, beta * b
        else:
            beta = beta.to(z.device, z.dtype)[:, None]
            a, b = beta * a, beta * b
        upper, lower = upper + torch.maximum(a, b), lower + torch.minimum(a, b)
    return upper, lower


def _race(plan: BatchPlan, ids: torch.Tensor, vocab_size: int):
    """The race's noise, drawn now: ``-T·log q`` [B, K] (0 for a greedy row) and ``q`` itself (None when every row is
    greedy). A row's key ``scores + (-T·log q)`` orders its candidates as ``scores / T - log q`` does (T > 0), and
    stays finite for a tiny T (a temperature of 1e-45 makes ``1 / T`` infinite)."""
    sampling = plan.sampling
    if sampling.all_greedy:
        return torch.zeros(ids.shape), None
    q = candidate_noise(ids, vocab_size, sampling.draws)
    noise = -q.log()
    if sampling.greedy is not None:
        noise = noise.masked_fill(sampling.greedy.cpu()[:, None], 0.0)
    return plan.temperature_column * noise, q


def _margin(best: torch.Tensor) -> torch.Tensor:
    """A candidate within this of a row's best key is scored even if its bound says it loses: the choice's own
    arithmetic (``softmax`` then ``p / q`` in float32) may order near-ties differently from the keys."""
    return 1e-4 * (1.0 + best.abs().nan_to_num(posinf=0.0, neginf=0.0))


def _enter(values: dict, scored: torch.Tensor, where: torch.Tensor, rho: dict, entered: torch.Tensor) -> None:
    """Record the rewards ``rho`` ({key: [B, m]}) of candidates ``where`` [B, m] as scored where ``entered`` [B, m]
    says (a ragged round: the rest were not scored, or repeat a row's best; a repeat otherwise has the same value)."""
    at = (torch.arange(where.shape[0])[:, None].expand_as(where)[entered], where[entered])
    for key, v in rho.items():
        values[key][at] = v[entered].to(values[key].device, values[key].dtype)
    scored[at] = True


def _outside(values: dict, scored: torch.Tensor, bounds: dict) -> torch.Tensor:
    """A 0-d tensor: 1 where some scored value of a bounded reward lies outside its bounds."""
    out = torch.zeros((), dtype=torch.long)
    for key, (lo, hi) in bounds.items():
        v = values[key]
        out = out + (((v < lo) | (v > hi)) & scored).any().long()
    return out

"""The RAD step: the maths every surface runs, on a batch whose rows may each have their own settings.

``scores = z_topk + Σ_j β_j(t) · f_j(ρ_j)`` over the batch's top-``K`` candidates, each row masked to its own
top-``k`` (``topk`` is sorted, so a row's first ``k`` candidates are its own top-``k``), shifted to a row
maximum of 0, ``-inf`` on every other token; then each row's argmax (temperature 0) or a draw from
``softmax(scores / T)``.

Rows carry their settings as a :class:`BatchPlan` (built when rows join or leave, not per step): ``k[B]``,
the temperatures, the greedy mask, each row's generator (or the shared RNG) and the term *slots*: slot ``j``
holds every row's ``j``-th term, so each row adds its terms in its own order (``combined + β·ρ`` per slot;
a row without a ``j``-th term adds ``0·0``), exactly as a batch of that row alone would.

Sampling is ``torch.multinomial``'s own algorithm, written out so that rows with their own generators share
one batch: ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn over the row's ``[V]`` (one ``[B, V]`` draw for rows
that share the RNG, as ``generate`` and transformers do, one ``[1, V]`` draw per seeded row). A given seed
therefore draws what ``torch.multinomial`` drew before, token for token. On the CPU the RAD step makes the same
draws and takes the logarithm at its K candidates only (:func:`_draw_at`): 13.3 against 3.1 ms for 16 seeded rows
of SmolLM2's 49,152 tokens (measured with a training job on the other core).

Nothing here reads a tensor back to the host: the caller reads the sampled ids and the per-row ``ok`` flags
(:attr:`StepOutput.ok`, False where a reward was NaN/±inf or the scores overflowed) once, together.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import NonFiniteRewardError, SteerkitError

#: ``(row index tensor or None for all rows, reward key, transform)``: one group of a slot.
SlotGroup = tuple


@dataclass
class Slot:
    """Slot ``j``: the ``j``-th term of every row that has one."""

    groups: list  # [(index [b] or None, reward key, transform or None)]
    terms: list  # per batch row: its j-th SteeringTerm, or None
    shared: object  # the one SteeringTerm every row has here (generate, the LogitsProcessor), else None
    constant: torch.Tensor | None = None  # [B] β of rows whose terms' β never changes: made once, not per step


@dataclass
class BatchPlan:
    """The settings of the batch's rows, as tensors and lists the step reads without host syncs."""

    K: int  # candidates scored: the largest k of the batch
    k: torch.Tensor | None  # [B] per-row k, or None when every row's k is K
    temperatures: list[float]  # per row; 0 = greedy
    generators: list | None  # per row torch.Generator (None: greedy); None for the whole list: the shared RNG
    slots: list[Slot]
    sampling: "Sampling | None" = None  # how the rows draw, worked out once from temperatures and generators

    @property
    def size(self) -> int:
        return len(self.temperatures)

    @functools.cached_property
    def temperature_column(self) -> torch.Tensor:
        """The rows' temperatures as a float32 [B, 1] on the CPU (0 for a greedy row), made once per plan."""
        return torch.tensor([float(t) for t in self.temperatures], dtype=torch.float32)[:, None]


def make_plan(rows: Sequence, device, shared_rng: bool) -> BatchPlan:
    """The plan of ``rows`` (objects with ``k``, ``temperature``, ``generator`` and ``terms``)."""
    ks = [row.k for row in rows]
    K = max(ks)
    k = None if all(v == K for v in ks) else torch.tensor(ks, dtype=torch.long, device=device)
    slots = []
    for j in range(max((len(row.terms) for row in rows), default=0)):
        terms = [row.terms[j] if j < len(row.terms) else None for row in rows]
        by_key: dict = {}
        for b, term in enumerate(terms):
            if term is not None:
                by_key.setdefault((id(term.reward), term.transform_key), (term, []))[1].append(b)
        groups = []
        for term, members in by_key.values():
            index = None if len(members) == len(rows) else torch.tensor(members, dtype=torch.long, device=device)
            groups.append((index, id(term.reward), term.transform))
        shared = terms[0] if all(t is terms[0] for t in terms) else None
        constant = None
        if shared is None and all(t is None or t.schedule.kind == "constant" for t in terms):
            constant = torch.tensor([0.0 if t is None else t.schedule.beta for t in terms], dtype=torch.float32,
                                    device=device)
        slots.append(Slot(groups, terms, shared, constant))
    generators = None if shared_rng else [row.generator for row in rows]
    temperatures = [row.temperature for row in rows]
    return BatchPlan(K, k, temperatures, generators, slots, sampling_plan(temperatures, generators, device))


def shared_plan(k: int, terms: list, rows: int, temperature: float = 1.0) -> BatchPlan:
    """The plan of ``rows`` rows that share ``k``, ``terms`` (in order) and the RNG, built without looking at
    each row (the ``LogitsProcessor`` builds one per call)."""
    slots = [Slot([(None, id(t.reward), t.transform)], [t] * rows, t) for t in terms]
    temperatures = [temperature] * rows
    return BatchPlan(k, None, temperatures, None, slots, sampling_plan(temperatures, None))


@dataclass
class StepOutput:
    """One step of a batch: the chosen ids [B] (on the device), the per-row ``ok`` [B] (bool), and what traces
    and callers inspect."""

    tokens: torch.Tensor | None  # None until sampled
    ok: torch.Tensor
    topk_ids: torch.Tensor  # [B, K]
    topk_logits: torch.Tensor  # [B, K]
    combined: torch.Tensor  # [B, K]: z + Σ β ρ (before the k mask)
    shaped: list[torch.Tensor]  # per slot: [B, K] shaped rewards (0 for rows without that slot)
    betas: list  # per slot: a float, or a [B] tensor
    scores: torch.Tensor  # [B, V]: the shifted scores sampled from


def candidates(logits: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``K`` logits (float32) and ids of each row."""
    return logits.float().topk(K, dim=-1)


def slot_betas(slot: Slot, steps: Sequence[int], device=None) -> float | torch.Tensor:
    """β of every row in this slot at each row's step (0 for rows without the slot's term): one Python float
    when every row shares the term, else a float32 tensor [B] (the plan's, when no β in the slot changes)."""
    if slot.shared is not None and (slot.shared.schedule.kind == "constant" or len(set(steps)) == 1):
        return slot.shared.weight(steps[0])  # one Python float, as a batch sharing its terms always used
    if slot.constant is not None:
        return slot.constant
    return torch.tensor([0.0 if t is None else t.weight(s) for t, s in zip(slot.terms, steps)],
                        dtype=torch.float32, device=device)


def combine_slots(z: torch.Tensor, plan: BatchPlan, rho: dict, betas: list) -> tuple[torch.Tensor, list, torch.Tensor]:
    """``z + Σ_j β_j · f_j(ρ_j)`` ([B, K]), the shaped rewards per slot, and the per-row sum of them (for the
    finiteness check). ``rho`` maps each reward key to its raw rewards [B, K] (rows that do not use it: any)."""
    combined = z.clone()
    shaped = []
    reward_sum = None
    for slot, beta in zip(plan.slots, betas):
        values = _slot_rewards(slot, rho, z)
        shaped.append(values)
        reward_sum = values if reward_sum is None else reward_sum + values
        if isinstance(beta, float):
            if beta:
                combined = combined + beta * values
        else:
            combined = combined + beta.to(combined.device, combined.dtype)[:, None] * values
    return combined, shaped, reward_sum


def _slot_rewards(slot: Slot, rho: dict, like: torch.Tensor) -> torch.Tensor:
    if len(slot.groups) == 1 and slot.groups[0][0] is None:
        _, key, transform = slot.groups[0]
        values = rho[key].to(like.device, like.dtype)
        return transform(values) if transform is not None else values
    values = torch.zeros_like(like)
    for index, key, transform in slot.groups:
        part = rho[key].to(like.device, like.dtype).index_select(0, index)
        values.index_copy_(0, index, transform(part) if transform is not None else part)
    return values


def row_ok(combined: torch.Tensor, reward_sum: torch.Tensor | None, in_k: torch.Tensor | None) -> torch.Tensor:
    """[B] bool: no reward NaN/±inf and no score NaN/+inf among each row's own k candidates."""
    bad = ~(combined < math.inf)
    if reward_sum is not None:
        bad = bad | ~torch.isfinite(reward_sum)
    if in_k is not None:
        bad = bad & in_k
    return ~bad.any(-1)


def shifted_scores(combined: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Float32 scores [B, V]: ``combined`` [B, K] at ``ids`` [B, K], shifted to a row max of 0; -inf elsewhere.

    Shifted so that each row's best candidate scores 0 (softmax and argmax are shift-invariant): dividing by
    a tiny temperature then gives 0 and -inf instead of inf - inf = NaN, for steerkit.generate and for
    transformers' temperature after the LogitsProcessor alike. Done on [B, K], not on the [B, V] scores.
    """
    shifted = combined - combined.amax(dim=-1, keepdim=True)
    scores = torch.full((combined.shape[0], vocab_size), float("-inf"), dtype=torch.float32, device=combined.device)
    return scores.scatter_(1, ids, shifted)


@dataclass
class Sampling:
    """How a batch's rows choose, worked out once per batch (not per step) from their temperatures and
    generators: which rows are greedy, which rows are divided by which temperature, who draws from what."""

    greedy: torch.Tensor | None  # [B] bool where some but not all rows are greedy
    all_greedy: bool
    scale: list  # [(T, row index or None for all rows)]; empty: no division (every sampled row has T = 1)
    draws: list | None  # [(row, generator or None for a greedy row)]; None: one draw from the shared RNG


def sampling_plan(temperatures: Sequence[float], generators: list | None, device=None) -> Sampling:
    greedy = [t == 0 for t in temperatures]
    values = {t for t in temperatures if t != 0}
    if values == {1.0}:
        scale = []  # x / 1.0 == x exactly: one pass over [B, V] saved
    elif len(values) == 1 and len(values) == len(set(temperatures)):
        scale = [(next(iter(values)), None)]
    else:
        scale = [(t, torch.tensor([b for b, v in enumerate(temperatures) if v == t], dtype=torch.long,
                                  device=device)) for t in values]
    mask = torch.tensor(greedy, device=device) if any(greedy) and not all(greedy) else None
    draws = None if generators is None else [(b, None if greedy[b] else g) for b, g in enumerate(generators)]
    return Sampling(mask, all(greedy), scale, draws)


def sample(scores: torch.Tensor, temperatures: Sequence[float], generators: list | None,
           plan: Sampling | None = None, ids: torch.Tensor | None = None,
           noise: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's token [B]: argmax where its temperature is 0, else a draw from softmax(scores / T).

    ``generators`` None: the sampled rows share the default RNG, one ``[B, V]`` draw (``torch.multinomial`` on
    the batch); else each sampled row draws ``[1, V]`` from its own generator (``torch.multinomial`` on that
    row alone). Rows of one temperature are divided by it as a Python float, as ``generate`` always did.
    ``plan``: the batch's :class:`Sampling` (else worked out from ``temperatures`` and ``generators``).
    ``ids``: [B, K], where given every token outside a row's ``ids`` scores ``-inf``; on the CPU the noise is then
    made only at those tokens (:func:`_draw_at`), the same tokens for fewer logarithms. ``noise``: with ``ids``, the
    rows' draws at ``ids`` made already (:func:`candidate_noise`, which the pruned step draws before scoring).
    """
    plan = plan or sampling_plan(temperatures, generators, scores.device)
    if plan.all_greedy:
        return scores.argmax(-1)
    probs = torch.softmax(_scale(scores, plan.scale), dim=-1)
    if ids is not None and scores.device.type == "cpu" and (noise is not None or _candidate_draws_match()):
        tokens = _draw_at(probs, ids, plan.draws, noise)
    else:
        tokens = _draw(probs, plan.draws)
    if plan.greedy is not None:
        tokens = torch.where(plan.greedy, scores.argmax(-1), tokens)
    return tokens


def _draw(probs: torch.Tensor, draws: list | None) -> torch.Tensor:
    """``argmax(p / q)`` per row, ``q ~ Exp(1)`` drawn over the whole row ``[V]``."""
    noise = torch.empty_like(probs)
    if draws is None:
        noise.exponential_(1)
    else:  # a row of the noise is drawn in place: the same numbers as a fresh [1, V] tensor (tested)
        for b, g in draws:
            if g is None:
                noise[b].fill_(1.0)
            else:
                noise[b].exponential_(1, generator=g)
    return probs.div_(noise).argmax(-1)


#: 2**-53: a 53-bit integer times this is the double in [0, 1) that torch's CPU ``uniform_real`` makes of it
_UNIT = 2.0 ** -53


def _draw_at(probs: torch.Tensor, ids: torch.Tensor, draws: list | None,
             noise: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`_draw`'s tokens, with ``q`` computed only at each row's candidates ``ids`` [B, K] (every other token's
    probability is 0, so it cannot win ``argmax(p / q)``); ``noise``: that ``q`` (:func:`candidate_noise`)."""
    order = ids.argsort(dim=-1)  # the candidates in token-id order: argmax's first-index tie-break is the full row's
    ids = ids.gather(1, order)
    q = _sorted_noise(ids, probs.shape[1], draws) if noise is None else noise.gather(1, order)
    return ids.gather(1, probs.gather(1, ids).div_(q).argmax(-1, keepdim=True)).squeeze(1)


def candidate_noise(ids: torch.Tensor, vocab_size: int, draws: list | None) -> torch.Tensor:
    """The ``Exp(1)`` draws ``q`` [B, K] of a CPU step at each row's candidates ``ids`` [B, K] (in ``ids``' order):
    what :func:`sample` with ``ids`` draws, drawn before the step's choice (a greedy row's: 1). Each generator (or
    the shared RNG) advances as that draw advances it."""
    order = ids.argsort(dim=-1)
    q = _sorted_noise(ids.gather(1, order), vocab_size, draws)
    return torch.empty_like(q).scatter_(1, order, q)


def _sorted_noise(ids: torch.Tensor, V: int, draws: list | None) -> torch.Tensor:
    """``q`` at ``ids`` [B, K] (each row in token-id order), drawn as ``exponential_`` over each row's ``V`` tokens.

    On the CPU ``exponential_`` turns each of a row's ``V`` 64-bit draws into ``-log1p(-u)``, ``u`` = its low 53
    bits times 2**-53, in double, rounded to float32, one draw at a time. ``random_(0, 2**53)`` makes the same ``V``
    draws (vectorised) and leaves the generator in the same state; the logarithm is then taken at the K candidates
    only. About 5x cheaper per row at SmolLM2's 49,152 tokens. torch's vectorised ``log1p`` and the kernel's scalar
    one gave the same float32 noise on 9.8 million draws (none differed); :func:`_candidate_draws_match` checks the
    equivalence once per process, and ``tests/unit/test_engine_step.py`` the tokens and generator states."""
    B = ids.shape[0]
    if draws is None:
        return _exponential(torch.empty((B, V), dtype=torch.int64).random_(0, 1 << 53).gather(1, ids))
    q = torch.ones(ids.shape, dtype=torch.float32)  # a greedy row's: its token is its argmax anyway
    for b, g in draws:
        if g is not None:
            q[b] = _exponential(torch.empty(V, dtype=torch.int64).random_(0, 1 << 53, generator=g)[ids[b]])
    return q


def _exponential(bits: torch.Tensor) -> torch.Tensor:
    """float32 ``Exp(1)`` noise from 53-bit draws, as torch's CPU ``exponential_`` makes it."""
    return torch.log1p(bits.to(torch.float64).mul_(-_UNIT)).neg_().to(torch.float32)


@functools.cache
def _candidate_draws_match() -> bool:
    """Whether this torch's CPU ``exponential_`` is what :func:`_draw_at` assumes (true of torch 2.x): checked
    once, on 4,096 draws of a seeded generator. False sends every draw down :func:`_draw`."""
    generator = torch.Generator().manual_seed(20_251_126)
    expected = torch.empty(4096).exponential_(1, generator=generator)
    generator.manual_seed(20_251_126)
    bits = torch.empty(4096, dtype=torch.int64).random_(0, 1 << 53, generator=generator)
    return torch.equal(_exponential(bits), expected)


def _scale(scores: torch.Tensor, scale: list) -> torch.Tensor:
    if not scale:
        return scores
    if len(scale) == 1 and scale[0][1] is None:
        return scores / scale[0][0]
    scaled = scores.clone()
    for t, index in scale:
        scaled.index_copy_(0, index, scores.index_select(0, index) / t)
    return scaled


def score_step(logits: torch.Tensor, plan: BatchPlan, score: Callable[[torch.Tensor], dict],
               steps: Sequence[int]) -> StepOutput:
    """Everything of a RAD step but the choice: top-K, every reward scored (``score(topk_ids) -> {reward key:
    [B, K]}``), Σ β ρ per slot, the per-row ``ok``, each row's k mask and the shifted scores [B, V]."""
    z, ids = candidates(logits, plan.K)
    rho = score(ids)
    betas = [slot_betas(slot, steps, z.device) for slot in plan.slots]
    return step_output(z, ids, plan, *combine_slots(z, plan, rho, betas), betas, logits.shape[-1])


def k_mask(plan: BatchPlan, device) -> torch.Tensor | None:
    """[B, K] bool: each row's own top-``k`` among the batch's K candidates; None when every row's k is K."""
    if plan.k is None:
        return None
    return torch.arange(plan.K, device=device)[None, :] < plan.k[:, None]


def step_output(z: torch.Tensor, ids: torch.Tensor, plan: BatchPlan, combined: torch.Tensor, shaped: list,
                reward_sum: torch.Tensor | None, betas: list, vocab_size: int) -> StepOutput:
    """A step's output before the choice, from its combined scores [B, K]: the per-row ``ok``, each row masked to its
    own k, and the shifted scores [B, V]."""
    in_k = k_mask(plan, z.device)
    ok = row_ok(combined, reward_sum, in_k)
    masked = combined if in_k is None else combined.masked_fill(~in_k, float("-inf"))
    return StepOutput(None, ok, ids, z, combined, shaped, betas, shifted_scores(masked, ids, vocab_size))


def rad_step(logits: torch.Tensor, plan: BatchPlan, score: Callable[[torch.Tensor], dict],
             steps: Sequence[int]) -> StepOutput:
    """One RAD step over a batch: :func:`score_step`, then each row's choice (:func:`sample`)."""
    out = score_step(logits, plan, score, steps)
    out.tokens = sample(out.scores, plan.temperatures, plan.generators, plan.sampling, out.topk_ids)
    return out


def chosen_index(topk_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B]: each row's token ``tokens`` [B] as an index among its candidates ``topk_ids`` [B, K] (0 for a token
    that is not one)."""
    return (topk_ids == tokens[:, None]).long().argmax(-1)


def raise_non_finite(topk_ids, topk_logits, rewards, terms, step) -> None:
    """The slow path of a step's ``ok`` check: find which term (or the LM) is to blame."""
    where = f"at decoding step {step} (counting from 0)"
    for term in terms:
        rho = rewards[term.name]
        bad = ~torch.isfinite(rho)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            raise NonFiniteRewardError(
                f"Reward {term.name!r} returned {float(rho[row, col])} {where} for row {row}, candidate token id "
                f"{int(topk_ids[row, col])} ({int(bad.sum())} of {bad.numel()} candidates non-finite). The reward "
                "model is broken (e.g. NaN weights) or not a probability; check it with `steerkit score`.")
    for term in terms:
        beta = term.weight(step)
        if beta and not torch.isfinite(beta * rewards[term.name]).all():
            raise NonFiniteRewardError(
                f"beta * reward of {term.name!r} (beta={beta:g}) overflowed float32 {where}: the reward returned "
                f"values up to {float(rewards[term.name].abs().max()):g}, far outside [0, 1].")
    if not (topk_logits < math.inf).all():
        raise SteerkitError(f"The language model's next-token logits are NaN or +inf {where}; the LM's weights "
                            "or its dtype are broken (try float32).")
    raise NonFiniteRewardError(f"The steered scores z + sum(beta * reward) overflowed float32 {where}; lower "
                               "the betas or use rewards in [0, 1].")

"""The one engine core: a batch of rows, their LM cache, their reward sessions, and the decode step.

Every surface decodes through :class:`EngineCore`: :func:`steerkit.generate` (rows that share their settings and
one RNG, prefilled together; a finished row stays in the batch, fed padding, until the batch ends, exactly as
transformers' ``generate`` does), and the HTTP server's continuous batching (rows with their own settings
and generators, prefilled apart from the running rows, joining and leaving between steps). The batch, evaluation
runs, Ray actors and distillation reach it through ``generate``.

A step (:meth:`EngineCore.step`): the LM's next-token logits of every row, the RAD step of
:mod:`steerkit.engine.step` (top-K, each reward scored only on the rows that use it, Σ β ρ, each row's k
mask, each row's choice), one read of the chosen ids and the rows' ``ok`` flags, each row's text and finish,
reward sessions committed. The caller then drops finished rows (:meth:`remove`) and calls :meth:`advance`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..rewards.base import candidate_bounds
from .lm_cache import lm_batch
from .pruning import Gate, can_prune, carry_guess, prunable, pruned_step
from .reward_groups import RewardGroup, join_groups, prepare_lm_state
from .rows import Row, distinct_prompts
from .step import BatchPlan, StepOutput, chosen_index, make_plan, rad_step, raise_non_finite


#: Whether the engine commits each row's choice to the reward sessions by its index among the candidates
#: (``commit_chosen``, no read-back from a GPU); False: by token (``commit``), what ``benchmarks/bench_gpu.py``'s
#: ``compiled-search-commit`` mode compares it with.
COMMIT_BY_INDEX = True

#: Whether a CPU step scores bounded rewards only on the candidates that can still be chosen
#: (:mod:`steerkit.engine.pruning`: the same choice); False: every reward on all k, what benchmarks compare it with.
PRUNE_CANDIDATES = True


@dataclass
class Emitted:
    """What a step did to one row: its token, the text that became final, its finish reason (None: it goes
    on), the traced rewards of the chosen token."""

    row: Row
    token: int
    text: str
    finish: str | None
    rewards: dict[str, float] | None = None


@dataclass
class StepReport:
    emitted: list[Emitted]
    failed: dict  # row -> exception
    output: StepOutput | None = None
    reward_seconds: dict[str, float] = field(default_factory=dict)


class EngineCore:
    """Rows, their LM cache and reward groups, and the step. ``shared_rng``: the rows draw from the default RNG
    together (``generate``); otherwise each sampled row draws from its own generator. ``strict``: a reward's
    failure raises (``generate``); otherwise it fails only the rows it hit (the server)."""

    def __init__(self, lm, tokenizer, *, eos: Sequence[int] = (), vocab_size: int, shared_rng: bool = False,
                 strict: bool = False, names=None, stream_text: bool = True):
        self.lm, self.tokenizer = lm, tokenizer
        self.eos = set(eos)
        self.vocab_size = vocab_size
        self.shared_rng, self.strict = shared_rng, strict
        self.stream_text = stream_text  # False: a row's text is tracked only to find its stop strings
        self.batch = lm_batch(lm)
        self.rows: list[Row] = []
        self.groups: dict[int, RewardGroup] = {}
        self._names = names or (lambda reward: getattr(reward, "name", "reward"))
        self._plan: BatchPlan | None = None
        self._where: dict | None = None  # row -> batch index in the plan (set with it)
        self._guess: dict | None = None  # pruning's guess: each row's last chosen ρ (pruning.carry_guess)
        self._gate = Gate()  # kept while rows come and go: whether pruning pays depends on the batch, not the rows
        self.last_tokens: torch.Tensor | None = None  # the step's tokens as committed (padding for finished rows)
        self._stepped: list[Row] = []

    # -- rows joining and leaving -------------------------------------------------------------------------
    def admit(self, rows: list[Row], *, together: bool = False, prefilled: dict | None = None) -> dict:
        """Prefill newcomers and start their reward sessions: apart from the running rows (the server; newcomers
        that arrive together share padded forwards, :meth:`_prefill`), or ``together`` in one left-padded forward
        (``generate``: the batch must be empty).
        ``prefilled``: rows whose prompt already ran (``{row: Prefilled}``, the server's chunked prefill).
        Returns ``{row: exception}`` for rows that could not start (``strict``: raises)."""
        prefilled = prefilled or {}
        failed: dict = {}
        prepare_lm_state(self.batch, rows)
        if together:
            for row in rows:
                row.start(self.tokenizer, self.batch.device, self.shared_rng, self.stream_text)
            self.batch.prefill_padded([row.prompt_ids for row in rows], self.tokenizer)
            ready = list(rows)
        else:
            started = []
            for row in rows:
                try:
                    row.start(self.tokenizer, self.batch.device, self.shared_rng, self.stream_text)
                    started.append(row)
                except Exception as exc:  # noqa: BLE001
                    if self.strict:
                        raise
                    failed[row] = exc
            runs = dict(prefilled)
            runs.update(self._prefill([row for row in started if row not in prefilled], failed))
            ready = [row for row in started if row in runs]
            self.batch.join([runs[row] for row in ready])
        self.rows += ready
        self._plan = None
        failed.update(self._join_rewards(ready))
        return failed

    def _prefill(self, rows: list[Row], failed: dict) -> dict:
        """``{row: Prefilled}`` of newcomers that arrive together, prefilled apart from the running rows: each distinct
        prompt once (a request's ``n`` rows share it: the others get copies, ``copy_prefilled``), in padded forwards of
        similar lengths where the LM's batch offers ``prefill_many``; if such a forward fails, each prompt is
        prefilled alone, so that only rows whose prompt fails alone fail (into ``failed``)."""
        runs, pick = distinct_prompts([row.prompt_ids for row in rows])
        leaders = [rows[i] for i in runs]
        done = self._prefill_distinct(leaders, failed)
        out = {}
        for row, run in zip(rows, pick):
            leader = leaders[run]
            if leader in failed:
                failed[row] = failed[leader]
            elif row is leader:
                out[row] = done[row]
            else:
                try:
                    out[row] = self.batch.copy_prefilled(done[leader])
                except Exception as exc:  # noqa: BLE001
                    if self.strict:
                        raise
                    failed[row] = exc
        return out

    def _prefill_distinct(self, rows: list[Row], failed: dict) -> dict:
        many = getattr(self.batch, "prefill_many", None)
        if len(rows) > 1 and many is not None:
            try:
                return dict(zip(rows, many([row.prompt_ids for row in rows])))
            except Exception:  # noqa: BLE001 - retried row by row below
                if self.strict:
                    raise
        out = {}
        for row in rows:
            try:
                out[row] = self.batch.prefill(row.prompt_ids)
            except Exception as exc:  # noqa: BLE001
                if self.strict:
                    raise
                failed[row] = exc
        return out

    def _join_rewards(self, rows: list[Row]) -> dict:
        # the LM whose final hidden state this batch keeps, for rewards that read it (the static-shape step keeps
        # none: such a reward's rows then fail to join, saying so; llama.cpp's keeps it once asked, prepare_lm_state)
        lm = self.lm if getattr(self.batch, "supports_lm_state", False) else None
        return join_groups(self.groups, rows, self.tokenizer, strict=self.strict, name_of=self._names, lm=lm)

    def remove(self, gone) -> dict:
        """Drop rows from the batch and every reward group; returns rows that broke while groups were rebuilt."""
        gone = set(gone)
        if not gone:
            return {}
        keep = [b for b, row in enumerate(self.rows) if row not in gone]
        self.rows = [self.rows[b] for b in keep]
        if self.batch.size:
            self.batch.keep(torch.tensor(keep, dtype=torch.long))
        more: dict = {}
        for key in list(self.groups):
            group = self.groups[key]
            more.update(group.leave(gone))
            if not group.parts:
                del self.groups[key]
        self._plan = None
        return {r: e for r, e in more.items() if r in self.rows}

    def reset(self) -> None:
        self.rows, self.groups, self._plan = [], {}, None
        self.batch.reset()

    @property
    def plan(self) -> BatchPlan:
        """The rows' settings as the step reads them, with each row's batch index and whether any row traces:
        worked out when rows join or leave, not per step."""
        if self._plan is None:
            before = self._where, self._guess
            self._plan = make_plan(self.rows, self.batch.device, self.shared_rng)
            self._where = {row: b for b, row in enumerate(self.rows)}
            self._tracing = any(row.trace for row in self.rows)
            self._bounds = self._prunable(self._plan)
            self._ragged = all(self.groups[key].ragged for key in self._bounds)  # sessions take each row's own
            self._guess = carry_guess(*before, self.rows)  # each row's last chosen ρ in this plan's order (NaN: none)
            self._live = None  # [B] bool once a row of a shared batch has finished (it stays, fed padding)
        return self._plan

    def _prunable(self, plan: BatchPlan) -> dict:
        """The rewards whose candidates a step may leave out (:mod:`steerkit.engine.pruning`), with their bounds."""
        if not PRUNE_CANDIDATES or not can_prune(plan, self.batch.device):
            return {}
        bounds = {key: candidate_bounds(group.reward) for key, group in self.groups.items() if group.parts}
        return prunable(plan, {key: b for key, b in bounds.items() if b is not None})

    # -- the step ---------------------------------------------------------------------------------------
    def step(self, *, keep_output: bool = False) -> StepReport:
        """One decoding step of every row (finished rows of a shared batch included, fed padding). ``keep_output``:
        the report keeps the step's output, every reward on all k candidates (traces)."""
        rows, plan, where = self.rows, self.plan, self._where
        failed: dict = {}
        seconds: dict[str, float] = {}

        def score(ids: torch.Tensor, keys: set | None = None, active: torch.Tensor | None = None) -> dict:
            rho = {}
            for key, group in self.groups.items():
                if group.parts and (keys is None or key in keys):
                    start = time.perf_counter()
                    state = self.batch.hidden if group.reads_state else None
                    rho[key], errors = group.score(ids, where, state, active)
                    seconds[group.name] = seconds.get(group.name, 0.0) + time.perf_counter() - start
                    failed.update(errors)
            return rho

        steps = [row.steps for row in rows]
        if self._bounds and not keep_output and self._gate.open():
            out = pruned_step(self.batch.logits, plan, score, steps, self._bounds, self._live, self._guess,
                              self._ragged)
            self._gate.record(out.width, plan.K)
            self._guess = out.chosen_rho
        else:
            out = rad_step(self.batch.logits, plan, score, steps)
        tokens, ok = torch.stack([out.tokens, out.ok.to(out.tokens.dtype)]).tolist()  # the step's one read
        if not all(ok):
            self._non_finite(out, [b for b, v in enumerate(ok) if not v], failed)
        emitted, padded = self._emit(out, tokens, failed)
        self._commit(out, padded, where, failed, seconds)
        return StepReport(emitted, failed, out if keep_output else None, seconds)

    def _non_finite(self, out: StepOutput, bad: list[int], failed: dict) -> None:
        """A row whose reward was NaN/±inf (or whose scores overflowed) fails; ``strict``: the call raises,
        naming the reward (and row) over the whole batch, as ``generate`` always did."""
        if self.strict:
            terms = self.rows[0].terms
            raise_non_finite(out.topk_ids, out.topk_logits, {t.name: out.shaped[j] for j, t in enumerate(terms)},
                             terms, self.rows[0].steps)
        for b in bad:
            row = self.rows[b]
            if row in failed:
                continue
            rewards = {t.name: out.shaped[j][b:b + 1, :row.k] for j, t in enumerate(row.terms)}
            try:
                raise_non_finite(out.topk_ids[b:b + 1, :row.k], out.topk_logits[b:b + 1, :row.k], rewards,
                                 row.terms, row.steps)
            except Exception as exc:  # noqa: BLE001 - this row only
                failed[row] = exc

    def _emit(self, out: StepOutput, tokens: list[int], failed: dict) -> tuple[list[Emitted], list[int]]:
        """Each row's token, text and finish; also the positions of rows that had already finished (a shared
        batch feeds them padding)."""
        traced = self._traced_rewards(out) if self._tracing else None
        emitted, padded = [], []
        for b, row in enumerate(self.rows):
            row.steps += 1
            if row.finished:
                padded.append(b)
                continue
            if row in failed:
                continue
            token = tokens[b]
            row.ids.append(token)
            eos = token in self.eos
            last = eos or len(row.ids) >= row.max_tokens
            delta, stopped = ("", False) if row.text is None else row.text.push(row.ids[:-1] if eos else row.ids,
                                                                               final=last)
            finish = "stop" if eos or stopped else ("length" if last else None)
            row.finished = finish is not None
            if row.finished and self._bounds:  # a shared batch keeps it: its draws no longer count when pruning
                self._live = (torch.ones(len(self.rows), dtype=torch.bool) if self._live is None else self._live)
                self._live[b] = False
            rewards = None
            if traced is not None and row.trace:
                rewards = {t.name: traced[j][b] for j, t in enumerate(row.terms)}
            emitted.append(Emitted(row, token, delta, finish, rewards))
        return emitted, padded

    @staticmethod
    def _traced_rewards(out: StepOutput) -> list[list[float]]:
        """Per slot, each row's shaped reward of its chosen token (one read for all)."""
        if not out.shaped:
            return []
        chosen = chosen_index(out.topk_ids, out.tokens)[:, None]
        return torch.stack([s.gather(1, chosen)[:, 0] for s in out.shaped]).tolist()

    def _commit(self, out: StepOutput, padded: list[int], where: dict, failed: dict, seconds: dict) -> None:
        """Tell the reward sessions each row's token (a finished row of a shared batch: its padding) and its index
        among the step's candidates."""
        tokens = out.tokens
        if padded:
            tokens = tokens.index_fill(0, torch.tensor(padded, device=tokens.device), self._pad_id())
        by_index = COMMIT_BY_INDEX and any(g.parts for g in self.groups.values())
        chosen = chosen_index(out.topk_ids, tokens) if by_index else None
        scored = getattr(out, "scored_ids", None) or {}  # a pruned step's: what each bounded reward scored last
        self.last_tokens, self._stepped = tokens, list(self.rows)
        for key, group in self.groups.items():
            if group.parts:
                start = time.perf_counter()
                index = chosen_index(scored[key], tokens) if by_index and key in scored else chosen
                for row, exc in group.commit(tokens, where, index).items():
                    failed.setdefault(row, exc)
                seconds[group.name] = seconds.get(group.name, 0.0) + time.perf_counter() - start

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = min(self.eos) if self.eos else 0
        return pad

    def advance(self) -> None:
        """The LM reads each remaining row's newest token (a finished row of a shared batch: its padding)."""
        tokens = self.last_tokens
        if self.rows != self._stepped:
            position = {row: b for b, row in enumerate(self._stepped)}
            index = torch.tensor([position[row] for row in self.rows], dtype=torch.long, device=tokens.device)
            tokens = tokens.index_select(0, index)
        self.batch.advance(tokens)

"""Reward sessions over the rows that use them, with rows joining and leaving, and failures kept to one row.

A :class:`RewardGroup` is one reward object and the running rows whose terms use it; only those rows are
scored (a row without the reward costs it nothing). The alternative, one session over every running row with
β = 0 for rows that do not use the reward, is simpler but pays for all rows: with 16 rows of which 8 use the
shipped ``toxicity`` reward (k = 20, SmolLM2, 1 CPU thread), a step of the 8-row session took 117 ms against
180 ms for the 16-row one (``benchmarks/bench_engine.py``, ``coverage_smollm2``). Its rows live in *parts*,
each one reward session:

* normally one part holds every row (newcomers are started together and merged in with ``add_rows``; rows
  that leave are dropped with ``keep_rows``);
* a reward whose sessions lack ``keep_rows`` / ``add_rows`` (a plugin's) gets one part per row instead;
* when a part with several rows raises (in ``score``, ``commit``, ``keep_rows`` or ``add_rows``), nobody can
  tell which row broke it, so each of its rows is *rebuilt alone*: a fresh session started on the row's
  prompt, its generated tokens replayed through ``commit``. A row whose own rebuild or scoring raises fails;
  the others continue in single-row parts (a cost paid only after a failure).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rewards.base import reads_lm_state, scores_ragged, supports_row_changes
from .rows import Row


@dataclass
class Part:
    rows: list[Row]
    session: object
    batched: bool  # more rows may join this part (its session supports row changes)
    _index: tuple = (None, None)  # (the batch's row -> index map it was made for, index tensor)

    def index(self, where: dict, device) -> torch.Tensor:
        """The batch positions of this part's rows; made again only when the batch's rows changed (the engine
        core keeps one ``where`` map until rows join or leave)."""
        if self._index[0] is not where:
            self._index = (where, torch.tensor([where[r] for r in self.rows], dtype=torch.long, device=device))
        return self._index[1]


def prepare_lm_state(batch, rows) -> None:
    """Before ``rows`` are prefilled: an LM batch that keeps the LM's final hidden states only when asked
    (``keep_lm_state``: llama.cpp's) keeps them if a reward of these rows reads them."""
    keep = getattr(batch, "keep_lm_state", None)
    if keep is not None and any(reads_lm_state(term.reward) for row in rows for term in row.terms):
        keep()


def join_groups(groups: dict, rows: list, tokenizer, *, strict: bool, name_of, lm=None) -> dict:
    """Add ``rows`` to the reward groups of ``groups`` (``{id(reward): RewardGroup}``), one group per reward their
    terms use (made on first use, named ``name_of(reward)``). Returns ``{row: exception}`` for rows that could not
    join. The engine core and a host engine's batch (:mod:`steerkit.integrations.batch`) both join through it.
    ``lm``: the LM whose final hidden state the caller hands to rewards that read it (the engine core's; a host
    engine hands none, so such a reward's rows fail to join with
    :class:`~steerkit.errors.LMStateUnavailableError`)."""
    by_reward: dict[int, list] = {}
    for row in rows:
        for reward in {id(t.reward): t.reward for t in row.terms}.values():
            by_reward.setdefault(id(reward), []).append(row)
            if id(reward) not in groups:
                groups[id(reward)] = RewardGroup(name_of(reward), reward, tokenizer, strict, lm=lm)
    failed: dict = {}
    for key, members in by_reward.items():
        failed.update(groups[key].join(members))
    return failed


class RewardGroup:
    """One reward and its parts. Methods return ``{row: exception}`` for the rows that failed; a ``strict``
    group (``steerkit.generate``: one failure fails the call) raises instead, and never rebuilds rows.
    A reward that reads the LM's own state (:attr:`reads_state`) starts its sessions on ``lm`` and is scored with
    the rows' hidden states (``lm_state`` of :meth:`score`)."""

    def __init__(self, name: str, reward, tokenizer, strict: bool = False, *, lm=None):
        self.name, self.reward, self.tokenizer, self.strict = name, reward, tokenizer, strict
        self.lm = lm
        self.reads_state = reads_lm_state(reward)
        self.parts: list[Part] = []
        self.batched: bool | None = None  # unknown until a first session is seen

    @property
    def rows(self) -> list[Row]:
        return [r for p in self.parts for r in p.rows]

    # -- rebuilding --------------------------------------------------------------------------------------
    def _start(self, rows: list[Row]):
        """A session over ``rows`` (which have generated equally many tokens), their tokens replayed."""
        prompts = [r.prompt for r in rows]
        session = (self.reward.start(prompts, self.tokenizer, lm=self.lm) if self.reads_state
                   else self.reward.start(prompts, self.tokenizer))
        for t in range(len(rows[0].ids)):
            session.commit(torch.tensor([r.ids[t] for r in rows], dtype=torch.long))
        return session

    def _alone(self, row: Row) -> Part:
        """A single-row part for ``row``, replaying its generated tokens; raises what the reward raises."""
        return Part([row], self._start([row]), False)

    def _rebuild(self, rows: list[Row], failed: dict) -> list[Part]:
        parts = []
        for row in rows:
            try:
                parts.append(self._alone(row))
            except Exception as exc:  # noqa: BLE001 - the reward's failure is this row's failure
                failed[row] = exc
        return parts

    # -- rows joining and leaving ------------------------------------------------------------------------
    def join(self, rows: list[Row]) -> dict:
        """Start sessions for newcomers and merge them in. A newcomer that has generated tokens already (a host
        engine's request resumed after preemption, ``steerkit.integrations``) has them replayed first; newcomers
        of different lengths join as one cohort per length."""
        lengths = sorted({len(r.ids) for r in rows})
        if len(lengths) > 1:
            failed: dict = {}
            for n in lengths:
                failed.update(self.join([r for r in rows if len(r.ids) == n]))
            return failed
        failed = {}
        if self.strict:
            self.parts.append(Part(list(rows), self._start(rows), False))
            return failed
        try:
            session = self._start(rows)
        except Exception:  # noqa: BLE001 - find the rows that break it
            self.parts += self._rebuild(rows, failed)
            return failed
        if self.batched is None:
            self.batched = supports_row_changes(session)
        if not self.batched:
            if len(rows) == 1:
                self.parts.append(Part(rows, session, False))
            else:
                self.parts += self._rebuild(rows, failed)
            return failed
        main = next((p for p in self.parts if p.batched), None)
        if main is None:
            self.parts.append(Part(list(rows), session, True))
            return failed
        try:
            main.session.add_rows(session)
            main.rows += rows
        except Exception:  # noqa: BLE001 - the merged session is in an unknown state: rebuild every row alone
            self.parts.remove(main)
            self.parts += self._rebuild(main.rows + rows, failed)
        return failed

    def leave(self, gone: set) -> dict:
        """Drop the rows in ``gone`` (call between steps, after commit)."""
        failed: dict = {}
        for part in list(self.parts):
            keep = [i for i, r in enumerate(part.rows) if r not in gone]
            if len(keep) == len(part.rows):
                continue
            self.parts.remove(part)
            if not keep:
                continue
            rows = [part.rows[i] for i in keep]
            try:
                part.session.keep_rows(torch.tensor(keep, dtype=torch.long))
                self.parts.append(Part(rows, part.session, part.batched))
            except Exception:  # noqa: BLE001
                self.parts += self._rebuild(rows, failed)
        return failed

    # -- a step ------------------------------------------------------------------------------------------
    @property
    def ragged(self) -> bool:
        """Whether every part's session scores each row only on the candidates ``active`` marks
        (:func:`~steerkit.rewards.base.scores_ragged`)."""
        return all(scores_ragged(part.session) for part in self.parts)

    def score(self, candidates: torch.Tensor, where: dict, lm_state: torch.Tensor | None = None,
              active: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Rewards [B, K] of ``candidates`` [B, K] (rows at batch index ``where[row]``; rows outside the group
        get 0), and failures. ``lm_state`` [B, d]: the LM's final hidden state of every row (for a reward that
        reads it). ``active`` [B, K]: the candidates the caller reads, handed to a ``ragged`` session (the others
        may score anything)."""
        failed: dict = {}
        if self.strict:  # one part, every row of the batch in order
            return self._score(self.parts[0], candidates, lm_state, active), failed
        values = torch.zeros(candidates.shape, dtype=torch.float32, device=candidates.device)
        for part in list(self.parts):
            index = part.index(where, candidates.device)
            try:
                rho = self._score(part, candidates.index_select(0, index),
                                  None if lm_state is None else lm_state.index_select(0, index),
                                  None if active is None else active.index_select(0, index))
            except Exception as exc:  # noqa: BLE001
                self.parts.remove(part)
                if len(part.rows) == 1:
                    failed[part.rows[0]] = exc
                    continue
                for single in self._rebuild(part.rows, failed):
                    row = single.rows[0]
                    try:
                        b = where[row]
                        state = None if lm_state is None else lm_state[b][None]
                        values[b] = self._score(single, candidates[b][None], state)[0]
                        self.parts.append(single)
                    except Exception as exc:  # noqa: BLE001
                        failed[row] = exc
                continue
            values.index_copy_(0, index, rho.to(values.device, values.dtype))
        return values, failed

    def _score(self, part: Part, candidates: torch.Tensor, lm_state: torch.Tensor | None = None,
               active: torch.Tensor | None = None) -> torch.Tensor:
        if self.reads_state:
            rho = part.session.score(candidates, lm_state)
        elif active is not None and scores_ragged(part.session):
            rho = part.session.score(candidates, active=active)
        else:
            rho = part.session.score(candidates)
        if not isinstance(rho, torch.Tensor) or tuple(rho.shape) != tuple(candidates.shape):
            raise TypeError(f"a reward session's score() returned {type(rho).__name__} of shape "
                            f"{tuple(getattr(rho, 'shape', ()))}; expected a tensor of shape {tuple(candidates.shape)}")
        return rho

    def commit(self, tokens: torch.Tensor, where: dict, chosen: torch.Tensor | None = None) -> dict:
        """Tell every part the chosen tokens (rows' ``ids`` already end with them); ``chosen`` [B]: each token's index
        among the step's candidates, for a session that takes it (``commit_chosen``: :mod:`steerkit.rewards.base`)."""
        failed: dict = {}
        if self.strict:
            _commit(self.parts[0].session, tokens, chosen)
            return failed
        for part in list(self.parts):
            index = part.index(where, tokens.device)
            try:
                _commit(part.session, tokens.index_select(0, index),
                        None if chosen is None else chosen.index_select(0, index))
            except Exception as exc:  # noqa: BLE001
                self.parts.remove(part)
                if len(part.rows) == 1:
                    failed[part.rows[0]] = exc
                else:
                    self.parts += self._rebuild(part.rows, failed)  # replays the new tokens too
        return failed


def _commit(session, tokens: torch.Tensor, chosen: torch.Tensor | None) -> None:
    """``session.commit_chosen(tokens, chosen)`` where the session offers it and ``chosen`` is known, else
    ``session.commit(tokens)``."""
    commit_chosen = None if chosen is None else getattr(session, "commit_chosen", None)
    if commit_chosen is not None:
        commit_chosen(tokens, chosen)
    else:
        session.commit(tokens)

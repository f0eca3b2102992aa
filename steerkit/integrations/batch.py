"""RAD inside an engine that owns the batch: it schedules rows, runs the LM and samples; steerkit sees each step's
logits and reweights the steered rows' top-k (vLLM's v1 logits processors, :mod:`steerkit.integrations.vllm`).

:class:`HostedBatch` keeps one engine :class:`~steerkit.engine.rows.Row` per steered batch index and follows
the host's batch changes, applied in the host's order: ``remove(i)``, then ``add(i, ...)`` (which may overwrite a
row at ``i``), then ``move(a, b)`` (a one-way move overwrites whatever was at ``b``, a finished row included; a
swap exchanges). Unsteered rows have no entry and cost nothing.

The rewards: one :class:`~steerkit.engine.reward_groups.RewardGroup` per reward over the rows that use it, as in
:class:`~steerkit.engine.core.EngineCore`, so a reward session is shared by every row that uses it and rows join
(``add_rows``) and leave (``keep_rows``) between steps. The rewards score the tokens the host committed: at each
step, before scoring, each row's newest token is read from the host's live list of its output ids and committed
to its sessions. A row is normally one token ahead of its sessions; a row that is not (its first step, a prompt
still being prefilled in chunks, a request resumed after preemption with its old output, a host that fills the
list a step late: trailing ``-1`` placeholders, read as not yet known) leaves its groups and joins again with
its known tokens replayed (:meth:`RewardGroup.join`), so nobody scores a wrong prefix.

The step is :func:`steerkit.engine.step.score_step` on the steered rows' logits: every non-top-k logit of a steered
row becomes -inf and its top-k get ``z + Σ β·f(ρ)`` (shifted to a row maximum of 0), and the host's sampler then
applies its own temperature, seed and top-p: it samples from ``softmax((z_topk + Σ β·f(ρ)) / T)``, as
:func:`steerkit.generate` does. A row whose reward fails (raises, or returns NaN/±inf) ends: from then on only its
EOS token is allowed, and the error is logged; the other rows go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..engine.reward_groups import RewardGroup, join_groups
from ..engine.rows import Row
from ..engine.step import BatchPlan, make_plan, raise_non_finite, score_step

log = logging.getLogger("steerkit.integrations")


@dataclass(eq=False)
class Entry:
    """A steered batch index: its engine row and the host's live list of the row's generated ids."""

    row: Row
    output: list  # the host's list (it grows as the host commits tokens; -1: a placeholder not yet filled)
    joined: bool = False  # the row's reward sessions exist and have committed ``row.ids``
    failed: bool = False


def known_tokens(output: list) -> list[int]:
    """The host's committed ids of a row: its output list up to the first placeholder (-1)."""
    ids = list(output)
    if -1 in ids:
        ids = ids[:ids.index(-1)]
    return ids


class HostedBatch:
    """The steered rows of a host engine's batch (by index), their reward groups, and the step."""

    def __init__(self, tokenizer, eos_ids=()):
        self.tokenizer = tokenizer
        self.eos_ids = [int(i) for i in eos_ids if i is not None]
        self.entries: dict[int, Entry] = {}
        self.groups: dict[int, RewardGroup] = {}
        self._gone: set[Row] = set()
        self._plan: tuple | None = None  # (row ids, plan, where): the last step's, reused while rows stay
        self.stats = {"steps": 0, "rejoins": 0, "failed": 0}

    # -- the host's batch changes, in its order: removed, added, moved ---------------------------------------------
    def remove(self, index: int) -> None:
        entry = self.entries.pop(index, None)
        if entry is not None:
            self._gone.add(entry.row)

    def add(self, index: int, prompt: str, prompt_ids: list[int], output: list, steering,
            error: BaseException | None = None) -> None:
        """A request at ``index`` (replacing whatever was there); ``steering`` None: not steered. ``error``: its
        steering could not be set up here (it ends, as a row whose reward fails)."""
        self.remove(index)
        if steering is None and error is None:
            return
        terms, k = (list(steering.terms), steering.k) if steering is not None else ([], 1)
        self.entries[index] = Entry(Row(prompt, list(prompt_ids or ()), terms, k, 0.0, 0), output)
        if error is not None:
            self._fail(self.entries[index].row, error)

    def move(self, a: int, b: int, swap: bool) -> None:
        """Row ``a`` moves to ``b`` (one-way: what was at ``b`` is gone) or the two swap."""
        first, second = self.entries.pop(a, None), self.entries.pop(b, None)
        if first is not None:
            self.entries[b] = first
        if second is not None:
            if swap:
                self.entries[a] = second
            else:
                self._gone.add(second.row)

    @property
    def active(self) -> bool:
        """Whether a step has work: steered rows, or rows that left and still hold reward sessions."""
        return bool(self.entries or self._gone)

    # -- a step -------------------------------------------------------------------------------------------------
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Reweight the steered rows of ``logits`` ([rows, V], the host's batch order) in place; returns it."""
        self._drop_gone()
        if not self.entries:
            return logits
        order = sorted(self.entries)
        if order[-1] >= logits.shape[0]:
            raise RuntimeError(f"steerkit: a steered row at batch index {order[-1]} but the logits have "
                               f"{logits.shape[0]} rows; the host's batch updates were not all seen.")
        failed: dict = {}
        live = [i for i in order if not self.entries[i].failed]
        if live:
            self._sync([self.entries[i] for i in live], failed)
            for row, exc in failed.items():
                self._fail(row, exc)
            failed = {}
            self._drop_gone()  # every row left in a group is a live row of this step
            live = [i for i in live if not self.entries[i].failed]
        if live:
            self._step(logits, live, failed)
        for row, exc in failed.items():
            self._fail(row, exc)
        forced = [i for i in order if self.entries[i].failed]
        if forced:
            self._force_eos(logits, forced)
        self.stats["steps"] += 1
        return logits

    def _sync(self, entries: list[Entry], failed: dict) -> None:
        """Commit each row's newest token; rows out of step leave their groups and join again, replayed."""
        known = {id(e): known_tokens(e.output) for e in entries}
        ahead = {id(e): len(known[id(e)]) - len(e.row.ids) for e in entries}
        ready = [e for e in entries if e.joined and ahead[id(e)] == 1]
        # a joined row with nothing new can stay only if no row of its groups commits now
        rejoin = [e for e in entries if not e.joined or ahead[id(e)] not in ((1, 0) if not ready else (1,))]
        if rejoin:
            self._leave({e.row for e in rejoin if e.joined})
            self.stats["rejoins"] += sum(e.joined for e in rejoin)
        if ready:
            where = {e.row: b for b, e in enumerate(ready)}
            newest = [known[id(e)][-1] for e in ready]
            for e, token in zip(ready, newest):
                e.row.ids.append(token)
            tokens = torch.tensor(newest, dtype=torch.long)
            for group in self.groups.values():
                if group.parts:
                    failed.update(group.commit(tokens, where))
        if rejoin:
            for e in rejoin:
                e.row.ids = known[id(e)]
                e.joined = True
            failed.update(self._join([e.row for e in rejoin]))

    def _join(self, rows: list[Row]) -> dict:
        self._plan = None
        return join_groups(self.groups, rows, self.tokenizer, strict=False,
                           name_of=lambda reward: getattr(reward, "name", "reward"))

    def _drop_gone(self) -> None:
        while self._gone:  # leaving may fail more rows (a rebuild that broke), which leave in turn
            gone, self._gone = self._gone, set()
            self._leave(gone)

    def _leave(self, rows: set) -> None:
        for key in list(self.groups):
            group = self.groups[key]
            for row, exc in group.leave(rows).items():  # a rebuild that broke another row
                self._fail(row, exc)
            if not group.parts:
                del self.groups[key]
        self._plan = None

    def _plan_for(self, rows: list[Row], device) -> tuple[BatchPlan, dict]:
        """The step's plan, each row's position and the rows' batch indices: made again only when rows change."""
        key = tuple(id(r) for r in rows)
        if self._plan is None or self._plan[0] != key:
            plan = make_plan(rows, device, shared_rng=True)
            self._plan = (key, plan, {r: b for b, r in enumerate(rows)})
        return self._plan[1], self._plan[2]

    def _step(self, logits: torch.Tensor, live: list[int], failed: dict) -> None:
        rows = [self.entries[i].row for i in live]
        plan, where = self._plan_for(rows, logits.device)
        whole = len(live) == logits.shape[0]  # every row steered, in order (sorted indices 0..n-1)
        index = None if whole else torch.tensor(live, dtype=torch.long, device=logits.device)
        sub = logits if whole else logits.index_select(0, index)

        def score(ids: torch.Tensor) -> dict:
            rho = {}
            for key, group in self.groups.items():
                if group.parts:
                    rho[key], errors = group.score(ids, where)
                    failed.update(errors)
            return rho

        out = score_step(sub, plan, score, [len(r.ids) for r in rows])
        scores = out.scores.to(logits.dtype)
        if whole:
            logits.copy_(scores)
        else:
            logits.index_copy_(0, index, scores)
        if not bool(out.ok.all()):
            for b in (~out.ok).nonzero()[:, 0].tolist():
                row = rows[b]
                if row in failed:
                    continue
                rewards = {t.name: out.shaped[j][b:b + 1, :row.k] for j, t in enumerate(row.terms)}
                try:
                    raise_non_finite(out.topk_ids[b:b + 1, :row.k], out.topk_logits[b:b + 1, :row.k], rewards,
                                     row.terms, len(row.ids))
                except Exception as exc:  # noqa: BLE001 - this row only
                    failed[row] = exc

    def _fail(self, row: Row, exc: BaseException) -> None:
        for entry in self.entries.values():
            if entry.row is row and not entry.failed:
                entry.failed = True
                self.stats["failed"] += 1
                self._gone.add(row)
                log.error("steerkit: a steered request ends (only EOS allowed from now on): %s: %s",
                          type(exc).__name__, exc)

    def _force_eos(self, logits: torch.Tensor, indices: list[int]) -> None:
        index = torch.tensor(indices, dtype=torch.long, device=logits.device)
        logits.index_fill_(0, index, float("-inf"))
        if self.eos_ids:
            eos = torch.tensor(self.eos_ids, dtype=torch.long, device=logits.device)
            logits[index[:, None], eos[None, :]] = 0.0

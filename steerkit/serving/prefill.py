"""The serving engine's chunked prefill: what each pass of the decode loop prefills, so that a long prompt
delays the running rows by at most one chunk per step (vLLM's chunked prefill is the model).

Each pass, the oldest prompt longer than a chunk runs its next chunk (:class:`~steerkit.engine.lm_cache.PrefillJob`,
fixed chunk boundaries, so its logits do not depend on the load), and newcomers are taken from the queue while
their cost (their length, or a chunk for a long prompt) fits a budget of ``chunk`` tokens (always one): a pass
prefills at most two chunks' worth, however long the prompts waiting. A prompt of at most ``chunk`` tokens is
prefilled whole, in one forward, as ``steerkit.generate`` prefills it. Rows with a long prompt that a job is running
already (a request's ``n``) follow that job instead of starting their own, and get copies of its prefill.
"""

from __future__ import annotations

from collections import deque

from ..engine.lm_cache import PrefillJob
from ..engine.reward_groups import prepare_lm_state
from ..engine.rows import Row


class Prefills:
    """Long prompts being prefilled a chunk per pass, oldest first (see the module docstring)."""

    def __init__(self, batch, chunk: int):
        self.batch, self.chunk = batch, chunk
        self.jobs: dict[Row, PrefillJob] = {}
        self.followers: dict[Row, list[Row]] = {}  # a job's row -> the rows with its prompt that wait on it

    def __len__(self) -> int:
        return len(self.jobs) + sum(map(len, self.followers.values()))

    def __contains__(self, row) -> bool:
        return row in self.jobs or any(row in waiting for waiting in self.followers.values())

    def rows(self) -> list[Row]:
        return [r for row in self.jobs for r in (row, *self.followers.get(row, ()))]

    def drop(self, rows) -> None:
        """Forget ``rows``; a job whose row goes carries on, in its place, for its first follower if it has one."""
        gone = set(rows)
        jobs, followers = {}, {}
        for row, job in self.jobs.items():
            waiting = [f for f in self.followers.get(row, ()) if f not in gone]
            if row in gone:
                if not waiting:
                    continue
                row, waiting = waiting[0], waiting[1:]
            jobs[row] = job
            if waiting:
                followers[row] = waiting
        self.jobs, self.followers = jobs, followers

    def take(self, queue: deque, room: int) -> list[Row]:
        """Pop from ``queue`` the newcomers this pass starts (at most ``room``), within the pass's token budget.
        Called under the engine's lock. A prompt that runs already (a job's, or a newcomer's of this pass) costs
        nothing more: its rows share that prefill."""
        budget = self.chunk
        taken: list[Row] = []
        running = {tuple(row.prompt_ids) for row in self.jobs}
        while queue and len(taken) < room:
            prompt = tuple(queue[0].prompt_ids)
            cost = 0 if prompt in running else min(len(prompt), self.chunk)
            if cost > budget and taken:
                break
            taken.append(queue.popleft())
            running.add(prompt)
            budget -= cost
        return taken

    def run(self, taken: list[Row]) -> tuple[dict, dict]:
        """This pass's prefill: the oldest long prompt's next chunk, then the newcomers (a long one starts its
        job with its first chunk). Returns ``({row: Prefilled or None}, {row: exception})``: rows ready to join
        the batch (None: a short prompt, which the engine core prefills whole) and rows that failed."""
        ready: dict = {}
        failed: dict = {}
        if self.jobs:
            self._advance(next(iter(self.jobs)), ready, failed)
        for row in taken:
            if len(row.prompt_ids) <= self.chunk:
                ready[row] = None
                continue
            prepare_lm_state(self.batch, [row])  # (a short prompt's is the engine core's admission)
            leader = next((r for r in self.jobs if r.prompt_ids == row.prompt_ids), None)
            if leader is not None:
                self.followers.setdefault(leader, []).append(row)
                continue
            self.jobs[row] = self.batch.prefill_job(row.prompt_ids, self.chunk)
            self._advance(row, ready, failed)
        return ready, failed

    def _advance(self, row: Row, ready: dict, failed: dict) -> None:
        try:
            done = self.jobs[row].run_chunk()
        except Exception as exc:  # noqa: BLE001 - this prompt's rows fail, the others go on
            del self.jobs[row]
            for r in (row, *self.followers.pop(row, ())):
                failed[r] = exc
            return
        if done is None:
            return
        del self.jobs[row]
        ready[row] = done
        for follower in self.followers.pop(row, ()):
            try:
                ready[follower] = self.batch.copy_prefilled(done)
            except Exception as exc:  # noqa: BLE001
                failed[follower] = exc

"""The serving engine's chunked prefill: what each pass of the decode loop prefills, so that a long prompt
delays the running rows by at most one chunk per step (vLLM's chunked prefill is the model).

Each pass, the oldest prompt longer than a chunk runs its next chunk (:class:`~steerkit.engine.lm_cache.PrefillJob`,
fixed chunk boundaries, so its logits do not depend on the load), and newcomers are taken from the queue while
their cost (their length, or a chunk for a long prompt) fits a budget of ``chunk`` tokens (always one): a pass
prefills at most two chunks' worth, however long the prompts waiting. A prompt of at most ``chunk`` tokens is
prefilled whole, in one forward, as ``steerkit.generate`` prefills it.
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

    def __len__(self) -> int:
        return len(self.jobs)

    def rows(self) -> list[Row]:
        return list(self.jobs)

    def drop(self, rows) -> None:
        for row in rows:
            self.jobs.pop(row, None)

    def take(self, queue: deque, room: int) -> list[Row]:
        """Pop from ``queue`` the newcomers this pass starts (at most ``room``), within the pass's token budget.
        Called under the engine's lock."""
        budget = self.chunk
        taken: list[Row] = []
        while queue and len(taken) < room:
            cost = min(len(queue[0].prompt_ids), self.chunk)
            if cost > budget and taken:
                break
            taken.append(queue.popleft())
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
            self.jobs[row] = self.batch.prefill_job(row.prompt_ids, self.chunk)
            self._advance(row, ready, failed)
        return ready, failed

    def _advance(self, row: Row, ready: dict, failed: dict) -> None:
        try:
            done = self.jobs[row].run_chunk()
        except Exception as exc:  # noqa: BLE001 - this row fails, the others go on
            del self.jobs[row]
            failed[row] = exc
            return
        if done is not None:
            del self.jobs[row]
            ready[row] = done

"""One row of the engine: a prompt with its validated settings, its random generator, its generated ids and
its text so far."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import torch

from .text import StreamText


@dataclass(eq=False)  # rows are keys of dicts and sets: identity
class Row:
    """A row from admission to its finish. ``ids`` are the generated LM ids (EOS included when generated).

    ``prompt`` is the text the rewards see (the user's prompt, before any chat template); ``prompt_ids`` what
    the LM reads. ``temperature`` 0 is greedy. ``handle`` is the caller's (the HTTP server's event handle)."""

    prompt: str
    prompt_ids: list[int]
    terms: list
    k: int
    temperature: float
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False
    seed: int | None = None
    trace: bool = False
    deadline: float | None = None  # time.monotonic() at which the row times out
    handle: object = None
    ids: list[int] = field(default_factory=list)
    steps: int = 0  # decoding steps this row has been through (the β schedules' step)
    finished: bool = False
    text: StreamText | None = None
    generator: torch.Generator | None = None
    finish_reason: str | None = None
    error: Exception | None = None

    @property
    def id(self) -> int:
        return getattr(self.handle, "id", id(self))

    @property
    def step(self) -> int:
        return self.steps

    def start(self, tokenizer, device, shared_rng: bool = False, stream_text: bool = True) -> None:
        """Called at admission: the text tracker (when the text is streamed, or stop strings must be found) and
        the row's own random generator (seeded, or fresh entropy; none when the batch shares one RNG or the row
        is greedy)."""
        self.text = StreamText(tokenizer, self.stop, self.include_stop) if stream_text or self.stop else None
        if self.temperature > 0 and not shared_rng:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (now if now is not None else time.monotonic()) >= self.deadline


def distinct_prompts(rows_ids: list[list[int]]) -> tuple[list[int], list[int]]:
    """Rows that repeat a prompt (``num_return_sequences``, a request's ``n``) need it run once: ``(runs, pick)``,
    ``runs`` the first row of each distinct prompt, in row order, and ``pick[i]`` the position in ``runs`` of row
    ``i``'s prompt."""
    first: dict[tuple[int, ...], int] = {}
    runs: list[int] = []
    pick = []
    for row, ids in enumerate(rows_ids):
        key = tuple(ids)
        if key not in first:
            first[key] = len(runs)
            runs.append(row)
        pick.append(first[key])
    return runs, pick

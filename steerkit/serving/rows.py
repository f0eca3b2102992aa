"""One running row of the serving engine: its validated settings, its random generator, its generated ids, and
the completion text it has streamed so far (incremental detokenization with stop strings)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import torch

from ..steering import SteeringTerm
from .requests import RowHandle, RowSpec

REPLACEMENT = "\ufffd"


@dataclass(eq=False)  # rows are keys of dicts and sets: identity
class Row:
    """A row from admission to its FinishEvent. ``ids`` are the generated LM ids (EOS included when generated)."""

    spec: RowSpec
    handle: RowHandle
    prompt_ids: list[int]
    terms: list[SteeringTerm]
    k: int
    temperature: float  # 0: greedy
    stop: list[str]
    seed: int | None
    deadline: float | None  # time.monotonic() at which the row times out
    ids: list[int] = field(default_factory=list)
    text: "StreamText | None" = None
    generator: torch.Generator | None = None
    finish_reason: str | None = None
    error: Exception | None = None

    @property
    def id(self) -> int:
        return self.handle.id

    @property
    def step(self) -> int:
        """Decoding steps done (the β schedules' step)."""
        return len(self.ids)

    def start(self, tokenizer, device) -> None:
        """Called at admission: the text tracker and the row's own random generator (seeded, or fresh entropy)."""
        self.text = StreamText(tokenizer, self.stop)
        if self.temperature > 0:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (now if now is not None else time.monotonic()) >= self.deadline


class StreamText:
    """The streamed completion of one row: after each token, the text that has become final.

    The row's text is ``decode(ids, skip_special_tokens=True)`` (as :func:`steerkit.generate` decodes). Text is
    held back while it ends in U+FFFD (a multi-byte character split across tokens) or could be the start of a
    stop string; when a stop string appears, the completion ends just before it.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.longest_stop = max((len(s) for s in stop), default=0)
        self.emitted = ""

    def push(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """The new text after ``ids`` (all generated ids so far) and whether a stop string ended the row.
        ``final``: no token follows (EOS, length, ...), so nothing is held back any more."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        hit = self._find_stop(text)
        if hit is not None:
            return self._advance(text[:hit]), True
        if not final:
            text = self._hold_back(text)
        return self._advance(text), False

    def _find_stop(self, text: str) -> int | None:
        if not self.stop:
            return None
        start = max(0, len(self.emitted) - self.longest_stop)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _hold_back(self, text: str) -> str:
        text = text.rstrip(REPLACEMENT)
        for n in range(min(self.longest_stop - 1, len(text)), 0, -1):  # longest suffix that starts a stop string
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return text[:-n]
        return text

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.emitted) or not text.startswith(self.emitted):
            return ""  # nothing new (or a re-decoding that changed earlier text: already streamed, kept)
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta

"""What a caller of the serving engine hands in (:class:`RowSpec`) and gets back (:class:`RowHandle`, whose
events are :class:`TokenEvent` and one final :class:`FinishEvent`).

Events cross from the engine's decode-loop thread to the caller: into an ``asyncio`` queue through
``loop.call_soon_threadsafe`` when :meth:`Engine.submit` ran inside an event loop (the HTTP server), else into
a thread-safe queue read by :meth:`RowHandle.iter_events` / :meth:`RowHandle.result` (scripts, tests).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Sequence

FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error")

#: Rows an engine decodes together, and rows it keeps waiting, at most, unless it is given others (``--max-running``,
#: ``--max-queue``). The engine's limits are here, not in ``engine.py``, so that the CLI's defaults read them
#: without importing torch.
DEFAULT_MAX_RUNNING, DEFAULT_MAX_QUEUE = 16, 64

#: With ``--compile``: a row of up to this many tokens (its prompt, its tokens, a reward's context) runs on shapes the
#: server compiled while it started; a longer one makes its batch's steps run eagerly (``--compile-tokens``). 127: the
#: LM's narrowest width (128 columns), and the rewards' context buckets of 64 and 128 columns.
COMPILE_TOKENS = 127

#: A prompt longer than this many tokens is prefilled this many at a time, one chunk between decode steps
#: (``--prefill-chunk``; measured: docs/performance.md, "A long prompt beside a short request").
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class RowSpec:
    """One sequence to generate (the HTTP layer turns ``n > 1`` into n specs).

    ``rewards``: ``None`` takes the engine's default steering; otherwise a mapping ``name -> beta`` or a list of
    ``RewardSpec``-like items (``steerkit.config.RewardSpec``, dicts with its fields, or ``(name, beta)`` pairs)
    naming rewards the engine serves. ``temperature`` 0 is greedy; ``k`` ``None`` is the engine's default.
    ``seed`` makes the output independent of whatever else is in the batch. ``trace`` attaches each term's
    reward of the chosen token to every :class:`TokenEvent`. ``timeout_s`` counts from submission.
    """

    prompt: str
    max_tokens: int
    temperature: float = 1.0
    k: int | None = None
    rewards: object = None
    seed: int | None = None
    stop: Sequence[str] = ()
    include_stop: bool = False  # keep the stop string that ended the row (OpenAI's convention: cut before it)
    trace: bool = False
    timeout_s: float | None = None


@dataclass
class TokenEvent:
    """One generated token (the end-of-sequence token included). ``text`` is the new completion text that
    became final with it: possibly empty (an incomplete UTF-8 character, text that may start a stop string, the
    EOS token), possibly text held back from earlier tokens. The concatenated ``text`` of a row's events is its
    completion, without the stop string that ended it (OpenAI's convention)."""

    text: str
    token_id: int
    rewards: dict[str, float] | None = None  # term name -> reward of the chosen token (when RowSpec.trace)


@dataclass
class FinishEvent:
    """The last event of a row. ``completion_tokens`` counts every generated token (EOS and stop-string tokens
    included), i.e. the number of :class:`TokenEvent` s."""

    finish_reason: str  # one of FINISH_REASONS
    prompt_tokens: int
    completion_tokens: int
    error: Exception | None = None


@dataclass
class Completion:
    """A finished row collected by :meth:`RowHandle.result`."""

    text: str
    token_ids: list[int]
    finish: FinishEvent
    rewards: list[dict[str, float]] | None = None


class RowHandle:
    """The caller's side of one submitted row: its events, and :meth:`cancel`."""

    def __init__(self, row_id: int, wake=None, loop: asyncio.AbstractEventLoop | None = None):
        """``loop``: the event loop that reads the events (default: the running one, if any)."""
        self.id = row_id
        self.submitted = time.monotonic()
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        self._async_queue: asyncio.Queue | None = asyncio.Queue() if self._loop is not None else None
        self._queue: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self._wake = wake  # called by cancel() so that an idle engine notices at once
        self.finish: FinishEvent | None = None

    # -- the caller's side ---------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the engine to drop this row: it leaves the batch at the next step (FinishEvent "cancelled")."""
        self._cancelled.set()
        if self._wake is not None:
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        """The row's events as they come; ends after its :class:`FinishEvent`. Iterate on the event loop that
        called ``submit`` (or anywhere, for a row submitted outside an event loop)."""
        while True:
            if self._async_queue is not None:
                event = await self._async_queue.get()
            else:
                event = await asyncio.to_thread(self._queue.get)
            yield event
            if isinstance(event, FinishEvent):
                return

    def iter_events(self, timeout: float | None = None) -> Iterator[TokenEvent | FinishEvent]:
        """The events of a row submitted outside an event loop, blocking; ``timeout`` bounds the whole wait
        (``TimeoutError``)."""
        if self._async_queue is not None:
            raise RuntimeError("this row was submitted inside an event loop: iterate `async for e in handle.events()`")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"row {self.id} did not finish within {timeout} s") from None
            yield event
            if isinstance(event, FinishEvent):
                return

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the row (submitted outside an event loop) and collect its text, ids and finish."""
        text, ids, rewards = [], [], []
        for event in self.iter_events(timeout):
            if isinstance(event, FinishEvent):
                return Completion("".join(text), ids, event, rewards if any(r is not None for r in rewards) else None)
            text.append(event.text)
            ids.append(event.token_id)
            rewards.append(event.rewards)
        raise AssertionError("unreachable")

    # -- the engine's side ---------------------------------------------------------------------------
    def _emit(self, event: TokenEvent | FinishEvent) -> None:
        """Deliver ``event``. When the caller's event loop is gone the row is marked cancelled, so that the
        engine drops it at its next step."""
        if isinstance(event, FinishEvent):
            self.finish = event
        if self._async_queue is None:
            self._queue.put(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._async_queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody will read this row
            self._cancelled.set()

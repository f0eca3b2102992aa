"""One OpenAI request through the engine: rows in, OpenAI JSON or server-sent events out.

A request becomes ``len(prompts) × n`` rows (:class:`~steerkit.serving.requests.RowSpec`), prompt-major: choice
``i`` is prompt ``i // n``, sample ``i % n``, and runs with seed ``seed + i`` (wrapped into torch's seed range).
Without a ``seed`` the server draws one, and every choice reports the seed it used (``choices[i].seed``), so
any choice can be reproduced alone with ``n: 1, seed: <that seed>``.

Rows are admitted all or none: when the engine's queue is full part-way, the rows already admitted are
cancelled and the request gets a 429. A request's rows are cancelled whenever it ends early: its client
disconnects, it runs past the server's timeout, one of its rows fails, or the stream is closed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from ..seeds import offset_seed
from .errors_http import HTTPError, from_steerkit, row_failure
from .requests import FinishEvent, RowSpec, TokenEvent

#: How long past the request timeout the HTTP layer waits for the engine's own "timeout" before giving up.
DEADLINE_GRACE_S = 5.0

#: How often a non-streamed request checks that its client is still connected (seconds).
DISCONNECT_POLL_S = 0.1

#: The seed of choice ``index``: ``seed + index``, wrapped into torch's seed range (:mod:`steerkit.seeds`).
derive_seed = offset_seed


@dataclass
class Job:
    """A validated request as rows, plus what its response needs."""

    kind: str                     # "completion" | "chat"
    model: str
    specs: list[RowSpec]
    seeds: list[int]
    n: int
    trace: bool
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    received: float = field(default_factory=time.perf_counter)

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"

    @property
    def response_id(self) -> str:
        return ("cmpl-" if self.kind == "completion" else "chatcmpl-") + self.id


def build_specs(prompts: list[str], *, n: int, seed: int | None, max_tokens: int, temperature: float, k: int | None,
                rewards, stop: tuple[str, ...], trace: bool, timeout_s: float | None) -> tuple[list[RowSpec], list[int]]:
    base = secrets.randbelow(2**63) if seed is None else seed
    specs, seeds = [], []
    for i in range(len(prompts) * n):
        row_seed = derive_seed(base, i)
        seeds.append(row_seed)
        specs.append(RowSpec(prompt=prompts[i // n], max_tokens=max_tokens, temperature=temperature, k=k,
                             rewards=rewards, seed=row_seed, stop=stop, trace=trace, timeout_s=timeout_s))
    return specs, seeds


async def admit(engine, job: Job, *, prompt_param: str, retry_after_s: float) -> list:
    """Validate the rows, then queue them all or none; a failure is raised as the HTTPError it maps to. Runs in
    a worker thread: tokenizing a long prompt must not hold up the event loop (other requests, ``/health``)."""
    loop = asyncio.get_running_loop()
    try:  # every row checked once, then all queued or none
        return await asyncio.to_thread(engine.submit_all, job.specs, loop=loop)
    except Exception as exc:  # noqa: BLE001 - typed errors become 4xx, anything else a logged 500
        raise from_steerkit(exc, prompt_param=prompt_param, retry_after_s=retry_after_s) from None


@dataclass
class RowResult:
    text: str = ""
    tokens: int = 0
    trace: list = field(default_factory=list)
    finish: FinishEvent | None = None


class Rows:
    """The running rows of one request, as one merged stream of ``(choice index, event)``.

    ``finish_unfinished()`` cancels every row that has not finished; it is idempotent and always called when
    the request ends, however it ends (``async with Rows(...)``).
    """

    def __init__(self, handles: list, deadline_s: float | None, on_first_token: Callable[[], None] | None = None):
        self.handles = handles
        self.finished = [False] * len(handles)
        # a safety net only: the engine times rows out itself (FinishEvent "timeout") at ``deadline_s``
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s + DEADLINE_GRACE_S
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._first = on_first_token

    async def __aenter__(self) -> "Rows":
        self._tasks = [asyncio.create_task(self._pump(i, h)) for i, h in enumerate(self.handles)]
        return self

    async def __aexit__(self, *exc) -> None:
        self.finish_unfinished()

    def finish_unfinished(self) -> None:
        for i, handle in enumerate(self.handles):
            if not self.finished[i]:
                handle.cancel()
                self.finished[i] = True
        for task in self._tasks:
            task.cancel()

    async def _pump(self, index: int, handle) -> None:
        try:
            async for event in handle.events():
                await self._queue.put((index, event))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the event stream itself broke: report it as that row's failure
            await self._queue.put((index, FinishEvent("error", 0, 0, exc)))

    async def events(self, is_disconnected: Callable | None = None) -> AsyncIterator[tuple[int, object]]:
        """Events until every row finished; raises HTTPError 504 past the deadline (after cancelling the rows),
        and stops (after cancelling them) when ``is_disconnected()`` says the client left."""
        remaining = len(self.handles)
        checked = time.monotonic()
        while remaining:
            now = time.monotonic()
            if is_disconnected is not None and now - checked >= DISCONNECT_POLL_S:
                checked = now
                if await is_disconnected():
                    self.finish_unfinished()
                    return
            wait = DISCONNECT_POLL_S if is_disconnected is not None else None
            if self.deadline is not None:
                left = self.deadline - now
                if left <= 0:
                    self.finish_unfinished()
                    raise timeout_error()
                wait = left if wait is None else min(wait, left)
            try:
                index, event = await asyncio.wait_for(self._queue.get(), timeout=wait)
            except asyncio.TimeoutError:
                continue
            if isinstance(event, TokenEvent) and self._first is not None:
                self._first()
                self._first = None
            if isinstance(event, FinishEvent):
                self.finished[index] = True
                remaining -= 1
            yield index, event


def timeout_error() -> HTTPError:
    return HTTPError(504, "The request ran past the server's request timeout (steerkit serve --timeout); lower "
                     "max_tokens or n, or ask the operator to raise --timeout.", type="timeout_error",
                     code="request_timeout")


def shutting_down_error() -> HTTPError:
    return HTTPError(503, "The server is shutting down; retry on another replica or after it restarts.",
                     type="service_unavailable_error", code="shutting_down")


def finish_error(finish: FinishEvent) -> HTTPError | None:
    """The error a row's finish means for its request (None: the row finished normally)."""
    if finish.finish_reason == "error":
        return row_failure(finish.error)
    if finish.finish_reason == "timeout":
        return timeout_error()
    if finish.finish_reason == "cancelled":
        return shutting_down_error()
    return None


def usage(job: Job, results: list[RowResult]) -> dict:
    prompt = sum(r.finish.prompt_tokens for r in results[::job.n] if r.finish is not None)
    completion = sum(r.finish.completion_tokens if r.finish is not None else r.tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def trace_item(event: TokenEvent) -> dict:
    return {"token": event.text, "token_id": event.token_id, "rewards": event.rewards or {}}


async def collect(job: Job, rows: Rows, is_disconnected) -> dict:
    """The whole (non-streaming) response body, or HTTPError when a row failed, timed out or was cancelled."""
    results = [RowResult() for _ in job.specs]
    async for index, event in rows.events(is_disconnected):
        result = results[index]
        if isinstance(event, TokenEvent):
            result.text += event.text
            result.tokens += 1
            if job.trace:
                result.trace.append(trace_item(event))
            continue
        result.finish = event
        failure = finish_error(event)
        if failure is not None:
            rows.finish_unfinished()
            raise failure
    if any(r.finish is None for r in results):  # the client left: nobody reads this
        return {}
    choices = []
    for i, r in enumerate(results):
        choice = {"index": i}
        if job.kind == "completion":
            choice.update(text=r.text, logprobs=None)
        else:
            choice["message"] = {"role": "assistant", "content": r.text}
        choice.update(finish_reason=r.finish.finish_reason, seed=job.seeds[i])
        if job.trace:
            choice["reward_trace"] = r.trace
        choices.append(choice)
    return {"id": job.response_id, "object": job.object, "created": job.created, "model": job.model,
            "choices": choices, "usage": usage(job, results)}


def sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def stream(job: Job, rows: Rows) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with ``data: [DONE]``.

    One chunk per token (per choice); each choice's last chunk has its ``finish_reason`` and ``seed``; the chunk
    that finishes the last choice also carries the request's ``usage``; with ``stream_options.include_usage``
    a final chunk with no choices carries it too, as OpenAI sends it. A failure mid-stream (a reward raised,
    the timeout, shutdown) is sent as ``data: {"error": {...}}`` before ``[DONE]``.
    """
    obj = "text_completion" if job.kind == "completion" else "chat.completion.chunk"
    head = {"id": job.response_id, "object": obj, "created": job.created, "model": job.model}
    results = [RowResult() for _ in job.specs]
    left = len(job.specs)
    async with rows:
        if job.kind == "chat":
            for i in range(len(job.specs)):
                yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}]})
        try:
            async for index, event in rows.events():
                result = results[index]
                if isinstance(event, TokenEvent):
                    result.tokens += 1
                    if not event.text and not job.trace:
                        continue
                    choice = _delta(job, index, event.text)
                    if job.trace:
                        choice["reward_trace"] = [trace_item(event)]
                    yield sse({**head, "choices": [choice]})
                    continue
                result.finish = event
                left -= 1
                failure = finish_error(event) if event.finish_reason != "timeout" else None
                if failure is not None:
                    rows.finish_unfinished()
                    yield sse(failure.body())
                    break
                choice = _delta(job, index, None)
                choice.update(finish_reason=event.finish_reason, seed=job.seeds[index])
                chunk = {**head, "choices": [choice]}
                if left == 0:
                    chunk["usage"] = usage(job, results)
                yield sse(chunk)
            else:
                if job.include_usage:
                    yield sse({**head, "choices": [], "usage": usage(job, results)})
        except HTTPError as exc:  # the server's deadline passed
            yield sse(exc.body())
    yield "data: [DONE]\n\n"


def _delta(job: Job, index: int, text: str | None) -> dict:
    if job.kind == "completion":
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": None}
    return {"index": index, "delta": {} if text is None else {"content": text}, "finish_reason": None}

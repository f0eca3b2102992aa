"""What both completion routes (``completions.py`` and ``chat.py``) do around their own part: refuse requests while
draining, check the fields both bodies share (model, n, max_tokens) and the row count, turn the checked request
into a :class:`~steerkit.serving.completions.Job`, and answer (one JSON body, or server-sent events). Also
:func:`plain`, the JSON-safe copy of engine stats that the info routes answer with."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .. import completions as cmpl
from ..errors_http import HTTPError
from .state import Server


def check_open(request: Request) -> None:
    """A 503 once the server is draining (shutting down): it takes no new requests."""
    if request.app.state.draining:
        raise cmpl.shutting_down_error()


def check_common(server: Server, body) -> tuple[int, object]:
    """The checks both completion routes make (model, n, max_tokens); returns the request's
    max_tokens (the server's default when it sent none) and its rewards."""
    model_name, settings = server.model_name, server.settings
    if body.model is not None and body.model != model_name:
        raise HTTPError(404, f"model {body.model!r} is not served here; this server serves {model_name!r} "
                        "(GET /v1/models).", type="not_found_error", param="model", code="model_not_found")
    if body.n > settings.max_n:
        raise HTTPError(400, f"n must be at most {settings.max_n} on this server, got {body.n}.", param="n",
                        code="invalid_value")
    limit = body.limit()
    max_tokens = settings.default_max_tokens if limit is None else limit
    if max_tokens > settings.max_tokens_limit:
        raise HTTPError(400, f"max_tokens must be at most {settings.max_tokens_limit} on this server, got "
                        f"{max_tokens}.", param="max_tokens", code="invalid_value")
    return max_tokens, body.rewards


def check_rows(engine, body, prompts: int) -> None:
    """A 400 when the request's rows (``prompts × n``) could never fit the engine's queue at once."""
    rows, queue = prompts * body.n, getattr(engine, "max_queue", None)
    if queue is not None and rows > queue:
        raise HTTPError(400, f"this request asks for {rows} rows ({prompts} prompt(s) × n={body.n}); this server "
                        f"queues at most {queue} rows at a time (steerkit serve --max-queue): lower n or send "
                        "fewer prompts per request.", param="n", code="invalid_value")


def job_for(server: Server, body, kind: str, prompts: list[str], max_tokens: int, rewards) -> cmpl.Job:
    """The checked request as a :class:`~steerkit.serving.completions.Job`: ``len(prompts) × n`` row specs."""
    specs, seeds = cmpl.build_specs(prompts, n=body.n, seed=body.seed, max_tokens=max_tokens,
                                    temperature=body.temperature, k=body.k, rewards=rewards, stop=body.stop,
                                    trace=body.reward_trace, timeout_s=server.settings.timeout_s)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return cmpl.Job(kind, server.model_name, specs, seeds, body.n, body.reward_trace, include_usage)


async def respond(server: Server, request: Request, job: cmpl.Job, prompt_param: str, stream: bool):
    """Admit the job's rows and answer: server-sent events as the rows go, or one JSON body once they finish."""
    settings, metrics = server.settings, server.metrics
    handles = await cmpl.admit(server.engine, job, prompt_param=prompt_param, retry_after_s=settings.retry_after_s)
    first = lambda: metrics.first_token(time.perf_counter() - job.received)  # noqa: E731
    rows = cmpl.Rows(handles, settings.timeout_s, on_first_token=first)
    if stream:
        return EventStream(cmpl.stream(job, rows), on_close=rows.finish_unfinished, media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    async with rows:
        body = await cmpl.collect(job, rows, request.is_disconnected)
    return JSONResponse(body)


class EventStream(StreamingResponse):
    """Server-sent events whose rows are cancelled when the response ends for any reason (the client left)."""

    def __init__(self, content, *, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def limits(server: Server) -> dict:
    """What one request may ask for and send on this server (``GET /v1/models`` and ``/health`` say it)."""
    settings, engine = server.settings, server.engine
    found = {"max_tokens": settings.max_tokens_limit, "max_n": settings.max_n, "max_body_bytes": settings.max_body_bytes,
             "timeout_s": settings.timeout_s, "api_key_required": settings.api_key is not None,
             "stall_timeout_s": settings.stall_s}
    found.update(engine.limits() if hasattr(engine, "limits") else {})
    return found


def plain(value):
    """JSON-safe copy of engine stats / defaults (RewardSpecs and tuples included)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)

"""The FastAPI app of ``steerkit serve``: OpenAI's routes over a continuous-batching :class:`Engine`.

``create_app(engine, settings=ServerSettings(...))`` builds one app around one engine (the CLI's, a test's
tiny one, or a Ray Serve replica's); it starts the engine's decode loop on startup and shuts it down (finishing
in-flight rows up to ``settings.shutdown_deadline_s``) on shutdown.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (with the steering the
server offers), ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /`` (the playground page).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from . import completions as cmpl
from .errors_http import HTTPError, install
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest

_ENDPOINTS = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/"}


@dataclass(frozen=True)
class ServerSettings:
    """The HTTP layer's limits (the engine's own, ``max_running`` and ``max_queue``, are the engine's)."""

    timeout_s: float | None = 300.0       # per request: admitted -> last token (``--timeout``); None: no limit
    default_max_tokens: int = 64          # when a request sends no max_tokens
    max_tokens_limit: int = 1024          # the largest max_tokens a request may ask for
    max_n: int = 16                       # the largest n
    max_body_bytes: int = 1 << 20         # request bodies over this get a 413
    retry_after_s: float = 1.0            # Retry-After of a 429
    shutdown_deadline_s: float = 30.0     # on shutdown, in-flight rows get this long to finish
    model_name: str | None = None         # the served model's name (default: the engine's)


@dataclass(frozen=True)
class _Server:
    """What the routes share: the engine, the HTTP limits, the metrics registry and the served model's name."""

    engine: object
    settings: ServerSettings
    metrics: ServerMetrics
    model_name: str


def create_app(engine, *, settings: ServerSettings | None = None, metrics: ServerMetrics | None = None) -> FastAPI:
    """The app serving ``engine``. ``metrics`` should be the engine's observer (``Engine(observer=metrics)``) so
    that step and reward times reach ``/metrics``; without one, the app makes its own registry (HTTP metrics only,
    unless the engine accepts an observer afterwards through ``engine.observer``)."""
    settings = settings or ServerSettings()
    if metrics is None:
        metrics = ServerMetrics()
        if getattr(engine, "observer", "absent") is None:
            engine.observer = metrics
    metrics.watch(engine)
    server = _Server(engine, settings, metrics, settings.model_name or engine.model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            app.state.draining = True
            await asyncio.to_thread(engine.shutdown, settings.shutdown_deadline_s)

    app = FastAPI(title="steerkit serve", version="1", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.engine, app.state.settings, app.state.metrics, app.state.draining = engine, settings, metrics, False
    install(app)
    app.add_middleware(_Accounting, metrics=metrics, max_body_bytes=settings.max_body_bytes)
    _add_completion_routes(app, server)
    _add_info_routes(app, server)
    return app


# -- the completion routes -------------------------------------------------------------------------------------

def _add_completion_routes(app: FastAPI, server: _Server) -> None:
    """``POST /v1/completions`` and ``POST /v1/chat/completions``: check the request, turn it into rows, answer."""

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_open(request)
        max_tokens, rewards = _check_common(server, body)
        _check_rows(server.engine, body, len(body.prompt))
        job = _job_for(server, body, "completion", body.prompt, max_tokens, rewards)
        return await _respond(server, request, job, "prompt", body.stream)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_open(request)
        max_tokens, rewards = _check_common(server, body)
        _check_rows(server.engine, body, 1)
        prompt = _chat_prompt(server, body)
        job = _job_for(server, body, "chat", [prompt], max_tokens, rewards)
        return await _respond(server, request, job, "messages", body.stream)


def _check_open(request: Request) -> None:
    """A 503 once the server is draining (shutting down): it takes no new requests."""
    if request.app.state.draining:
        raise cmpl.shutting_down_error()


def _check_common(server: _Server, body) -> tuple[int, object]:
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


def _check_rows(engine, body, prompts: int) -> None:
    """A 400 when the request's rows (``prompts × n``) could never fit the engine's queue at once."""
    rows, queue = prompts * body.n, getattr(engine, "max_queue", None)
    if queue is not None and rows > queue:
        raise HTTPError(400, f"this request asks for {rows} rows ({prompts} prompt(s) × n={body.n}); this server "
                        f"queues at most {queue} rows at a time (steerkit serve --max-queue): lower n or send "
                        "fewer prompts per request.", param="n", code="invalid_value")


def _chat_prompt(server: _Server, body) -> str:
    """The chat request's messages as one prompt, through the tokenizer's chat template (a 400 without one, or
    when the template refuses the messages)."""
    tokenizer = server.engine.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise HTTPError(400, f"model {server.model_name!r} has no chat template; use POST /v1/completions with a "
                        "plain prompt.", param="messages", code="no_chat_template")
    try:
        return tokenizer.apply_chat_template(body.conversation(), tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - templates raise on conversations they do not accept
        raise HTTPError(400, f"the chat template refused these messages: {exc}", param="messages",
                        code="invalid_value") from None


def _job_for(server: _Server, body, kind: str, prompts: list[str], max_tokens: int, rewards) -> cmpl.Job:
    """The checked request as a :class:`~steerkit.serving.completions.Job`: ``len(prompts) × n`` row specs."""
    specs, seeds = cmpl.build_specs(prompts, n=body.n, seed=body.seed, max_tokens=max_tokens,
                                    temperature=body.temperature, k=body.k, rewards=rewards, stop=body.stop,
                                    trace=body.reward_trace, timeout_s=server.settings.timeout_s)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return cmpl.Job(kind, server.model_name, specs, seeds, body.n, body.reward_trace, include_usage)


async def _respond(server: _Server, request: Request, job: cmpl.Job, prompt_param: str, stream: bool):
    """Admit the job's rows and answer: server-sent events as the rows go, or one JSON body once they finish."""
    settings, metrics = server.settings, server.metrics
    handles = cmpl.admit(server.engine, job, prompt_param=prompt_param, retry_after_s=settings.retry_after_s)
    first = lambda: metrics.first_token(time.perf_counter() - job.received)  # noqa: E731
    rows = cmpl.Rows(handles, settings.timeout_s, on_first_token=first)
    if stream:
        return _EventStream(cmpl.stream(job, rows), on_close=rows.finish_unfinished, media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    async with rows:
        body = await cmpl.collect(job, rows, request.is_disconnected)
    return JSONResponse(body)


# -- the model, health, metrics and playground routes ----------------------------------------------------------

def _add_info_routes(app: FastAPI, server: _Server) -> None:
    """``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus) and ``GET /`` (the playground page)."""
    engine, metrics, model_name = server.engine, server.metrics, server.model_name

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "steerkit",
                                            "steering": steering_info(engine)}]}

    @app.get("/health")
    async def health(request: Request):
        stats = engine.stats()
        alive = stats.get("alive", True)
        status = "draining" if request.app.state.draining else ("ok" if alive else "engine stopped")
        return JSONResponse({"status": status, "model": model_name, **_plain(stats)},
                            status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics_route():
        metrics.sync(engine.stats())
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8"))


def steering_info(engine) -> dict:
    """What ``GET /v1/models`` says about steering: the rewards a request may name, the defaults, k's range."""
    info = {"rewards": list(engine.reward_names())}
    for key in ("default_rewards", "default_k", "vocab_size", "max_running", "max_queue"):
        value = getattr(engine, key, None)
        if value is not None:
            info[key] = _plain(value)
    return info


def _plain(value):
    """JSON-safe copy of engine stats / defaults (RewardSpecs and tuples included)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class _EventStream(StreamingResponse):
    """Server-sent events whose rows are cancelled when the response ends for any reason (the client left)."""

    def __init__(self, content, *, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _Accounting:
    """ASGI middleware: requests by endpoint and status (streams counted when they end), and the body-size limit."""

    def __init__(self, app, *, metrics: ServerMetrics, max_body_bytes: int):
        self.app, self.metrics, self.max_body = app, metrics, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"
        start, status = time.perf_counter(), [500]
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            error = HTTPError(413, f"The request body has {int(length)} bytes; this server takes at most "
                              f"{self.max_body} (a prompt that long would not fit the model's context anyway).",
                              code="request_too_large")
            await error.response()(scope, receive, send)
            self.metrics.request_done(endpoint, 413)
            return

        if scope.get("method") == "POST" and endpoint.startswith("/v1/"):
            scope = _as_json(scope)

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            seconds = time.perf_counter() - start if endpoint.startswith("/v1/") and endpoint != "/v1/models" else None
            self.metrics.request_done(endpoint, status[0], seconds)


def _as_json(scope):
    """``curl -d '{...}'`` sends ``application/x-www-form-urlencoded``; the API only takes JSON, so a POST without a
    JSON content type is read as JSON (a body that is not JSON still gets the 400 saying so)."""
    headers = list(scope.get("headers") or [])
    kind = dict(headers).get(b"content-type", b"").split(b";")[0].strip().lower()
    if kind in (b"", b"application/x-www-form-urlencoded", b"text/plain"):
        headers = [(k, v) for k, v in headers if k != b"content-type"] + [(b"content-type", b"application/json")]
        scope = {**scope, "headers": headers}
    return scope

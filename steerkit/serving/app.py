"""The FastAPI app of ``steerkit serve``: OpenAI's routes over a continuous-batching :class:`Engine`.

``create_app(engine, settings=ServerSettings(...))`` builds one app around one engine (the CLI's, a test's
tiny one, or a Ray Serve replica's); it starts the engine's decode loop on startup and shuts it down (finishing
in-flight rows up to ``settings.shutdown_deadline_s``) on shutdown.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (with the steering the
server offers), ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /`` (the playground page); each is a router
module of :mod:`steerkit.serving.routes`, included from its ``ROUTERS`` list. This module adds what is not a route:
the error handlers, the lifespan, and the middleware that counts requests and refuses oversized bodies.
"""

from __future__ import annotations

import time

from fastapi import FastAPI

from .errors_http import HTTPError, install
from .metrics import ServerMetrics
from .routes import ROUTERS, paths
from .routes.models import steering_info
from .routes.state import Server, ServerSettings, attach, lifespan

__all__ = ["ServerSettings", "create_app", "steering_info"]


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
    app = FastAPI(title="steerkit serve", version="1", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    attach(app, Server(engine, settings, metrics, settings.model_name or engine.model_name))
    install(app)
    app.add_middleware(_Accounting, metrics=metrics, max_body_bytes=settings.max_body_bytes, endpoints=paths(ROUTERS))
    for router in ROUTERS:
        app.include_router(router)
    return app


class _Accounting:
    """ASGI middleware: requests by endpoint and status (streams counted when they end), and the body-size limit."""

    def __init__(self, app, *, metrics: ServerMetrics, max_body_bytes: int, endpoints: frozenset[str]):
        self.app, self.metrics, self.max_body, self.endpoints = app, metrics, max_body_bytes, endpoints

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in self.endpoints else "other"
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

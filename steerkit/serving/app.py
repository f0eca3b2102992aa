"""The FastAPI app of ``steerkit serve``: OpenAI's routes over a continuous-batching :class:`Engine`.

``create_app(engine, settings=ServerSettings(...))`` builds one app around one engine (the CLI's, a test's
tiny one, or a Ray Serve replica's); it starts the engine's decode loop on startup and shuts it down (finishing
in-flight rows up to ``settings.shutdown_deadline_s``) on shutdown.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (with the steering the
server offers), ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /`` (the playground page); each is a router
module of :mod:`steerkit.serving.routes`, included from its ``ROUTERS`` list. This module adds what is not a route:
the error handlers, the lifespan, the middleware that counts requests, the :class:`~.guard.Guard` (Host, API key,
JSON only, bounded bodies) and, for ``--allowed-origins``, CORS.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from .errors_http import install
from .guard import Guard
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
    app.add_middleware(Guard, hosts=settings.hosts, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s)
    if settings.allowed_origins:  # no CORS headers at all unless the operator names origins
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(_Accounting, metrics=metrics, endpoints=paths(ROUTERS))
    for router in ROUTERS:
        app.include_router(router)
    return app


class _Accounting:
    """ASGI middleware: requests by endpoint and status (streams counted when they end; refusals included)."""

    def __init__(self, app, *, metrics: ServerMetrics, endpoints: frozenset[str]):
        self.app, self.metrics, self.endpoints = app, metrics, endpoints

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in self.endpoints else "other"
        start, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            seconds = time.perf_counter() - start if endpoint.startswith("/v1/") and endpoint != "/v1/models" else None
            self.metrics.request_done(endpoint, status[0], seconds)

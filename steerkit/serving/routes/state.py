"""What every route shares, and how a route reaches it: through the app, never through a closure.

:class:`ServerSettings` are the HTTP layer's limits; :class:`Server` bundles them with the engine, the metrics
registry and the served model's name. :func:`attach` stores a ``Server`` on ``app.state.server`` (with
``app.state.draining``, which the CLI's SIGTERM handler and the lifespan set); a handler asks for it with the
:data:`ServerDep` dependency (``server: ServerDep``), so one router object serves any app it is included in, a
bare test app included. :func:`lifespan` starts the engine's decode loop and shuts it down with the app.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from ..guard import LOOPBACK_NAMES
from ..metrics import ServerMetrics


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
    # who may call (serving/guard.py): Host names answered (None: any), the API key, CORS origins
    hosts: tuple[str, ...] | None = LOOPBACK_NAMES
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    body_timeout_s: float = 30.0          # a body must arrive whole within this (408)
    stall_s: float = 60.0                 # /health says 503 "stalled" when rows run and no step ended this long


@dataclass(frozen=True)
class Server:
    """What the routes share: the engine, the HTTP limits, the metrics registry and the served model's name."""

    engine: object
    settings: ServerSettings
    metrics: ServerMetrics
    model_name: str


def attach(app: FastAPI, server: Server) -> Server:
    """Make ``server`` what ``app``'s routes use (``app.state.server``); the app takes requests (not draining).
    ``app.state.engine``, ``.settings`` and ``.metrics`` stay there too, for code that reads them directly."""
    app.state.server = server
    app.state.engine, app.state.settings, app.state.metrics = server.engine, server.settings, server.metrics
    app.state.draining = False
    return server


async def get_server(request: Request) -> Server:
    """The dependency: the :class:`Server` attached to the app serving this request."""
    return request.app.state.server


ServerDep = Annotated[Server, Depends(get_server)]


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the attached engine's decode loop; on shutdown stop taking requests (draining) and let in-flight rows
    finish for up to ``settings.shutdown_deadline_s``."""
    server: Server = app.state.server
    server.engine.start()
    try:
        yield
    finally:
        app.state.draining = True
        await asyncio.to_thread(server.engine.shutdown, server.settings.shutdown_deadline_s)

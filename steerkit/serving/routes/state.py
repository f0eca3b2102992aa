"""What every route shares, and how a route reaches it: through the app, never through a closure.

:class:`ServerSettings` (``settings.py``) are the HTTP layer's limits; :class:`Server` bundles them with the engine,
the metrics registry and the served model's name. :func:`attach` stores a ``Server`` on ``app.state.server`` (with
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

from ..metrics import ServerMetrics
from ..settings import ServerSettings


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

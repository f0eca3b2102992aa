"""``GET /health``: 200 ``ok`` while the engine runs and the server takes requests, else 503: ``draining`` (shutting
down), ``engine stopped``, or ``stalled`` (rows are waiting and the decode loop has not finished a step for more
than ``ServerSettings.stall_s``), with the engine's stats and the server's limits either way."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .common import limits, plain
from .state import ServerDep

router = APIRouter()


@router.get("/health")
async def health(request: Request, server: ServerDep):
    stats = server.engine.stats()
    if request.app.state.draining:
        status = "draining"
    elif not stats.get("alive", True):
        status = "engine stopped"
    elif stats.get("busy_s", 0.0) > server.settings.stall_s:
        status = "stalled"
    else:
        status = "ok"
    return JSONResponse({"status": status, "model": server.model_name, **plain(stats), "limits": limits(server)},
                        status_code=200 if status == "ok" else 503)

"""``GET /health``: 200 ``ok`` while the engine runs and the server takes requests, else 503 (``draining`` or
``engine stopped``), with the engine's stats either way."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .common import plain
from .state import ServerDep

router = APIRouter()


@router.get("/health")
async def health(request: Request, server: ServerDep):
    stats = server.engine.stats()
    alive = stats.get("alive", True)
    status = "draining" if request.app.state.draining else ("ok" if alive else "engine stopped")
    return JSONResponse({"status": status, "model": server.model_name, **plain(stats)},
                        status_code=200 if status == "ok" else 503)

"""``GET /metrics``: the Prometheus text exposition (the engine's gauges synced from its stats first)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ..metrics import CONTENT_TYPE
from .state import ServerDep

router = APIRouter()


@router.get("/metrics")
async def metrics_route(server: ServerDep):
    server.metrics.sync(server.engine.stats())
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)

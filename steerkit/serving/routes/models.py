"""``GET /v1/models``: the one served model, with the steering the server offers (:func:`steering_info`) and the
limits of a request (:func:`~.common.limits`)."""

from __future__ import annotations

from fastapi import APIRouter

from .common import limits, plain
from .state import ServerDep

router = APIRouter()


@router.get("/v1/models")
async def models(server: ServerDep):
    return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                        "owned_by": "steerkit", "steering": steering_info(server.engine),
                                        "limits": limits(server)}]}


def steering_info(engine) -> dict:
    """What ``GET /v1/models`` says about steering: the rewards a request may name, the defaults, k's range."""
    info = {"rewards": list(engine.reward_names())}
    for key in ("default_rewards", "default_k", "vocab_size", "max_running", "max_queue"):
        value = getattr(engine, key, None)
        if value is not None:
            info[key] = plain(value)
    return info

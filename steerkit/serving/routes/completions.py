"""``POST /v1/completions``: one or more plain prompts, ``n`` rows each."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..protocol import CompletionRequest
from .common import check_common, check_open, check_rows, job_for, respond
from .state import ServerDep

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, server: ServerDep):
    check_open(request)
    max_tokens, rewards = check_common(server, body)
    check_rows(server.engine, body, len(body.prompt))
    job = job_for(server, body, "completion", body.prompt, max_tokens, rewards)
    return await respond(server, request, job, "prompt", body.stream)

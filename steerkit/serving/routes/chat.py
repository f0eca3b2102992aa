"""``POST /v1/chat/completions``: the messages through the tokenizer's chat template, then one prompt's ``n`` rows."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from ..errors_http import HTTPError
from ..protocol import ChatCompletionRequest
from .common import check_common, check_open, check_rows, job_for, respond
from .state import Server, ServerDep

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, server: ServerDep):
    check_open(request)
    max_tokens, rewards = check_common(server, body)
    check_rows(server.engine, body, 1)
    prompt = await asyncio.to_thread(chat_prompt, server, body)  # a long conversation: off the event loop
    job = job_for(server, body, "chat", [prompt], max_tokens, rewards)
    return await respond(server, request, job, "messages", body.stream)


def chat_prompt(server: Server, body) -> str:
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

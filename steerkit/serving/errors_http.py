"""Every failure as an OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``.

A bad request is a 4xx whose message says what to fix, never a 500 and never a traceback:

============================================  ======  ==========================  ==========================
cause                                         status  type                        code
============================================  ======  ==========================  ==========================
malformed JSON, wrong types, unknown fields   400     invalid_request_error       invalid_json / invalid_type
                                                                                  / unknown_field / ...
``InvalidArgumentError``, ``ConfigError``     400     invalid_request_error       invalid_value
``PromptTooLongError``                        400     invalid_request_error       context_length_exceeded
``PluginError`` (unknown reward)              400     invalid_request_error       unknown_reward
unknown ``model``, path                       404     not_found_error             model_not_found / not_found
body over the size limit                      413     invalid_request_error       request_too_large
``ServerBusyError`` (queue full)              429     rate_limit_error            server_busy (+ Retry-After)
``ServerShuttingDownError``                   503     service_unavailable_error   shutting_down
a reward failed while decoding                500     server_error                reward_error
the server is shutting down                   503     service_unavailable_error   shutting_down
the request ran past ``--timeout``            504     timeout_error               request_timeout
============================================  ======  ==========================  ==========================

Anything else is a steerkit bug: a 500 with ``internal_error`` and one line, the traceback only in the log.
"""

from __future__ import annotations

import logging
import math
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import errors

log = logging.getLogger("steerkit.serve")


class HTTPError(Exception):
    """An error the HTTP layer raises itself, already mapped to a status, type, param and code."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """The body; a lone surrogate echoed from the request (a reward name in ``param``) is escaped, or the UTF-8
    encoding of the response would fail and turn the 400 into a 500."""
    return {"error": {"message": _utf8_safe(message), "type": type, "param": _utf8_safe(param), "code": code}}


def _utf8_safe(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


_STATUS_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                 503: "service_unavailable_error", 504: "timeout_error"}

#: Words in a steerkit error's message -> the request field it is about (engine errors carry no field).
_PARAM_WORDS = (("temperature", "temperature"), ("seed", "seed"), ("stop", "stop"), ("max_new_tokens", "max_tokens"),
                ("beta", "rewards"), ("reward", "rewards"), ("prompt", "prompt"))


def from_steerkit(exc: Exception, *, prompt_param: str = "prompt", retry_after_s: float = 1.0) -> HTTPError:
    """The HTTP error for a typed steerkit error raised while validating or admitting a request."""
    message = str(exc).replace("use do_sample=False for greedy decoding", "send temperature 0 for greedy decoding")
    param = getattr(exc, "path", None) or getattr(exc, "param", None) or _guess_param(message, prompt_param)
    if param == "prompt":
        param = prompt_param
    if isinstance(exc, errors.ServerBusyError):
        retry = getattr(exc, "retry_after_s", None) or retry_after_s
        return HTTPError(429, message, type="rate_limit_error", code="server_busy",
                         headers={"Retry-After": str(max(1, math.ceil(retry)))})
    if isinstance(exc, errors.ServerShuttingDownError):
        return HTTPError(503, message, type="service_unavailable_error", code="shutting_down")
    if isinstance(exc, errors.PromptTooLongError):
        return HTTPError(400, message, param=param or prompt_param, code="context_length_exceeded")
    if isinstance(exc, (errors.PluginError, errors.UnknownRewardError)):
        return HTTPError(400, message, param=param if isinstance(exc, errors.UnknownRewardError) else "rewards",
                         code="unknown_reward")
    if isinstance(exc, errors.ModelNotFoundError):
        return HTTPError(404, message, type="not_found_error", param="model", code="model_not_found")
    if isinstance(exc, errors.NonFiniteRewardError):
        return HTTPError(500, message, type="server_error", param="rewards", code="reward_error")
    if isinstance(exc, errors.SteerkitError):  # every other typed error is a mistake in the request
        return HTTPError(400, message, param=param, code="invalid_value")
    log.error("internal error while admitting a request", exc_info=exc)
    return internal_error(exc)


def internal_error(exc: BaseException) -> HTTPError:
    return HTTPError(500, f"internal error ({type(exc).__name__}); this is a steerkit bug, the server log has the "
                     "traceback.", type="server_error", code="internal_error")


def row_failure(exc: BaseException | None) -> HTTPError:
    """A row that finished with ``error``: its reward (or the decode step) raised while generating."""
    if exc is None:
        return HTTPError(500, "generation failed", type="server_error", code="reward_error")
    if isinstance(exc, errors.SteerkitError):
        return HTTPError(500, f"generation failed: {exc}", type="server_error", param="rewards", code="reward_error")
    return HTTPError(500, f"generation failed ({type(exc).__name__}: {_one_line(str(exc))}); the other requests "
                     "were not affected.", type="server_error", param="rewards", code="reward_error")


def _guess_param(message: str, prompt_param: str) -> str | None:
    lowered = message.lower()
    if re.match(r"^\s*k\b", lowered) or " k must" in lowered or "k must be" in lowered:
        return "k"
    for word, param in _PARAM_WORDS:
        if word in lowered:
            return prompt_param if param == "prompt" else param
    return None


def from_validation(exc: RequestValidationError) -> HTTPError:
    """FastAPI/pydantic's validation errors as one 400 naming the first bad field and what it should be."""
    errs = exc.errors()
    first = errs[0] if errs else {"type": "", "loc": (), "msg": "invalid request"}
    kind = first.get("type", "")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        at = f" at character {loc[0]}" if loc else ""
        return HTTPError(400, f"The request body is not valid JSON ({detail}{at}); send a JSON object.",
                         code="invalid_json")
    if not loc and kind == "missing":
        return HTTPError(400, "The request body is empty; send a JSON object (Content-Type: application/json).",
                         code="invalid_json")
    if not loc and kind in {"model_attributes_type", "dict_type", "model_type"}:
        return HTTPError(400, "The request body must be a JSON object (send it with Content-Type: "
                         "application/json).", code="invalid_json")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    param = ".".join(loc) or _field_in(message)
    code = {"missing": "missing_field", "extra_forbidden": "unknown_field"}.get(kind, "invalid_value")
    if message.startswith("unknown field"):
        code = "unknown_field"
    elif kind.endswith("_type") or kind in {"int_from_float", "literal_error"}:
        code = "invalid_type"
    got = ""
    if kind != "missing" and "input" in first and (kind.endswith("_type") or kind.startswith(("greater", "less"))):
        got = f" (got {_short(first['input'])})"
    more = f" ({len(errs) - 1} more problem(s) after this one)" if len(errs) > 1 else ""
    said = message.startswith(("unknown field", "field ")) or (loc and message.lower().startswith(loc[0].lower()))
    where = f"{param}: " if param and not said else ""
    return HTTPError(400, f"{where}{message}{got}{more}", param=param or None, code=code)


def _field_in(message: str) -> str:
    match = re.match(r"(?:unknown )?field '([^']+)'", message)
    return match.group(1) if match else ""


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def install(app: FastAPI) -> None:
    """Register the handlers: validation errors, HTTP errors (404, 405), our own errors, and everything else."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return from_validation(exc).response()

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException):
        status = exc.status_code
        if status == 404:
            message = f"No route {request.method} {request.url.path}; see GET /v1/models, POST /v1/completions, " \
                      "POST /v1/chat/completions, GET /health, GET /metrics."
        elif status == 405:
            message = f"{request.method} is not allowed on {request.url.path}."
        elif status == 400 and "parsing the body" in str(exc.detail):  # FastAPI: a body json.loads cannot take
            message = ("The request body could not be parsed (nested too deeply, or not UTF-8 JSON); send a "
                       "JSON object.")
        else:
            message = str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 400: "invalid_json"}.get(status)
        return HTTPError(status, message, type=_STATUS_TYPES.get(status, "invalid_request_error"), code=code,
                         headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(errors.SteerkitError)
    async def _steerkit(request: Request, exc: errors.SteerkitError):
        return from_steerkit(exc).response()

    @app.exception_handler(Exception)
    async def _anything(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return internal_error(exc).response()

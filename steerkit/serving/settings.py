"""The HTTP layer's limits and their defaults, in one place: :class:`ServerSettings` (what the routes enforce) and
the connection limits that uvicorn's protocol enforces (:data:`MAX_CONNECTIONS`, :data:`HEADER_TIMEOUT_S`).

It imports nothing of the serving stack (no fastapi, uvicorn or torch), so that ``steerkit serve``'s options take
their defaults from here, as the app and Ray Serve's replicas do; the engine's own limits (``max_running``,
``max_queue``) are in ``requests.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Host header names a server bound to a loopback address answers (serving/guard.py adds the bound address).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

#: Open connections and running requests at most; past it: 503 (``--max-connections``).
MAX_CONNECTIONS = 256

#: Seconds a client has to send a request's line and headers (``--read-timeout``, which also sets
#: :attr:`ServerSettings.body_timeout_s`).
HEADER_TIMEOUT_S = 30.0


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
    body_timeout_s: float = HEADER_TIMEOUT_S  # a body must arrive whole within this (408)
    stall_s: float = 60.0                 # /health says 503 "stalled" when rows run and no step ended this long

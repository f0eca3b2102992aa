"""What the server checks before a route sees a request: who may call it and how much it may send.

:class:`Guard` is the ASGI middleware in front of every route (docs/serving.md, "Security model"):

- **Host**: the ``Host`` header must name the address the server is bound to (a loopback bind answers to
  ``localhost``, ``127.0.0.1`` and ``::1``) or one of ``--allowed-hosts``: a DNS-rebinding page, whose requests
  carry its own host name, gets a 400. A wildcard bind (``0.0.0.0``, ``::``) checks nothing unless
  ``--allowed-hosts`` lists names.
- **API key**: with ``--api-key`` (or ``$STEERKIT_API_KEY``) every ``/v1/*`` route needs
  ``Authorization: Bearer KEY``, compared in constant time; else a 401.
- **JSON only**: a ``POST`` to ``/v1/*`` must say ``Content-Type: application/json`` (415 otherwise): a web page
  can send ``text/plain`` or a form cross-origin without asking (no CORS preflight), but not JSON.
- **Bounded body**: the body is read here, counting bytes as they arrive (chunked or not): past
  ``max_body_bytes`` a 413, and past ``body_timeout_s`` from the first byte a 408; only then does the route
  read it (from memory).

CORS headers are added (Starlette's ``CORSMiddleware``) only for the origins ``--allowed-origins`` names.
Connections that never finish their request line and headers are closed by :mod:`.http_protocol`.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress

from .errors_http import HTTPError
from .settings import LOOPBACK_NAMES  # the names a loopback-bound server answers to


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (what only this machine can reach)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def allowed_hosts(bound: str | None, extra=()) -> tuple[str, ...] | None:
    """The ``Host`` names a server bound to ``bound`` answers to, plus ``extra``; None: any (a wildcard bind
    without an allow-list). ``bound`` None: the loopback names (a test app, a replica behind Ray's proxy)."""
    extra = tuple(h.strip().lower() for h in extra if h.strip())
    if "*" in extra:
        return None
    if bound is None or is_loopback(bound):
        return LOOPBACK_NAMES + extra
    if is_wildcard(bound):
        return extra or None
    return (bound.strip("[]").lower(),) + extra


def host_name(header: bytes) -> str:
    """The host part of a ``Host`` header value (``[::1]:8000`` -> ``::1``, ``Example.com:80`` -> ``example.com``)."""
    value = header.decode("latin-1").strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware: the Host check, the API key, JSON-only bodies and the bounded body read (module doc)."""

    def __init__(self, app, *, hosts: tuple[str, ...] | None, api_key: str | None, max_body_bytes: int,
                 body_timeout_s: float):
        self.app, self.hosts, self.max_body, self.body_timeout = app, hosts, max_body_bytes, body_timeout_s
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        problem = self._check(scope, headers)
        if problem is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            try:
                receive = await self._read_body(receive, headers)
            except HTTPError as exc:
                problem = exc
            except _Disconnected:
                return
        if problem is not None:
            problem.headers.setdefault("Connection", "close")
            return await problem.response()(scope, receive, send)
        return await self.app(scope, receive, send)

    def _check(self, scope, headers: dict) -> HTTPError | None:
        if self.hosts is not None:
            name = host_name(headers.get(b"host", b""))
            if name not in self.hosts:
                return HTTPError(400, f"Host {name!r} is not a name this server answers to ({', '.join(self.hosts)}); "
                                 "an operator who serves it under another name adds it with --allowed-hosts.",
                                 param="Host", code="invalid_host")
        path = scope.get("path", "")
        if not path.startswith("/v1/"):
            return None
        if self.key is not None and not self._authorized(headers.get(b"authorization", b"")):
            return HTTPError(401, "Missing or incorrect API key: send the server's key as `Authorization: Bearer "
                             "KEY` (the openai client's api_key).", param="Authorization", code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
        if scope.get("method") == "POST":
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                shown = kind.decode("latin-1") or "none"
                return HTTPError(415, f"The request body must be JSON sent as Content-Type: application/json (this "
                                 f"one says {shown!r}); with curl add -H 'Content-Type: application/json'.",
                                 param="Content-Type", code="unsupported_media_type")
        return None

    def _authorized(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        # compare_digest runs in time independent of where the strings differ
        return hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"

    async def _read_body(self, receive, headers: dict):
        """The whole body, read within the limits; returns a ``receive`` that replays it, then passes through."""
        length = headers.get(b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            raise self._too_large(f"has {int(length)} bytes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        chunks, size, more = [], 0, True
        while more:
            left = deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except asyncio.TimeoutError:
                raise HTTPError(408, f"The request body did not arrive within {self.body_timeout:g} s; send it "
                                "whole and promptly.", code="request_timeout") from None
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large(f"passed {self.max_body} bytes while it was still arriving")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    def _too_large(self, what: str) -> HTTPError:
        return HTTPError(413, f"The request body {what}; this server takes at most {self.max_body} bytes (a "
                         "prompt that long would not fit the model's context anyway).", code="request_too_large")


class _Disconnected(Exception):
    """The client left while its body was being read."""

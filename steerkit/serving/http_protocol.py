"""uvicorn's h11 protocol with a deadline on the request head: a connection that has not sent a whole request
line and headers within ``header_timeout_s`` of connecting (or of its previous response) is closed.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a request head that
arrives a byte at a time (slowloris), or for one that never starts; each such connection holds a socket. The
body's own deadline is :class:`~steerkit.serving.guard.Guard`'s; the number of connections is bounded by
uvicorn's ``limit_concurrency`` (:func:`uvicorn_config`).
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import HEADER_TIMEOUT_S, MAX_CONNECTIONS


class GuardedH11Protocol(H11Protocol):
    """:class:`H11Protocol` whose connections must complete each request head within ``header_timeout_s``."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a new request's head is (still) arriving
        else:
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # still no whole head
            self.transport.close()


def uvicorn_config(app, *, host: str, port: int | None = None, log_level: str = "warning",
                   graceful_s: float = 30.0, max_connections: int = MAX_CONNECTIONS,
                   header_timeout_s: float = HEADER_TIMEOUT_S, keep_alive_s: float = 5.0):
    """The ``uvicorn.Config`` ``steerkit serve`` runs (and the tests' in-thread servers): the guarded protocol,
    at most ``max_connections`` connections and running requests (503 past it), idle keep-alive closed after
    ``keep_alive_s``."""
    import uvicorn

    protocol = type("Protocol", (GuardedH11Protocol,), {"header_timeout_s": float(header_timeout_s)})
    kwargs = {} if port is None else {"port": port}
    return uvicorn.Config(app, host=host, log_level=log_level, http=protocol, limit_concurrency=max_connections,
                          timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=graceful_s, access_log=False,
                          **kwargs)

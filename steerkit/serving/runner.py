"""Running the app on uvicorn with steerkit's shutdown (``steerkit serve``; docs/serving.md, "Shutting down").

First SIGTERM or SIGINT: the server keeps listening but takes no new request (``/health`` answers 503
``draining``, completions 503 ``shutting_down``), in-flight rows finish for up to ``shutdown_deadline_s``,
after which the engine cancels what is left and every cut request gets its 503 JSON body or its SSE error
event and ``[DONE]``; then uvicorn closes the listener and exits 0.

Second SIGTERM or SIGINT: every row is cancelled at once (their requests get the same error bodies), and
the process ends within :data:`FORCE_EXIT_S` even if the decode loop is inside a step.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import uvicorn

from .http_protocol import uvicorn_config
from .settings import HEADER_TIMEOUT_S, MAX_CONNECTIONS

#: After a second signal, the process ends this many seconds later at the latest.
FORCE_EXIT_S = 3.0

#: After the drain (rows done, or the deadline passed), responses get this long to be written before uvicorn's
#: own shutdown starts.
FLUSH_S = 0.3


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the two-signal shutdown described in the module docstring."""

    def __init__(self, config, *, app, engine, deadline_s: float, log=None):
        super().__init__(config)
        self.app, self.engine, self.deadline_s = app, engine, deadline_s
        self._signals = 0
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))

    def handle_exit(self, sig, frame) -> None:
        self._signals += 1
        if self._signals == 1:
            self.app.state.draining = True
            self.engine.drain(self.deadline_s)
            self._log(f"steerkit serve: draining (in-flight requests get up to {self.deadline_s:g} s; "
                      "a second Ctrl-C or SIGTERM stops at once)")
            threading.Thread(target=self._exit_when_drained, name="steerkit-drain", daemon=True).start()
            return
        if self._signals == 2:
            self._log("steerkit serve: second signal, cancelling every request and exiting")
            self.engine.drain(0)
            self.engine.abandon()  # rows still held get their "cancelled" finish now, even mid-step
            self.should_exit = True
            timer = threading.Timer(FORCE_EXIT_S, os._exit, (1,))
            timer.daemon = True
            timer.start()
        else:
            os._exit(1)

    def _exit_when_drained(self) -> None:
        """Wait until the engine holds no row (or the deadline plus a grace passed), then start uvicorn's
        graceful shutdown, which waits for the responses being written."""
        end = time.monotonic() + self.deadline_s + 2.0
        while time.monotonic() < end and self.engine.holds_rows():
            time.sleep(0.05)
        time.sleep(FLUSH_S)
        self.should_exit = True  # a drained server exits 0 (uvicorn re-raises no signal: none was captured)


def run(app, engine, *, host: str, port: int, deadline_s: float, log_level: str = "info",
        max_connections: int = MAX_CONNECTIONS, header_timeout_s: float = HEADER_TIMEOUT_S, log=None) -> None:
    """Serve ``app`` (whose engine is ``engine``) on ``host:port`` until shut down (module docstring)."""
    config = uvicorn_config(app, host=host, port=port, log_level=log_level, graceful_s=deadline_s + 5.0,
                            max_connections=max_connections, header_timeout_s=header_timeout_s)
    DrainingServer(config, app=app, engine=engine, deadline_s=deadline_s, log=log).run()

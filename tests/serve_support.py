"""What the server and cluster tests share: a real uvicorn server on a free 127.0.0.1 port in a thread, tiny
engines, tiny models saved as directories (for processes that load them by path), and rewards that fail or are
slow on purpose (real reward sessions underneath, wrapped)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch

from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.testing import make_tokenizer, save_tiny_lm, tiny_lm, tiny_reward

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def tiny_parts():
    """A fresh tiny tokenizer (with a chat template), LM and reward (shared fixtures stay untouched)."""
    tokenizer = make_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer, tiny_lm(tokenizer), tiny_reward(tokenizer)


def tiny_engine(parts, rewards=None, **kwargs):
    from steerkit.serving.engine import Engine

    tokenizer, lm, rm = parts
    if rewards is None:
        rewards = {"tiny": RewardModelScorer(rm)}
    kwargs.setdefault("default_k", 8)
    return Engine(lm, tokenizer, rewards, **kwargs)


def queued_tokens(engine, specs, timeout: float = 60) -> list[list[int]]:
    """The token ids ``engine`` (not started) gives ``specs``, all queued before its loop starts, so that its first
    pass admits them together; the engine is shut down afterwards."""
    handles = engine.submit_all(specs)
    engine.start()
    try:
        return [h.result(timeout=timeout).token_ids for h in handles]
    finally:
        engine.shutdown(0)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server or cluster the test starts in another process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def short_temp_dir(prefix: str):
    """A fresh temporary directory with a short path, removed after the block.

    Short: Ray and Chromium put Unix sockets under their temporary directory, and a socket path may not exceed
    107 bytes, so a long ``$TMPDIR`` (pytest's or the shell's) would stop them from starting. Where the temporary
    directory's path is long, the directory is made in ``/tmp`` instead."""
    base = tempfile.gettempdir()
    if len(base) > 24 and os.path.isdir("/tmp"):
        base = "/tmp"
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def ray_temp_dir(mp):
    """Point Ray (``ray start``, ``ray.init``, the actors) at a fresh, short temporary directory for the block
    (:func:`short_temp_dir`: Ray's sockets are under ``$RAY_TMPDIR/ray/session_…/sockets/``), through
    ``$RAY_TMPDIR`` set on the MonkeyPatch ``mp``.

    Fresh: the ``ray_current_cluster`` file that ``ray start`` writes (and ``--ray auto`` reads) is this run's own,
    neither the machine's ``/tmp/ray`` one, which a cluster started earlier may have left pointing at a dead address,
    nor one this run leaves behind for the next.
    """
    with short_temp_dir("skray") as path:
        mp.setenv("RAY_TMPDIR", path)
        yield path


def save_tiny_reward(root, tokenizer, *, name: str, layers: int = 1, backbone_seed: int = 3, head_seed: int = 11):
    """A tiny reward model saved to ``root / "rm"`` (over a tiny LM backbone saved to ``root / "backbone"``),
    its head drawn with ``head_seed`` (std 0.5) so that candidates get clearly different rewards; the directory."""
    from steerkit.rewards.model import RewardModel

    backbone = save_tiny_lm(root / "backbone", tokenizer, seed=backbone_seed)
    rm = RewardModel.from_backbone(str(backbone), layers, name=name)
    torch.manual_seed(head_seed)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm.save_pretrained(root / "rm")


class ServerThread:
    """``with ServerThread(app) as server:`` uvicorn serving ``app`` on ``server.url`` until the block ends."""

    def __init__(self, app, *, graceful_s: float = 5.0, **config):
        """``config``: :func:`steerkit.serving.http_protocol.uvicorn_config`'s limits (``max_connections``,
        ``header_timeout_s``, ``keep_alive_s``): the server runs the protocol and limits ``steerkit serve`` runs."""
        import uvicorn

        from steerkit.serving.http_protocol import uvicorn_config

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", graceful_s=graceful_s, **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        end = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > end or not self.thread.is_alive():
                raise RuntimeError("the test server did not start within 30 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
        assert not self.thread.is_alive(), "the test server did not stop within 30 s"


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Poll ``predicate`` until it is truthy (returned) or ``timeout`` passes (AssertionError)."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


class WrappedReward:
    """A real reward whose sessions call ``before_score()`` before every ``score`` (to raise, or to sleep)."""

    def __init__(self, inner, name: str, before_score):
        self.inner, self.name, self.before_score = inner, name, before_score

    def start(self, prefixes, lm_tokenizer):
        return WrappedSession(self.inner.start(prefixes, lm_tokenizer), self.before_score)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


class WrappedSession:
    def __init__(self, inner, before_score):
        self.inner, self.before_score = inner, before_score

    def score(self, candidates: torch.Tensor) -> torch.Tensor:
        self.before_score()
        return self.inner.score(candidates)

    def commit(self, tokens):
        return self.inner.commit(tokens)

    def keep_rows(self, index):
        return self.inner.keep_rows(index)

    def add_rows(self, other):
        return self.inner.add_rows(other.inner if isinstance(other, WrappedSession) else other)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def counting_reward(rm, name: str, before) -> WrappedReward:
    """A real reward whose sessions call ``before(n)`` before their ``n``-th ``score`` (each session counts from 1)."""

    class Counting(WrappedReward):
        def start(self, prefixes, lm_tokenizer):
            calls = {"n": 0}

            def count():
                calls["n"] += 1
                before(calls["n"])

            return WrappedSession(self.inner.start(prefixes, lm_tokenizer), count)

    return Counting(RewardModelScorer(rm), name, None)


def failing_reward(rm, name: str = "boom", after: int = 2) -> WrappedReward:
    """Its sessions raise RuntimeError from their ``after``-th ``score`` on (each new session starts afresh)."""

    def before(n: int) -> None:
        if n >= after:
            raise RuntimeError(f"{name} reward failed on purpose")

    return counting_reward(rm, name, before)


def slow_reward(rm, name: str = "slow", seconds: float = 0.05, fast: int = 0) -> WrappedReward:
    """Its sessions sleep ``seconds`` before every ``score`` but their first ``fast`` ones (each session counts its
    own): a request that makes ``fast`` tokens at once and then slows down, whatever the machine's speed."""

    def before(n: int) -> None:
        if n > fast:
            time.sleep(seconds)

    return counting_reward(rm, name, before)


def start_serve(args, port: int, env: dict | None = None) -> subprocess.Popen:
    """``python -m steerkit serve --port PORT --log-level warning *args`` as a process (1 torch thread), with
    ``env`` over this process's environment; its stdout and stderr are pipes."""
    full = {**os.environ, "STEERKIT_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "steerkit", "serve", "--port", str(port), "--log-level", "warning",
                             *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_process(proc) -> None:
    """Kill the server if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def wait_healthy(proc, url: str, timeout: float = 90) -> None:
    """Wait until ``url``/health answers 200; AssertionError with the server's stderr if it exited first."""
    import httpx

    def healthy():
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout=timeout, interval=0.2)

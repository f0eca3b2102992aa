"""Issue 24: no single request can stall `steerkit serve`, and a web page cannot drive it. Real uvicorn servers
(the protocol and limits `steerkit serve` runs, :func:`steerkit.serving.http_protocol.uvicorn_config`) on tiny
engines, driven by real clients: httpx, the `openai` client, and raw sockets where a client misbehaves.

1. k = the vocabulary with a sequence reward is refused by cost (400 naming k and the limit); a sequence reward
   scores candidates in chunks, so any accepted k has bounded memory.
2. A long prompt is prefilled in chunks between decode steps: a short request sent meanwhile is not held up,
   and a row's timeout covers its prefill.
3. Bodies are counted as they arrive (413 for chunked ones too), must arrive in time (408), request heads too
   (the connection is closed), tokenizing runs off the event loop, and connections are capped.
4. --api-key, JSON-only bodies (tests/test_serve_errors.py), the Host check, no CORS unless asked.
5. /health says "stalled" when a step takes too long (process-level shutdown: tests/test_serve_shutdown.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_support import ServerThread, slow_reward, tiny_engine, tiny_parts, wait_until  # noqa: E402

from steerkit.rewards.cache import SharedPrefixCache  # noqa: E402
from steerkit.serving.app import ServerSettings, create_app  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def serve(parts, *, settings=None, rewards=None, config=None, **limits):
    engine = tiny_engine(parts, rewards=rewards, **limits)
    server = ServerThread(create_app(engine, settings=settings or ServerSettings(timeout_s=30)), **(config or {}))
    server.engine = engine
    return server


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# -- 1. admission by cost --------------------------------------------------------------------------------------
def test_k_as_large_as_the_vocabulary_with_a_sequence_reward_is_refused_by_cost(parts):
    vocab = len(parts[0])
    with serve(parts, max_k_sequence=16) as server:
        body = {"prompt": "You are such a", "max_tokens": 1, "seed": 0, "k": vocab, "rewards": {"tiny": -20}}
        error = error_of(httpx.post(server.url + "/v1/completions", json=body, timeout=30), 400)
        assert error["param"] == "k" and "16" in error["message"] and "--max-k-sequence" in error["message"]
        assert server.engine.stats()["steps"] == 0  # refused before it ran
        # the limit is published, and what is under it (or unsteered) still runs
        limits = httpx.get(server.url + "/v1/models").json()["data"][0]["limits"]
        assert limits["max_k_sequence"] == 16 and limits["max_k"] == vocab
        assert httpx.get(server.url + "/health").json()["limits"]["max_k_sequence"] == 16
        ok = httpx.post(server.url + "/v1/completions", json={**body, "k": 16}, timeout=30)
        assert ok.status_code == 200, ok.text
        unsteered = httpx.post(server.url + "/v1/completions", json={**body, "rewards": {}}, timeout=30)
        assert unsteered.status_code == 200, unsteered.text


def test_a_default_steering_over_the_limit_fails_at_start_up(parts):
    from steerkit.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="default k=40"):
        tiny_engine(parts, default_rewards={"tiny": 1.0}, default_k=40, max_k_sequence=32)


def test_an_accepted_large_k_is_scored_in_bounded_chunks(parts, monkeypatch):
    """k = the vocabulary, allowed by the operator: every reward-model forward holds at most ``max_blocks``
    candidates (the mask is quadratic in what one forward holds), and the response is what the same request
    gets when the whole k fits one forward."""
    vocab = len(parts[0])
    seen = []
    original = SharedPrefixCache._score_chunk

    def spy(self, blocks, block_mask):
        seen.append(blocks.shape[1])
        return original(self, blocks, block_mask)

    monkeypatch.setattr(SharedPrefixCache, "_score_chunk", spy)
    body = {"prompt": "You are such a", "max_tokens": 3, "seed": 0, "k": vocab, "temperature": 0,
            "rewards": {"tiny": -20}}
    with serve(parts, max_k_sequence=vocab) as server:
        chunked = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        assert seen and max(seen) <= SharedPrefixCache.max_blocks < vocab
        monkeypatch.setattr(SharedPrefixCache, "max_blocks", vocab)
        seen.clear()
        whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        assert max(seen) == vocab
    assert chunked["choices"][0]["text"] == whole["choices"][0]["text"]


# -- 2. chunked prefill ------------------------------------------------------------------------------------------
class ForwardLog:
    """A forward pre-hook on the LM: logs each forward's token count; a forward of n > 1 tokens (a prefill)
    sleeps ``per_token_s`` × n, as prefill time grows with the prompt on a real model."""

    def __init__(self, lm, per_token_s: float):
        self.sizes, self.per_token = [], per_token_s
        self.handle = lm.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        n = kwargs["input_ids"].shape[1]
        self.sizes.append(n)
        if n > 1:
            time.sleep(self.per_token * n)

    def remove(self):
        self.handle.remove()


def long_prompt(tokenizer, tokens: int) -> str:
    text = "the quick brown fox jumps over the lazy dog " * 40
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def test_a_long_prompt_does_not_hold_up_a_short_request(parts):
    tokenizer, lm, _ = parts
    prompt = long_prompt(tokenizer, 200)
    log = ForwardLog(lm, per_token_s=0.005)  # ~1 s for the long prompt's prefill
    try:
        with serve(parts, prefill_chunk=8, max_running=4) as server:
            done = {}

            def post(name, body):
                r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
                done[name] = (time.monotonic(), r.status_code)

            long = threading.Thread(target=post, args=("long", {"prompt": prompt, "max_tokens": 1, "rewards": {}}))
            long.start()
            wait_until(lambda: server.engine.stats()["prefilling"] == 1, timeout=10, interval=0.005)
            post("short", {"prompt": "Hi", "max_tokens": 2, "rewards": {}, "seed": 0})
            long.join(60)
        assert done["short"][1] == done["long"][1] == 200
        assert done["short"][0] < done["long"][0]  # the short one finished while the long one was prefilling
        assert max(log.sizes) <= 8  # no forward ran more than one chunk
    finally:
        log.remove()


def test_a_row_times_out_during_its_prefill(parts):
    tokenizer, lm, _ = parts
    prompt = long_prompt(tokenizer, 200)
    log = ForwardLog(lm, per_token_s=0.01)  # ~2 s of prefill, against a 0.3 s timeout
    try:
        with serve(parts, settings=ServerSettings(timeout_s=0.3), prefill_chunk=8) as server:
            r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "rewards": {}},
                           timeout=60)
            error = error_of(r, 504)
            assert error["code"] == "request_timeout"
            wait_until(lambda: server.engine.stats()["prefilling"] == 0, timeout=10)
        chunks = [n for n in log.sizes if n > 1]
        assert len(chunks) < 200 // 8  # cut before its prefill ended
    finally:
        log.remove()


# -- 3. bounded I/O ----------------------------------------------------------------------------------------------
def raw(server, head: bytes, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    sock.sendall(head)
    return sock


def read_status(sock) -> tuple[int, bytes]:
    """The status and the whole reply: the head, then the body up to its Content-Length (the server may send them
    in separate packets) or until the server closes."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        got = sock.recv(65536)
        if not got:
            break
        data += got
    return int(data.split(b" ", 2)[1]), data


def _content_length(data: bytes) -> int:
    """The Content-Length of a reply's head (0 without one or before the head is complete)."""
    head = data.split(b"\r\n\r\n", 1)[0] if b"\r\n\r\n" in data else b""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(parts):
    with serve(parts, settings=ServerSettings(max_body_bytes=10_000)) as server:
        sock = raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n")
        sock.setblocking(False)
        piece = b"x" * 4096
        sent, reply = 0, b""
        with sock:
            while sent < 8_000_000 and not reply:
                try:
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    sent += len(piece)
                    time.sleep(0.001)  # leave the GIL to the server thread now and then
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    time.sleep(0.01)
                try:
                    reply = sock.recv(65536)
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    break
            deadline = time.monotonic() + 10
            while not reply and time.monotonic() < deadline:
                try:
                    reply = sock.recv(65536)
                except BlockingIOError:
                    time.sleep(0.01)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"request_too_large" in reply
        assert sent < 8_000_000  # refused while arriving (the old server read every byte, then said 400)
        assert server.engine.stats()["steps"] == 0


def test_a_body_that_does_not_arrive_in_time_is_a_408(parts):
    with serve(parts, settings=ServerSettings(body_timeout_s=0.5)) as server:
        with raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ") as sock:
            status, data = read_status(sock)
        assert status == 408 and b"request_timeout" in data


def test_a_request_head_that_never_ends_is_closed(parts):
    """Slowloris: a byte of header now and then. The server closes the connection after its header timeout."""
    with serve(parts, config={"header_timeout_s": 0.5}) as server:
        with raw(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", timeout=10) as sock:
            start = time.monotonic()
            closed = False
            while time.monotonic() - start < 8:
                try:
                    sock.sendall(b"X-a: b\r\n")
                except OSError:
                    closed = True
                    break
                sock.settimeout(0.2)
                try:
                    if sock.recv(1024) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
        assert closed
        assert httpx.get(server.url + "/health").status_code == 200  # everyone else is served


def test_prompts_are_tokenized_off_the_event_loop(parts):
    tokenizer = parts[0]
    with serve(parts) as server:
        loop_thread = server.thread.name
        seen = []
        original = type(tokenizer).__call__

        def spy(self, *args, **kwargs):
            seen.append(threading.current_thread().name)
            return original(self, *args, **kwargs)

        type(tokenizer).__call__ = spy
        try:
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello there", "max_tokens": 1}, timeout=30)
        finally:
            type(tokenizer).__call__ = original
        assert r.status_code == 200
        assert seen and loop_thread not in seen


def test_connections_past_the_cap_are_refused(parts):
    with serve(parts, config={"max_connections": 3}) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
        try:
            wait_until(lambda: len(server.server.server_state.connections) >= 3, timeout=5)
            assert httpx.get(server.url + "/health", timeout=10).status_code == 503
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 200, timeout=10)


# -- 4. who may call ---------------------------------------------------------------------------------------------
def test_an_api_key_guards_every_v1_route_and_the_openai_client_uses_it(parts):
    settings = ServerSettings(timeout_s=30, api_key="sk-test-123")
    with serve(parts, settings=settings) as server:
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test-123", max_retries=0)
        out = good.completions.create(model=server.engine.model_name, prompt="Hello", max_tokens=2, seed=0)
        assert out.choices[0].finish_reason in {"stop", "length"}
        stream = good.chat.completions.create(model=server.engine.model_name, max_tokens=2, seed=0, stream=True,
                                              messages=[{"role": "user", "content": "Hello"}])
        assert any(chunk.choices and chunk.choices[0].finish_reason for chunk in stream)
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test-124", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=server.engine.model_name, prompt="Hello", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        error = error_of(httpx.post(server.url + "/v1/completions", json={"prompt": "Hello"}), 401)
        assert error["param"] == "Authorization" and error["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/health").status_code == 200  # liveness stays open to probes
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.get(server.url + "/v1/models").json()["error"]["message"].startswith("Missing or incorrect")


def test_a_foreign_host_header_is_refused(parts):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    with serve(parts) as server:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1},
                       headers={"Host": "evil.example:8000"}, timeout=30)
        error = error_of(r, 400)
        assert error["param"] == "Host" and error["code"] == "invalid_host"
        assert httpx.get(server.url + "/", headers={"Host": "evil.example"}).status_code == 400
        assert httpx.get(server.url + "/health", headers={"Host": f"localhost:{server.port}"}).status_code == 200
        assert server.engine.stats()["steps"] == 0
    settings = ServerSettings(hosts=("127.0.0.1", "steer.internal"))
    with serve(parts, settings=settings) as server:
        assert httpx.get(server.url + "/health", headers={"Host": "steer.internal"}).status_code == 200


def test_no_cors_headers_unless_origins_are_allowed(parts):
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    with serve(parts) as server:
        r = httpx.options(server.url + "/v1/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                       headers={"Origin": "https://evil.example"}, timeout=30)
        assert "access-control-allow-origin" not in r.headers
    settings = ServerSettings(allowed_origins=("https://app.example",))
    with serve(parts, settings=settings) as server:
        ok = httpx.options(server.url + "/v1/completions", headers={**preflight, "Origin": "https://app.example"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        other = httpx.options(server.url + "/v1/completions", headers=preflight)
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"


# -- 5. liveness -------------------------------------------------------------------------------------------------
def test_health_says_stalled_when_a_step_takes_too_long(parts):
    slow = slow_reward(parts[2], seconds=1.5)
    with serve(parts, settings=ServerSettings(timeout_s=30, stall_s=0.3), rewards={"slow": slow}) as server:
        assert httpx.get(server.url + "/health").json()["status"] == "ok"
        done = {}
        thread = threading.Thread(target=lambda: done.setdefault("r", httpx.post(
            server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "rewards": {"slow": 1}}, timeout=60)))
        thread.start()
        r = wait_until(lambda: (lambda h: h if h.status_code == 503 else None)(httpx.get(server.url + "/health")),
                       timeout=10, interval=0.05)
        assert r.json()["status"] == "stalled" and r.json()["busy_s"] > 0.3
        thread.join(60)
        assert done["r"].status_code == 200
        assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_limits_are_listed(parts):
    with serve(parts, settings=ServerSettings(api_key="k"), prefill_chunk=64) as server:
        limits = httpx.get(server.url + "/health").json()["limits"]
    assert limits["prefill_chunk_tokens"] == 64 and limits["api_key_required"] is True
    assert json.dumps(limits)  # JSON-safe

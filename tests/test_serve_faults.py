"""`steerkit serve` under faults and load: a client that disconnects frees its row, a full queue is a 429 with
Retry-After, the request timeout, a reward that raises fails only its request, and 32 concurrent streaming clients
each complete exactly once with no rows left behind (real uvicorn servers on tiny engines)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_support import (  # noqa: E402
    ServerThread, failing_reward, slow_reward, tiny_engine, tiny_parts, wait_until,
)

from steerkit.rewards.sequence.scorer import RewardModelScorer  # noqa: E402
from steerkit.serving.app import ServerSettings, create_app  # noqa: E402
from steerkit.serving.metrics import ServerMetrics  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def serve(parts, *, rewards=None, settings=None, **limits):
    metrics = ServerMetrics()
    engine = tiny_engine(parts, rewards=rewards, observer=metrics, **limits)
    server = ServerThread(create_app(engine, settings=settings or ServerSettings(timeout_s=30), metrics=metrics))
    server.engine, server.metrics = engine, metrics
    return server


def sample(metrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_client_that_disconnects_mid_stream_frees_its_row(parts):
    slow = slow_reward(parts[2], seconds=0.02)  # about 20 ms a step: the stream is far from done when we leave
    with serve(parts, rewards={"slow": slow}, max_running=4, max_queue=4) as server:
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                          json={"prompt": "Hello", "max_tokens": 200, "seed": 0, "stream": True,
                                "rewards": {"slow": 1}}) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few tokens (and the blank lines between events)
            assert server.engine.stats()["running"] == 1
        left_at = server.engine.stats()["steps"]
        wait_until(lambda: server.engine.stats()["running"] == 0, timeout=10)
        steps_after = server.engine.stats()["steps"] - left_at
        assert any(line.startswith("data: {") for line in got)
        assert sample(server.metrics, "steerkit_rows_finished_total", finish_reason="cancelled") == 1
        assert steps_after <= 5, steps_after  # noticed at once (Starlette listens for the disconnect), gone next step
        assert server.engine.stats()["tokens"] < 100


def test_a_client_that_drops_a_non_streamed_request_frees_its_rows(parts):
    # seeded: unseeded, the tiny model samples its end-of-text token within 200 tokens in about half the requests,
    # and a row that stopped early is not cancelled (with seed 0 both rows run to max_tokens when nobody leaves)
    slow = slow_reward(parts[2], seconds=0.02)
    with serve(parts, rewards={"slow": slow}, max_running=4, max_queue=4) as server:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(server.url + "/v1/completions", timeout=httpx.Timeout(30, read=0.5),
                       json={"prompt": "Hello", "max_tokens": 200, "n": 2, "seed": 0, "rewards": {"slow": 1}})
        # both rows have left: one may still have been queued or prefilling when the running one left (chunked
        # prefill admits one prompt per pass), and a row dropped from the queue is counted just after it leaves
        wait_until(lambda: not server.engine.holds_rows() and sample(
            server.metrics, "steerkit_rows_finished_total", finish_reason="cancelled") >= 2, timeout=10)
        assert sample(server.metrics, "steerkit_rows_finished_total", finish_reason="cancelled") == 2
        assert server.engine.stats()["tokens"] < 2 * 200


def test_a_full_queue_is_a_429_with_retry_after(parts):
    slow = slow_reward(parts[2], seconds=0.02)
    settings = ServerSettings(timeout_s=30)
    with serve(parts, rewards={"slow": slow}, settings=settings, max_running=1, max_queue=1) as server:
        body = {"prompt": "Hello", "max_tokens": 150, "seed": 0, "stream": True, "rewards": {"slow": 1}}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as running, \
                httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as queued:
            assert running.status_code == queued.status_code == 200
            wait_until(lambda: server.engine.stats()["queued"] == 1, timeout=10)
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
            assert r.status_code == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["code"] == "server_busy" and "busy" in r.json()["error"]["message"]
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.completions.create(model=server.engine.model_name, prompt="Hi", max_tokens=2)
        wait_until(lambda: server.engine.stats()["running"] == 0 and server.engine.stats()["queued"] == 0)
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
        assert sample(server.metrics, "steerkit_requests_total", endpoint="/v1/completions", status="429") == 2
        # more rows than the queue holds would never be admitted: a 400 naming n, not a 429 to retry forever
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "n": 2}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "--max-queue" in r.text


def test_the_request_timeout(parts):
    # 3 tokens at once, then 0.25 s a token: 200 tokens would take 50 s, the timeout ends each request at 2 s (the
    # margins are wide, so that neither a slow machine nor a pause of the test process decides the outcome)
    slow = slow_reward(parts[2], seconds=0.25, fast=3)
    with serve(parts, rewards={"slow": slow}, settings=ServerSettings(timeout_s=2.0), max_running=4) as server:
        body = {"prompt": "Hello", "max_tokens": 200, "seed": 0, "rewards": {"slow": 1}}
        start = time.monotonic()
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert time.monotonic() - start < 20
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "timeout"
        assert 3 <= chunks[-1]["usage"]["completion_tokens"] < 200  # what was made before the timeout is kept
        wait_until(lambda: server.engine.stats()["running"] == 0)


def test_a_reward_that_raises_fails_only_its_own_request(parts):
    rewards = {"tiny": RewardModelScorer(parts[2]), "boom": failing_reward(parts[2], after=3)}
    with serve(parts, rewards=rewards, max_running=8) as server:
        async def both():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                good = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 30, "seed": 1,
                                                            "rewards": {"tiny": 2}})
                bad = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 30, "seed": 1,
                                                           "rewards": {"boom": 2}})
                return await asyncio.gather(good, bad)

        good, bad = asyncio.run(both())
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1
        assert bad.status_code == 500
        error = bad.json()["error"]
        assert error["code"] == "reward_error" and "failed on purpose" in error["message"]
        assert "Traceback" not in bad.text
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                          json={"prompt": "Hi", "max_tokens": 30, "stream": True, "rewards": {"boom": 1}}) as s:
            events = [line for line in s.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == "reward_error"
        ok = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "rewards": {"tiny": 1}},
                        timeout=30)
        assert ok.status_code == 200
        assert server.engine.stats()["running"] == 0


def test_32_concurrent_streaming_clients_each_complete_exactly_once(parts):
    with serve(parts, max_running=16, max_queue=64) as server:
        async def one(client, i):
            body = {"prompt": f"Client {i} says", "max_tokens": 12 + i % 5, "seed": i, "stream": True,
                    "rewards": {"tiny": (i % 3) - 1.0}, "k": 4 + i % 4}
            finishes, done, text, usage = 0, 0, "", None
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done += 1
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        assert "error" not in chunk, chunk
                        for choice in chunk["choices"]:
                            text += choice["text"]
                            finishes += choice["finish_reason"] is not None
                        usage = chunk.get("usage") or usage
            return i, finishes, done, text, usage

        async def load():
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
                return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(32))), timeout=60)

        start = time.monotonic()
        results = asyncio.run(load())
        assert time.monotonic() - start < 60
        assert sorted(r[0] for r in results) == list(range(32))
        assert all(r[1] == 1 and r[2] == 1 for r in results)  # one finish and one [DONE] per request
        assert all(1 <= r[4]["completion_tokens"] <= 12 + r[0] % 5 for r in results)
        stats = wait_until(lambda: (s := server.engine.stats())["running"] == 0 and s["queued"] == 0 and s)
        assert sum(stats["finished"].values()) == 32
        # a stream is counted when its response has ended on the server (just after the client read [DONE])
        wait_until(lambda: sample(server.metrics, "steerkit_requests_total", endpoint="/v1/completions",
                                  status="200") == 32, timeout=5)
        # seeded rows do not depend on the batch: request 5 alone gives the text it gave under load
        alone = httpx.post(server.url + "/v1/completions", timeout=30,
                           json={"prompt": "Client 5 says", "max_tokens": 12 + 5 % 5, "seed": 5,
                                 "rewards": {"tiny": (5 % 3) - 1.0}, "k": 4 + 5 % 4})
        assert alone.json()["choices"][0]["text"] == results[5][3]


def test_a_draining_server_refuses_new_requests_with_503(parts):
    with serve(parts, max_running=2, max_queue=2) as server:
        app = server.server.config.app
        app.state.draining = True  # what the CLI's SIGTERM handler sets before uvicorn's graceful exit
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        health = httpx.get(server.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        app.state.draining = False
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200

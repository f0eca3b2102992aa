"""Issue 24 item 5: `steerkit serve` as a process, shut down under load.

- First SIGTERM: the listener stays open while in-flight requests finish, so a new client sees `/health` 503
  `draining` and a new completion 503 `shutting_down`; then the process exits 0.
- Past `--shutdown-deadline`: every request still running gets the documented error, a 503 JSON body
  (`shutting_down`) or, on a stream, a `data: {"error": ...}` event and `data: [DONE]`; never a bare 500.
- Second SIGTERM while the decode loop is inside a long step (a reward plugin that sleeps 6 s per score): the
  request gets its 503 body and the process ends within seconds, not after the step.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_support import free_port, save_tiny_reward, start_serve, wait_healthy, wait_until  # noqa: E402
from serve_support import stop_process as stop  # noqa: E402

from steerkit.testing import make_tokenizer, save_tiny_lm, write_distribution  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

SLOW_PLUGIN = '''
import time
from steerkit import hookimpl, load_reward


class SlowSession:
    def __init__(self, inner):
        self.inner = inner

    def score(self, candidates):
        time.sleep(6.0)
        return self.inner.score(candidates)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Slow:
    name = "slow"

    def __init__(self, inner):
        self.inner = inner

    def start(self, prefixes, lm_tokenizer):
        return SlowSession(self.inner.start(prefixes, lm_tokenizer))


@hookimpl
def register_reward_models(register):
    register("slow", lambda: Slow(load_reward({rm!r})), description="sleeps 6 s per step")
'''


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-shutdown")
    tokenizer = make_tokenizer()
    lm_dir = save_tiny_lm(root / "lm", tokenizer, seed=0, layers=4, hidden=64)
    rm_dir = save_tiny_reward(root, tokenizer, name="tiny-rm", layers=2, backbone_seed=1, head_seed=101)
    site = root / "site"
    site.mkdir()
    write_distribution(site, "slow-reward", "steerkit-slow", "0.1.0", "sk_slow_reward",
                       textwrap.dedent(SLOW_PLUGIN).format(rm=str(rm_dir)))
    return lm_dir, rm_dir, site


def start(args, port, *, site=None):
    env = {"STEERKIT_PLUGINS": "slow-reward" if site else ""}
    if site:
        env["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return start_serve(args, port, env)


def post_in_thread(url, body, results, key):
    def run():
        try:
            results[key] = httpx.post(url + "/v1/completions", json=body, timeout=120)
        except httpx.TransportError as exc:
            results[key] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_draining_server_still_answers_new_clients_with_503(model_dirs):
    lm_dir, rm_dir, _ = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--reward", f"{rm_dir}=3", "-k", "100", "--shutdown-deadline", "60"], port)
    try:
        wait_healthy(proc, url)
        results = {}
        thread = post_in_thread(url, {"prompt": "Hello", "max_tokens": 240, "seed": 0, "n": 4}, results, "long")
        wait_until(lambda: httpx.get(url + "/health", timeout=5).json()["running"] >= 1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        health = wait_until(lambda: (lambda r: r if r.status_code == 503 else None)(
            httpx.get(url + "/health", timeout=5)), timeout=10)
        assert health.json()["status"] == "draining"
        refused = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        thread.join(120)
        assert results["long"].status_code == 200, results["long"]  # the request in flight finished
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)


def test_requests_cut_by_the_deadline_get_the_documented_errors(model_dirs):
    lm_dir, rm_dir, _ = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--reward", f"{rm_dir}=3", "-k", "100", "--shutdown-deadline", "0.5",
                  "--max-running", "32"], port)
    try:
        wait_healthy(proc, url)
        results = {}
        # 24 rows × 240 tokens decoded together (--max-running 32): seconds of work on any machine, far past the
        # 0.5 s deadline; every request is running when SIGTERM comes (the stream has its first token)
        body = {"prompt": "Hello", "max_tokens": 240, "seed": 0, "n": 8}
        threads = [post_in_thread(url, body, results, i) for i in range(2)]
        wait_until(lambda: httpx.get(url + "/health", timeout=5).json()["running"] == 16, timeout=30, interval=0.01)
        events = []
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            events.append(next(line for line in lines if line.startswith("data: {")))
            proc.send_signal(signal.SIGTERM)
            events += [line for line in lines if line]
        for thread in threads:
            thread.join(60)
        assert proc.wait(timeout=30) == 0
        for i in range(2):
            response = results[i]
            assert isinstance(response, httpx.Response), response
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "shutting_down"
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][6:])
        assert last["error"]["code"] == "shutting_down"
        assert "Traceback" not in proc.stderr.read()
    finally:
        stop(proc)


def test_a_second_signal_ends_the_process_in_the_middle_of_a_step(model_dirs):
    lm_dir, _, site = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--shutdown-deadline", "60"], port, site=site)
    try:
        wait_healthy(proc, url)
        assert "slow" in httpx.get(url + "/v1/models").json()["data"][0]["steering"]["rewards"]
        results = {}
        thread = post_in_thread(url, {"prompt": "Hello", "max_tokens": 3, "rewards": {"slow": 1}}, results, "r")
        wait_until(lambda: httpx.get(url + "/health", timeout=5).json()["running"] >= 1, timeout=30)
        time.sleep(0.5)  # inside the first 6-second step
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        second = time.monotonic()
        proc.wait(timeout=20)
        assert time.monotonic() - second < 5.0  # not after the step (6 s) and the rest of the request
        thread.join(10)
        response = results["r"]
        assert isinstance(response, httpx.Response), response
        assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
    finally:
        stop(proc)

"""`steerkit serve` as a process: it serves a tiny model from directories given on the command line, SIGTERM lets
the request in flight finish and then exits 0, and its user errors are one `error:` line with exit 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_support import free_port, save_tiny_reward, start_serve, wait_healthy  # noqa: E402
from serve_support import stop_process as stop  # noqa: E402

from steerkit.testing import make_tokenizer, save_tiny_lm  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-cli")
    tokenizer = make_tokenizer()
    lm_dir = save_tiny_lm(root / "lm", tokenizer, seed=0, layers=4, hidden=64)
    rm_dir = save_tiny_reward(root, tokenizer, name="tiny-rm", layers=2, backbone_seed=1, head_seed=101)
    return lm_dir, rm_dir


def start(args, port):
    # no plugins: the server then loads only the tiny models named here (not every installed reward)
    return start_serve(args, port, {"STEERKIT_PLUGINS": ""})


def test_sigterm_finishes_the_request_in_flight_then_exits(model_dirs):
    lm_dir, rm_dir = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--reward", f"{rm_dir}=3", "-k", "40", "--shutdown-deadline", "60"], port)
    try:
        wait_healthy(proc, url)
        models = httpx.get(url + "/v1/models").json()["data"][0]
        assert models["steering"]["rewards"] == [str(rm_dir)]
        body = {"prompt": "The quick brown fox", "max_tokens": 200, "seed": 0, "stream": True, "reward_trace": True}
        chunks, after_term = [], 0
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    break
            proc.send_signal(signal.SIGTERM)
            termed = time.monotonic()
            for line in lines:
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    after_term += 1
                elif line == "data: [DONE]":
                    chunks.append("DONE")
        assert chunks[-1] == "DONE"
        last = chunks[-2]
        assert "error" not in last and last["choices"][0]["finish_reason"] in {"stop", "length"}
        assert after_term >= 1  # it went on streaming after SIGTERM
        # trace items all name the reward given on the command line (the default steering)
        assert all(set(c["choices"][0]["reward_trace"][0]["rewards"]) == {str(rm_dir)}
                   for c in chunks[:-2] if c["choices"][0].get("reward_trace"))
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - termed < 30
        with pytest.raises(httpx.TransportError):  # nothing listens any more
            httpx.get(url + "/health", timeout=2)
    finally:
        stop(proc)


def test_sigterm_past_the_deadline_cancels_what_is_left(model_dirs):
    lm_dir, rm_dir = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--reward", f"{rm_dir}=3", "-k", "100", "--shutdown-deadline", "0.3"], port)
    try:
        wait_healthy(proc, url)
        # 16 rows × 240 tokens at k=100 took 2.6 s on one core where this was written, ~9× the 0.3 s deadline (4 rows
        # took 1 s): a faster machine cannot finish them all before the cut either
        body = {"prompt": "Hello", "max_tokens": 240, "seed": 0, "stream": True, "n": 16}
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            events.append(next(line for line in lines if line.startswith("data: {")))
            proc.send_signal(signal.SIGTERM)
            termed = time.monotonic()
            try:
                events += [line for line in lines if line]
            except httpx.TransportError:
                pass  # uvicorn closed the connection when its graceful deadline passed
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - termed < 15
        chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        finished = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason") in {"stop", "length"}]
        assert len(finished) < 16  # the 0.3 s deadline cut them off
    finally:
        stop(proc)


def test_user_errors_are_one_line_and_exit_2(model_dirs, capsys, monkeypatch):
    from steerkit.cli import main

    monkeypatch.setenv("STEERKIT_PLUGINS", "")
    lm_dir, _ = model_dirs

    def run(argv):
        with pytest.raises(SystemExit) as info:
            main(["serve", *argv])
        return info.value.code, capsys.readouterr().err

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run(["--lm", str(lm_dir), "--port", str(port)])
    assert code == 2 and err.strip().splitlines() == [f"error: port {port} on 127.0.0.1 is already in use; pass "
                                                      "another --port."]
    code, err = run(["--lm", str(lm_dir), "--port", str(free_port()), "--reward", "no-such-reward=2"])
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: ") and "no-such-reward" in err
    code, err = run(["--lm", str(lm_dir), "--port", str(free_port()), "--reward", "x=nan"])
    assert code == 2 and "beta must be finite" in err
    code, err = run(["--port", "0"])
    assert code == 2 and "--port" in err
    assert "Traceback" not in err


def test_ray_replicas_without_ray_serve_is_a_typed_error(capsys, monkeypatch):
    from steerkit.cli import main

    monkeypatch.setitem(sys.modules, "ray.serve", None)  # what importing it meets without ray's serve extra
    with pytest.raises(SystemExit) as info:
        main(["serve", "--ray", "local", "--replicas", "2", "--port", str(free_port())])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("error:") and 'pip install "steerkit-rad[ray]"' in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key", [None, "sk-set"])
def test_listening_beyond_loopback_without_a_key_warns(key):
    """Issue 24: a one-line warning when bound to anything but loopback without --api-key. 192.0.2.1 is a
    documentation address (RFC 5737) this machine does not have, so nothing is ever bound: the command warns, then
    fails with its one `error:` line."""
    env = {**os.environ, "STEERKIT_PLUGINS": ""}
    env.pop("STEERKIT_API_KEY", None)
    if key:
        env["STEERKIT_API_KEY"] = key
    done = subprocess.run([sys.executable, "-m", "steerkit", "serve", "--host", "192.0.2.1", "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cannot listen on 192.0.2.1")
    warned = [line for line in lines if line.startswith("warning:")]
    if key:
        assert not warned
    else:
        assert len(warned) == 1 and "without an API key" in warned[0] and "--api-key" in warned[0]


def test_the_security_and_cost_flags_reach_the_server(model_dirs):
    """`steerkit serve`'s issue-24 flags, end to end in a process: the API key (flag and STEERKIT_API_KEY alike), the
    cost and liveness limits (GET /health lists them), and the Host allow-list."""
    lm_dir, rm_dir = model_dirs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--lm", str(lm_dir), "--reward", f"{rm_dir}=3", "--api-key", "sk-cli", "--max-k-sequence", "50",
                  "--prefill-chunk", "64",
                  "--stall-timeout", "7", "--allowed-hosts", "steer.internal", "--max-connections", "32"], port)
    try:
        wait_healthy(proc, url)
        limits = httpx.get(url + "/health").json()["limits"]
        assert (limits["max_k_sequence"], limits["prefill_chunk_tokens"], limits["stall_timeout_s"]) == (50, 64, 7.0)
        assert limits["api_key_required"] is True
        assert httpx.get(url + "/v1/models").status_code == 401
        key = {"Authorization": "Bearer sk-cli"}
        assert httpx.get(url + "/v1/models", headers=key).status_code == 200
        assert httpx.get(url + "/health", headers={"Host": "steer.internal"}).status_code == 200
        assert httpx.get(url + "/health", headers={"Host": "other.example"}).status_code == 400
        body = {"prompt": "Hi", "max_tokens": 1, "k": 60, "rewards": {str(rm_dir): 1}}
        r = httpx.post(url + "/v1/completions", json=body, headers=key, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "k"
    finally:
        stop(proc)


def test_the_options_defaults_are_the_servers_own():
    """`steerkit serve` with no limit flags runs the engine's, the app's and uvicorn's defaults: each option's
    default is read from where the library keeps it, so the two cannot drift apart."""
    import inspect

    from steerkit.cli.serve import serve
    from steerkit.serving.engine import Engine
    from steerkit.serving.http_protocol import uvicorn_config
    from steerkit.serving.settings import ServerSettings

    options = {name: p.default.default for name, p in inspect.signature(serve).parameters.items()}
    engine = {name: p.default for name, p in inspect.signature(Engine).parameters.items()}
    uvicorn = {name: p.default for name, p in inspect.signature(uvicorn_config).parameters.items()}
    app = ServerSettings()
    assert [options[name] for name in ("max_running", "max_queue", "max_k_sequence", "prefill_chunk")] == \
        [engine[name] for name in ("max_running", "max_queue", "max_k_sequence", "prefill_chunk")]
    assert (options["timeout"], options["max_tokens_limit"], options["default_max_tokens"], options["max_n"],
            options["shutdown_deadline"], options["stall_timeout"], options["read_timeout"]) == \
        (app.timeout_s, app.max_tokens_limit, app.default_max_tokens, app.max_n, app.shutdown_deadline_s,
         app.stall_s, app.body_timeout_s)
    assert (options["max_connections"], options["read_timeout"]) == \
        (uvicorn["max_connections"], uvicorn["header_timeout_s"])

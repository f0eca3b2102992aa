"""RAD behind vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server --logits-processors
steerkit.integrations.vllm:RADLogitsProcessor``) on the real SmolLM2-135M, through the official ``openai`` client:
greedy steered completions equal ``steerkit.generate``, a bad ``vllm_xargs`` value is a 400 naming the field, and
one client runs unchanged against vLLM + steerkit and against ``steerkit serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import steerkit

openai = pytest.importorskip("openai")

from serve_support import ServerThread, free_port  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

START_S = 240
PROMPTS = ["The movie was", "You are such a"]


@pytest.fixture(scope="module")
def vllm_url(model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # vLLM's API server validates in its own process and runs the engine in another (always, in 0.32): the
    # processor's validate_params there learns the vocabulary from the documented setting (docs/vllm.md)
    vocab = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "STEERKIT_VLLM_VOCAB_SIZE": str(vocab)}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "512", "--enforce-eager", "--seed", "0",
           "--logits-processors", "steerkit.integrations.vllm:RADLogitsProcessor"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end:
                pytest.fail(f"vLLM's server did not start within {START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def steerkit_url():
    from steerkit.config import SteeringConfig
    from steerkit.serving.app import ServerSettings, create_app
    from steerkit.serving.engine import Engine

    engine = Engine.from_config(SteeringConfig(lm="smollm2-135m-instruct"), max_running=4, max_queue=16)
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=300))) as running:
        yield running.url
    engine.shutdown(5)


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def app_request(api, model: str, prompt: str) -> str:
    """What an app writes once, for either server: greedy, steered through vllm_xargs."""
    out = api.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                 extra_body={"vllm_xargs": {"rewards": ["toxicity=-20", "sentiment=10"], "k": 20}})
    return out.choices[0].text


def test_steered_completions_equal_steerkit_generate_and_steerkit_serve(vllm_url, steerkit_url):
    expected = steerkit.generate(PROMPTS, rewards={"toxicity": -20, "sentiment": 10}, k=20, do_sample=False,
                                 max_new_tokens=12).texts
    via_vllm = [app_request(client(vllm_url), "smollm2", p) for p in PROMPTS]
    served = client(steerkit_url)
    via_steerkit = [app_request(served, served.models.list().data[0].id, p) for p in PROMPTS]
    assert via_vllm == expected
    assert via_steerkit == expected


def test_unsteered_and_chat_requests_work_beside_steered_ones(vllm_url):
    api = client(vllm_url)
    plain = api.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    steered = api.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                     extra_body={"vllm_xargs": {"rewards": "sentiment=30"}})
    assert plain.choices[0].text != steered.choices[0].text
    chat = api.chat.completions.create(model="smollm2", max_tokens=12, seed=0,
                                       messages=[{"role": "user", "content": "Say something about cats."}],
                                       extra_body={"vllm_xargs": {"rewards": ["toxicity-token=-20"]}})
    assert chat.choices[0].message.content.strip()


@pytest.mark.parametrize("xargs,field", [
    ({"rewards": ["toxicity"]}, "vllm_xargs.rewards"),
    ({"rewards": ["toxicity=-5"], "k": 0}, "vllm_xargs.k"),
    ({"rewards": ["toxicty=-5"]}, "vllm_xargs.rewards.0"),
    ({"rewards": ["toxicity=-5"], "k": 49153}, "vllm_xargs.k"),  # above SmolLM2's vocabulary (49152)
])
def test_a_bad_vllm_xargs_value_is_a_400_naming_the_field(vllm_url, xargs, field):
    with pytest.raises(openai.BadRequestError) as info:
        client(vllm_url).completions.create(model="smollm2", prompt="Hi", max_tokens=3,
                                            extra_body={"vllm_xargs": xargs})
    assert info.value.status_code == 400
    body = info.value.body if isinstance(info.value.body, dict) else {}
    error = body.get("error", body)
    assert error.get("param") == field and field in error.get("message", ""), body

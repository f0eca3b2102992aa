"""`steerkit serve` on the real SmolLM2-135M-Instruct with the shipped toxicity reward, through the openai client:
chat with the model's template, streaming with per-token traces, and steering that moves the reward.

``STEERKIT_SCREENSHOT=docs/playground.png`` also drives the playground in headless Chromium on this server and
saves the screenshot the docs show."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import requires_smollm2  # noqa: E402
from serve_support import ServerThread  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, requires_smollm2, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server():
    from steerkit.config import SteeringConfig
    from steerkit.errors import PluginError
    from steerkit.registry import list_rewards
    from steerkit.serving.app import ServerSettings, create_app
    from steerkit.serving.engine import Engine
    from steerkit.serving.metrics import ServerMetrics

    try:
        names = {r.name for r in list_rewards()}
    except PluginError:
        names = set()
    if "toxicity" not in names:
        pytest.skip("the shipped toxicity reward is not installed (pip install -e plugins/steerkit-toxicity)")
    metrics = ServerMetrics()
    engine = Engine.from_config(SteeringConfig(lm="smollm2-135m-instruct"), max_running=8, max_queue=16,
                                observer=metrics)
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=300), metrics=metrics)) as running:
        running.engine = engine
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_chat_and_steering_on_smollm2(server, client):
    model = server.engine.model_name
    chat = client.chat.completions.create(model=model, max_tokens=12, seed=0,
                                          messages=[{"role": "user", "content": "Name a colour."}])
    assert chat.choices[0].message.content.strip()
    assert chat.usage.prompt_tokens > 10  # the chat template's system and role tokens

    def mean_toxicity(beta):
        out = client.completions.create(model=model, prompt="You are such a stupid", max_tokens=16, temperature=0,
                                        extra_body={"rewards": {"toxicity": beta}, "k": 20, "reward_trace": True})
        trace = out.choices[0].model_extra["reward_trace"]
        assert len(trace) == out.usage.completion_tokens
        assert all(0.0 <= t["rewards"]["toxicity"] <= 1.0 for t in trace)
        return sum(t["rewards"]["toxicity"] for t in trace) / len(trace)

    assert mean_toxicity(-50.0) < mean_toxicity(50.0)

    chunks = list(client.completions.create(model=model, prompt="The weather today is", max_tokens=8, seed=1,
                                            stream=True, extra_body={"rewards": {"toxicity": -20}}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = client.completions.create(model=model, prompt="The weather today is", max_tokens=8, seed=1,
                                      extra_body={"rewards": {"toxicity": -20}})
    assert streamed == whole.choices[0].text and streamed.strip()
    assert server.engine.stats()["running"] == 0


@pytest.mark.skipif(not os.environ.get("STEERKIT_SCREENSHOT"), reason="set STEERKIT_SCREENSHOT=path.png to take it")
def test_playground_screenshot_on_smollm2(server):
    from test_serve_playground import CHROMEDRIVER, CHROMIUM, drive

    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver packages")
    betas = {name: 0 for name in server.engine.reward_names()}
    betas["toxicity"] = -40
    result = drive(server.url, prompt="The comment section under the video was full of", betas=betas, max_tokens=40,
                   screenshot=os.environ["STEERKIT_SCREENSHOT"], timeout=300)
    assert result["unsteered"]["tokens"] >= 1 and result["steered"]["tokens"] >= 1

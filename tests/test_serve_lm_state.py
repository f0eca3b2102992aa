"""`steerkit serve` with a reward that reads the LM's own hidden state (``token_head.lm_state``): a real server,
the real `openai` client, concurrent requests joining and leaving the running batch; each completion is what
``steerkit.generate`` makes alone, and its traced rewards are the same."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

from serve_support import ServerThread, tiny_engine, tiny_parts  # noqa: E402

from steerkit import RewardAugmentedGenerator, SteeringTerm  # noqa: E402
from steerkit.rewards.token.session import TokenReward  # noqa: E402
from steerkit.serving.app import ServerSettings, create_app  # noqa: E402
from steerkit.testing import tiny_token_reward  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PROMPTS = ["This is", "I hate it when the", "You are a wonderful friend and"]


@pytest.fixture(scope="module")
def served():
    tokenizer, lm, rm = tiny_parts()
    reward = TokenReward(tiny_token_reward(tokenizer, seed=0, rank=4, lm_state=True, name="lmtox"))  # lm's own state
    engine = tiny_engine((tokenizer, lm, rm), rewards={"lmtox": reward}, max_running=8, max_queue=32)
    app = create_app(engine, settings=ServerSettings(timeout_s=30, max_n=4))
    with ServerThread(app) as running:
        running.engine, running.parts, running.reward = engine, (tokenizer, lm), reward
        yield running


def test_concurrent_requests_get_what_generate_makes_alone(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    tokenizer, lm = served.parts

    def complete(i):
        return client.completions.create(model=served.engine.model_name, prompt=PROMPTS[i % 3], temperature=0,
                                         max_tokens=6 + i, extra_body={"rewards": {"lmtox": -40.0}, "k": 8,
                                                                       "reward_trace": True})

    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(complete, range(6)))
    for i, out in enumerate(outs):
        alone = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(served.reward, -40.0)], k=8).generate(
            [PROMPTS[i % 3]], max_new_tokens=6 + i, do_sample=False, return_traces=True)
        assert out.choices[0].text == alone.texts[0], i
        traced = [t["rewards"]["lmtox"] for t in out.choices[0].model_extra["reward_trace"]]
        chosen = [float(tr.rewards["lmtox"][0, int(tr.chosen[0])]) for tr in alone.traces[0]]
        assert traced == pytest.approx(chosen, abs=1e-5), i
    plain = client.completions.create(model=served.engine.model_name, prompt=PROMPTS[1], temperature=0,
                                      max_tokens=7, extra_body={"k": 8})
    assert plain.choices[0].text != outs[1].choices[0].text  # the reward steered

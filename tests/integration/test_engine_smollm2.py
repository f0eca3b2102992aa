"""The serving engine on the real SmolLM2-135M-Instruct with the shipped rewards (Engine.from_config)."""

import pytest

from conftest import requires_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2, pytest.mark.slow]


@pytest.mark.filterwarnings("ignore:reward .* is installed but could not be loaded")
def test_from_config_serves_every_installed_reward_and_matches_generate():
    import steerkit
    from steerkit.config import SteeringConfig
    from steerkit.registry import list_rewards
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    engine = Engine.from_config(SteeringConfig.from_dict({"rewards": [{"name": "toxicity", "beta": -5}], "k": 10}),
                                max_running=4)
    installed = {r.name for r in list_rewards()}
    assert {"toxicity", "sentiment"} <= set(engine.reward_names()) <= installed  # an unloadable one is skipped
    engine.start()
    try:
        specs = [RowSpec("Write one sentence about cats.", 8, seed=1),  # the config's default steering
                 RowSpec("Say hello.", 6, seed=2, temperature=0, rewards={"toxicity": 3.0, "sentiment": 4.0}, k=5)]
        results = [h.result(timeout=600) for h in engine.submit_all(specs)]
    finally:
        engine.shutdown(0)
    lm, tokenizer = engine.lm, engine.tokenizer
    want = [steerkit.generate([specs[0].prompt], lm=(lm, tokenizer), rewards={"toxicity": -5}, k=10,
                              max_new_tokens=8, seed=1),
            steerkit.generate([specs[1].prompt], lm=(lm, tokenizer), rewards={"toxicity": 3.0, "sentiment": 4.0},
                              k=5, max_new_tokens=6, seed=2, do_sample=False)]
    for res, out in zip(results, want):
        assert res.finish.finish_reason in ("length", "stop")
        assert res.token_ids == out.sequences[0, :out.num_new_tokens[0]].tolist()
        assert res.text == out.texts[0]

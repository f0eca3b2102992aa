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


@pytest.mark.filterwarnings("ignore:reward .* is installed but could not be loaded")
def test_seeded_rows_among_others_equal_generate_alone_on_smollm2():
    """The determinism contract of the one engine core on the real LM: seeded rows with different k, β, rewards
    and temperatures, decoded together (rows joining as others leave: max_running 3 for 6 rows), each equal to
    ``steerkit.generate`` run alone on that prompt, token for token."""
    import steerkit
    from steerkit.config import SteeringConfig
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    engine = Engine.from_config(SteeringConfig.from_dict({"k": 10}), max_running=3)
    rows = [("The weather today is", 9, 1.0, 5, {"toxicity": -5.0}, 101),
            ("My favourite food is", 6, 0.7, 20, {"sentiment": 8.0}, 102),
            ("Tell me about the sea.", 8, 0.0, 3, {"toxicity": 2.0, "sentiment": -3.0}, 103),
            ("The city at night", 7, 1.3, 12, {}, 104),
            ("A short story:", 10, 1.0, 8, {"sentiment": -6.0}, 105),
            ("Why is the sky blue?", 5, 0.9, 15, {"toxicity": -10.0, "sentiment": 2.0}, 106)]
    specs = [RowSpec(p, n, temperature=t, k=k, rewards=r, seed=s) for p, n, t, k, r, s in rows]
    engine.start()
    try:
        results = [h.result(timeout=600) for h in engine.submit_all(specs)]
    finally:
        engine.shutdown(0)
    for (prompt, n, t, k, rewards, seed), res in zip(rows, results):
        out = steerkit.generate([prompt], lm=(engine.lm, engine.tokenizer), rewards=rewards, k=k, max_new_tokens=n,
                                seed=seed, **({"do_sample": False} if t == 0 else {"temperature": t}))
        assert res.token_ids == out.sequences[0, :out.num_new_tokens[0]].tolist(), prompt

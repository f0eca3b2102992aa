"""benchmarks/probe_steering_shift.py: its per-step measures against hand-worked values, and its walk along a
continuation against a from-scratch forward of each prefix."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_step_measures_by_hand(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from probe_steering_shift import step_measures

    z = torch.tensor([0.0, 0.0], dtype=torch.float64)
    log_p_full = torch.tensor([0.4, 0.1], dtype=torch.float64).log()
    rho = torch.tensor([0.0, 1.0], dtype=torch.float64)
    m = step_measures(z, log_p_full, rho, math.log(3))  # RAD's step: softmax([0, -ln 3]) = [3/4, 1/4]
    assert m["std"] == pytest.approx(math.sqrt(0.5))
    assert m["kl"] == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert m["surprisal"] == pytest.approx(0.25 * math.log(0.25))  # mass moved to the likelier token: negative
    assert m["shift"].tolist() == pytest.approx([0.25, -0.25])
    still = step_measures(z, log_p_full, rho, 0.0)
    assert still["kl"] == pytest.approx(0.0, abs=1e-12) and still["surprisal"] == pytest.approx(0.0, abs=1e-12)


def test_walk_scores_the_lms_top_k_of_each_prefix(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from probe_steering_shift import walk

    tok = make_tokenizer()
    lm = tiny_lm(tok)
    rewards = {"a": RewardModelScorer(tiny_reward(tok, seed=1)), "b": RewardModelScorer(tiny_reward(tok, seed=2))}
    prompt, continuation = "the movie was", " not at all what I expected"
    steps = walk(lm, tok, rewards, prompt, continuation, k=5, betas=[0.0, 10.0], max_tokens=4)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(continuation, add_special_tokens=False)["input_ids"][:4]
    assert len(steps) == len(c_ids) == 4
    for t, step in enumerate(steps):
        with torch.no_grad():
            logits = lm(torch.tensor([p_ids + c_ids[:t]])).logits[0, -1]
        assert step["candidates"] == logits.topk(5).indices.tolist()
        for name, reward in rewards.items():
            session = reward.start([prompt], tok)
            for v in c_ids[:t]:
                session.commit(torch.tensor([v]))
            rho = session.score(torch.tensor([step["candidates"]]))[0].double()
            assert step[name][10.0]["std"] == pytest.approx(float(rho.std()), abs=1e-6)
            assert step[name][0.0]["kl"] == pytest.approx(0.0, abs=1e-12)
        assert step["a"][10.0]["kl"] != pytest.approx(step["b"][10.0]["kl"])  # two rewards, two measures


def test_own_paths_pairs_the_two_results_by_prompt(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from probe_steering_shift import MEASURES, own_paths

    keys = [["set", i] for i in range(6)]
    on_a = {"prompt_keys": keys, "per_prompt": {f"{m}/20/{r}": [float(i) for i in range(6)]
                                               for m in MEASURES for r in "ab"}}
    # B's result lists the prompts in reverse; B on prompt i is A on prompt i plus 1
    on_b = {"prompt_keys": keys[::-1], "per_prompt": {f"{m}/20/{r}": [float(i) + 1 for i in reversed(range(6))]
                                                     for m in MEASURES for r in "ab"}}
    rows = own_paths(on_a, on_b, resamples=50)
    assert [(r["measure"], r["beta"]) for r in rows] == [(m, 20.0) for m in MEASURES]
    for r in rows:
        assert r["b_minus_a"] == pytest.approx(1.0) and r["ci95"] == pytest.approx([1.0, 1.0])
        assert r["a"] == pytest.approx(2.5) and r["b"] == pytest.approx(3.5)
    with pytest.raises(SystemExit, match="not of the same prompts"):
        own_paths(on_a, dict(on_b, prompt_keys=[["set", i] for i in range(1, 7)]), resamples=10)

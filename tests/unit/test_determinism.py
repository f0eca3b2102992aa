"""The determinism contract of the one engine core (issue 22): a given seed draws the tokens it drew before.

``golden_tokens.json`` holds what the code before the engine core (commit a6353d3: two decode loops, the
server's per-row sampling) drew for these cases: ``generate`` with shared and different settings (schedules,
transforms, greedy, stop strings, batches), the transformers ``LogitsProcessor``, and seeded rows served by the
engine together. The engine core must draw the same, token for token.
"""

import json
from pathlib import Path

import pytest
import torch

from steerkit import RewardAugmentedGenerator, RewardAugmentedLogitsProcessor, SteeringTerm
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.serving.engine import Engine
from steerkit.serving.requests import RowSpec
from steerkit.steering import BetaSchedule, make_transform
from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward

GOLDEN = json.loads((Path(__file__).parent / "golden_tokens.json").read_text())


def models():
    tok = make_tokenizer()
    torch.manual_seed(0)
    lm = tiny_lm(tok)
    r1 = RewardModelScorer(tiny_reward(tok), name="tiny")
    torch.manual_seed(1)
    r2 = RewardModelScorer(tiny_reward(tok), name="other")
    return tok, lm, r1, r2

PROMPTS = ["The movie was", "You are a", "hi"]

def generate_cases(r1, r2):
    return [
        ([SteeringTerm(r1, 5.0)], 5, dict(seed=3, max_new_tokens=12, num_return_sequences=3)),
        ([SteeringTerm(r1, -5.0), SteeringTerm(r2, BetaSchedule(4.0, "linear", start=0.0, steps=4),
                                               make_transform("invert"), "o")], 7,
         dict(seed=4, max_new_tokens=10, temperature=0.7)),
        ([SteeringTerm(r1, 2.0)], 3, dict(do_sample=False, max_new_tokens=8)),
        ([], 50, dict(seed=5, max_new_tokens=15, stop_strings=["e"], num_return_sequences=2)),
        ([SteeringTerm(r1, 1.0)], 10, dict(seed=6, max_new_tokens=9, batch_size=2, num_return_sequences=3)),
    ]

def engine_specs():
    return [RowSpec("The movie was", 8, temperature=1.0, k=5, rewards={"tiny": 3.0}, seed=11),
            RowSpec("You are a", 10, temperature=0.7, k=9, rewards=[{"name": "tiny", "beta": -4, "transform": "invert"}], seed=12),
            RowSpec("hi", 6, temperature=0.0, k=3, rewards={"tiny": 1.0, "other": -2.0}),
            RowSpec("The movie was", 7, temperature=1.3, k=20, rewards={}, seed=13)]

def run_cases():
    tok, lm, r1, r2 = models()
    out = {"generate": [], "processor": [], "engine": []}
    for terms, k, kw in generate_cases(r1, r2):
        o = RewardAugmentedGenerator(lm, tok, terms, k=k).generate(PROMPTS, **kw)
        out["generate"].append({"sequences": o.sequences.tolist(), "texts": o.texts})
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    for k, beta in ((4, -5.0), (6, 3.0)):
        rad = RewardAugmentedLogitsProcessor(tok, [SteeringTerm(r1, beta)], k=k)
        torch.manual_seed(21)
        ids = lm.generate(**enc, logits_processor=[rad], do_sample=True, top_k=0, max_new_tokens=6,
                          pad_token_id=tok.pad_token_id)
        out["processor"].append(ids.tolist())
    eng = Engine(lm, tok, {"tiny": r1, "other": r2}, default_k=5, max_running=3)
    eng.start()
    try:
        handles = eng.submit_all(engine_specs())
        out["engine"] = [h.result(timeout=120).token_ids for h in handles]
    finally:
        eng.shutdown(0)
    return out



@pytest.fixture(scope="module")
def drawn():
    return run_cases()


@pytest.mark.parametrize("part", ["generate", "processor", "engine"])
def test_a_given_seed_draws_the_tokens_it_drew_before(drawn, part):
    assert drawn[part] == GOLDEN[part]


def test_the_logits_processor_draws_what_generate_draws():
    tok, lm, r1, _ = models()
    enc = tok(["The movie was"], return_tensors="pt")
    rad = RewardAugmentedLogitsProcessor(tok, [SteeringTerm(r1, -3.0)], k=6)
    torch.manual_seed(5)
    ids = lm.generate(**enc, logits_processor=[rad], do_sample=True, top_k=0, max_new_tokens=8,
                      pad_token_id=tok.pad_token_id)
    out = RewardAugmentedGenerator(lm, tok, [SteeringTerm(r1, -3.0)], k=6).generate(
        ["The movie was"], max_new_tokens=8, seed=5)
    n = out.num_new_tokens[0]
    assert ids[0, enc["input_ids"].shape[1]:][:n].tolist() == out.sequences[0, :n].tolist()

"""The ``llama.cpp`` reward backends on the shipped reward models (issue 25): ``toxicity`` (6 SmolLM2 layers, merged
LoRA, linear head) and ``toxicity-token`` (4 layers, token head), exported to GGUF on first use.

Measured here (2 cores, 1 thread): F32 rewards within 6.6e-7 of torch over k = 20 steps (3e-8 / 1.2e-7 from
scratch); Q8_0 within 1.1e-2 (toxicity) and 1.4e-2 (toxicity-token) over steps, 1.7e-3 from scratch.
Asserted at 1e-5 (F32) and 0.05 (Q8_0). Skips, with the install command, where llama-cpp-python is absent."""

from __future__ import annotations

import pytest
import torch

import steerkit
from conftest import NO_LLAMA_CPP, requires_smollm2
from steerkit import load_tokenizer
from steerkit.rewards.loading import load_reward

llama_cpp = pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)

pytestmark = [pytest.mark.integration, requires_smollm2, pytest.mark.slow, pytest.mark.timeout(900)]

LM = "smollm2-135m-instruct"
TEXTS = ["You are such a stupid idiot and", "The weather today is lovely", "I will", "Thanks for the help!"]
TOLERANCE = {"llama.cpp": 1e-5, "llama.cpp-q8": 0.05}


@pytest.mark.parametrize("name", ["toxicity", "toxicity-token"])
@pytest.mark.parametrize("backend", ["llama.cpp", "llama.cpp-q8"])
def test_shipped_rewards_match_torch_from_scratch_and_over_steps(name, backend):
    lm_tok = load_tokenizer(LM)
    ref, mine = load_reward(name, backend="torch"), load_reward(name, backend=backend)
    scratch = torch.tensor(mine.model.score_texts(TEXTS)) - torch.tensor(ref.model.score_texts(TEXTS))
    assert scratch.abs().max() < TOLERANCE[backend]
    a, b = ref.start(TEXTS[:2], lm_tok), mine.start(TEXTS[:2], lm_tok)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(12):
        cand = torch.randint(200, 40000, (2, 20), generator=g)
        ra, rb = a.score(cand), b.score(cand)
        worst = max(worst, float((ra - rb).abs().max()))
        chosen = cand.gather(1, ra.argmax(-1, keepdim=True)).squeeze(1)
        a.commit(chosen)
        b.commit(chosen)
    assert worst < TOLERANCE[backend]


def test_greedy_steering_gives_the_torch_backends_tokens():
    prompts = ["You are such a", "I think that people who"]
    kw = dict(lm=LM, engine="llama.cpp", k=20, do_sample=False, max_new_tokens=16)
    for name in ("toxicity", "toxicity-token"):
        torch_out = steerkit.generate(prompts, rewards={name: -20}, backend="torch", **kw)
        mine = steerkit.generate(prompts, rewards={name: -20}, backend="llama.cpp", **kw)
        assert mine.texts == torch_out.texts, name

"""RAD inside llama.cpp (issue 25, item 1), its adapter contract without llama.cpp: llama-cpp-python calls a
``logits_processor`` with the ids so far (``numpy.intc`` [T]) and the next token's logits (``numpy.float32``
[V]) and uses what it returns. Here a plain greedy loop over a tiny LM plays llama.cpp's part: the tokens the
adapter steers it to are those ``steerkit.generate(..., do_sample=False)`` draws, for a sequence reward, call
after call with one instance (state keyed by the prefix). tests/integration/test_llama_cpp.py runs the real
llama.cpp where it is installed."""

import numpy as np
import pytest
import torch

import steerkit
from steerkit.errors import InvalidArgumentError
from steerkit.integrations.llama_cpp import LlamaCppRAD
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm


def llama_like_greedy(lm, tokenizer, prompt: str, processor, max_tokens: int) -> list[int]:
    """What llama-cpp-python's loop does with a logits processor and temperature 0, over a transformers LM."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out = []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = lm(torch.tensor([ids])).logits[0, -1].float().numpy()
        scores = processor(np.asarray(ids, dtype=np.intc), logits)
        assert scores.dtype == np.float32 and scores.shape == logits.shape
        token = int(np.argmax(scores))
        ids.append(token)
        out.append(token)
    return out


@pytest.mark.parametrize("beta", [-8.0, 8.0])
def test_greedy_through_the_adapter_draws_what_generate_draws(lm, tokenizer, reward_model, beta):
    terms = [SteeringTerm(RewardModelScorer(reward_model), beta, name="tiny")]
    rad = LlamaCppRAD(tokenizer, terms, k=6)
    for prompt in ("The quick", "Numbers 0123 and"):  # one instance, reused: a new prefix restarts its sessions
        got = llama_like_greedy(lm, tokenizer, prompt, rad, 8)
        want = steerkit.generate([prompt], lm=(lm, tokenizer), rewards=terms, k=6, max_new_tokens=8,
                                 do_sample=False, eos_token_id=[]).sequences[0].tolist()
        assert got == want
    plain = llama_like_greedy(lm, tokenizer, "The quick", lambda ids, s: s, 8)
    steered = llama_like_greedy(lm, tokenizer, "The quick", rad, 8)
    assert rad.last_step.rewards["tiny"].shape == (1, 6)
    assert plain != steered  # the rewards move the tokens (β = ±8 on this tiny model)


def test_every_token_outside_the_top_k_is_excluded(lm, tokenizer, reward_model):
    rad = LlamaCppRAD(tokenizer, [SteeringTerm(RewardModelScorer(reward_model), 3.0)], k=5)
    logits = np.random.default_rng(0).normal(size=len(tokenizer)).astype(np.float32)
    scores = rad(np.asarray(tokenizer("Hi there", add_special_tokens=False)["input_ids"], dtype=np.intc), logits)
    finite = np.flatnonzero(np.isfinite(scores))
    assert sorted(finite) == sorted(np.argsort(logits)[-5:])
    assert scores[finite].max() == 0.0  # each row's max subtracted, as the transformers processor does


def test_a_tokenizer_of_another_vocabulary_is_refused(tokenizer, reward_model):
    rad = LlamaCppRAD(tokenizer, [SteeringTerm(RewardModelScorer(reward_model), 3.0)], k=5)
    with pytest.raises(InvalidArgumentError, match="GGUF model's own tokenizer"):
        rad(np.asarray([1, 2, 3], dtype=np.intc), np.zeros(len(tokenizer) + 7, dtype=np.float32))

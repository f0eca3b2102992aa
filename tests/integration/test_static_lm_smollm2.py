"""The compiled static-shape step and the int8 LM on the real SmolLM2-135M-Instruct (issue 25, item 3): compiled
decoding gives the eager engine's tokens at float32 for the same seed, steered and plain, at batch 1 and 3; int8
weights stay close to float32 (the figures docs/performance.md reports)."""

import pytest
import torch

import steerkit
from conftest import requires_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]

PROMPTS = ["The weather today is", "My neighbour told me that", "Here is a short story about a dragon:"]
TEXTS = ["The quick brown fox jumps over the lazy dog while the farmer watches from the porch and drinks his coffee.",
         "In 1969, astronauts landed on the Moon for the first time, and millions of people watched on television.",
         "My favourite recipe for a rainy afternoon is a simple tomato soup with fresh basil and a slice of bread."]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_compiled_decoding_gives_the_eager_tokens_greedy_and_sampled(batch_size):
    kw = dict(rewards={"toxicity-token": -20.0}, k=20, max_new_tokens=32, eos_token_id=[], batch_size=batch_size)
    for sampling in ({"do_sample": False}, {"do_sample": True, "seed": 7}):
        eager = steerkit.generate(PROMPTS, **kw, **sampling)
        compiled = steerkit.generate(PROMPTS, compile=True, **kw, **sampling)
        assert torch.equal(eager.sequences, compiled.sequences), sampling
        assert eager.texts == compiled.texts
    plain = steerkit.generate(PROMPTS[:1], max_new_tokens=32, do_sample=False, eos_token_id=[])
    assert torch.equal(plain.sequences, steerkit.generate(PROMPTS[:1], max_new_tokens=32, do_sample=False,
                                                          eos_token_id=[], compile=True).sequences)


def test_int8_weights_stay_close_to_float32():
    """Over every position of three ordinary sentences: the int8 LM's most likely next token is float32's at 94% of
    positions (63 of 67 measured) and the mean KL divergence per position is 0.005-0.011 nats."""
    from steerkit.assembly import load_lm
    from steerkit.engine.lm_int8 import as_int8

    model, tokenizer = load_lm("smollm2-135m-instruct")
    quantized = as_int8(model)
    agree = total = 0
    with torch.no_grad():
        for text in TEXTS:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            a, b = model(ids).logits[0].float(), quantized(ids).logits[0].float()
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
            p = torch.log_softmax(a, -1)
            kl = (p.exp() * (p - torch.log_softmax(b, -1))).sum(-1).mean().item()
            assert kl < 0.03, (text, kl)
    assert agree / total >= 0.9, (agree, total)

"""RAD decoding semantics: β=0 is plain top-k sampling, huge β picks the best candidate, HF parity."""

import pytest
import torch

import steerkit
from steerkit.decoding import RewardAugmentedGenerator
from steerkit.hf import RewardAugmentedLogitsProcessor
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm

PROMPTS = ["The quick", "You are a wonderful friend and I"]


def hf_generate(lm, tokenizer, prompts, seed, **kw):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    out = lm.generate(**enc, pad_token_id=tokenizer.pad_token_id, **kw)
    return out[:, enc["input_ids"].shape[1]:]


def test_beta_zero_reproduces_plain_top_k_sampling(lm, tokenizer, reward_model):
    k = 7
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(RewardModelScorer(reward_model), 0.0)], k=k)
    ours = gen.generate(PROMPTS, max_new_tokens=15, seed=123, num_return_sequences=2, eos_token_id=[])
    plain = hf_generate(lm, tokenizer, PROMPTS, 123, do_sample=True, top_k=k, top_p=1.0, max_new_tokens=15,
                        num_return_sequences=2, min_new_tokens=15)
    assert torch.equal(ours.sequences, plain)


def test_seed_makes_runs_reproducible_and_different_seeds_differ(lm, tokenizer, reward_model):
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(RewardModelScorer(reward_model), 5.0)], k=20)
    a = gen.generate(PROMPTS, max_new_tokens=12, seed=7)
    b = gen.generate(PROMPTS, max_new_tokens=12, seed=7)
    c = gen.generate(PROMPTS, max_new_tokens=12, seed=8)
    assert torch.equal(a.sequences, b.sequences) and a.texts == b.texts
    assert not torch.equal(a.sequences, c.sequences)


def test_huge_beta_greedy_picks_max_reward_candidate(lm, tokenizer, reward_model):
    scorer = RewardModelScorer(reward_model)
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1e6)], k=10)
    out = gen.generate(PROMPTS, max_new_tokens=10, do_sample=False, return_traces=True, eos_token_id=[])
    for t in out.traces[0]:
        best = t.rewards[scorer.name].argmax(-1)
        assert torch.equal(t.chosen, best)
    # and without steering, greedy picks the LM's argmax (index 0 of the top-k)
    plain = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 0.0)], k=10)
    for t in plain.generate(PROMPTS, max_new_tokens=5, do_sample=False, return_traces=True, eos_token_id=[]).traces[0]:
        assert (t.chosen == 0).all()


def test_negative_beta_steers_away(lm, tokenizer, reward_model):
    scorer = RewardModelScorer(reward_model)
    out = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, -1e6)], k=10).generate(
        PROMPTS, max_new_tokens=6, do_sample=False, return_traces=True, eos_token_id=[])
    for t in out.traces[0]:
        assert torch.equal(t.chosen, t.rewards[scorer.name].argmin(-1))


@pytest.mark.parametrize("do_sample", [True, False])
def test_logits_processor_matches_generate_and_is_reusable(lm, tokenizer, reward_model, do_sample):
    k, beta = 8, 4.0
    scorer = RewardModelScorer(reward_model)
    ours = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, beta)], k=k).generate(
        PROMPTS, max_new_tokens=12, seed=5, do_sample=do_sample, temperature=0.8, eos_token_id=[])
    processor = RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(scorer, beta)], k=k)
    kw = dict(logits_processor=[processor], do_sample=do_sample, top_k=0, top_p=1.0, max_new_tokens=12,
              min_new_tokens=12)
    if do_sample:
        kw["temperature"] = 0.8
    first = hf_generate(lm, tokenizer, PROMPTS, 5, **kw)
    second = hf_generate(lm, tokenizer, PROMPTS, 5, **kw)  # same processor object, second call
    assert torch.equal(ours.sequences, first)
    assert torch.equal(first, second)
    # a different batch in between does not confuse it either
    hf_generate(lm, tokenizer, ["Numbers"], 9, **kw)
    assert torch.equal(hf_generate(lm, tokenizer, PROMPTS, 5, **kw), first)


def test_eos_and_stop_strings_end_rows(lm, tokenizer, reward_model):
    gen = RewardAugmentedGenerator(lm, tokenizer, [], k=5)
    free = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[])
    first_token = free.sequences[0, 2].item()
    stopped = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[first_token])
    assert stopped.num_new_tokens[0] <= 3
    piece = free.texts[1][:3]
    if piece.strip():
        with_stop = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[], stop_strings=[piece])
        assert with_stop.texts[1].endswith(piece) and len(with_stop.texts[1]) <= len(free.texts[1])


def test_num_return_sequences_and_batching_agree(lm, tokenizer, reward_model):
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(RewardModelScorer(reward_model), 2.0)], k=5)
    out = gen.generate(PROMPTS, max_new_tokens=6, num_return_sequences=3, do_sample=False, eos_token_id=[])
    assert len(out.texts) == 6 and out.prompts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    chunked = gen.generate(PROMPTS, max_new_tokens=6, num_return_sequences=3, do_sample=False, eos_token_id=[],
                           batch_size=2)
    assert chunked.texts == out.texts


def test_chat_template_requires_one(lm, tokenizer):
    with pytest.raises(steerkit.InvalidArgumentError, match="chat template"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], chat_template=True)

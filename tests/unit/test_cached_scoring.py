"""Shared-prefix cached scoring equals scoring every prefix + candidate from scratch."""

import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.torch_cache import TorchScoringCache
from steerkit.steering import SteeringTerm

PROMPTS = ["The quick", "You are a wonderful friend and I", "Numbers 0123"]


def reference_reward(rm, tokenizer, prompt: str, generated: list[int], candidate: int) -> float:
    ids = [rm.config.start_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"] + generated + [candidate]
    with torch.no_grad():
        return rm(torch.tensor([ids])).rewards[0, -1].item()


def test_cached_rewards_match_full_rescoring_over_steps(lm, tokenizer, reward_model):
    scorer = RewardModelScorer(reward_model, context="full")  # prompts of uneven length: left padding in the RM
    k, steps = 6, 12
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 3.0)], k=k)
    out = gen.generate(PROMPTS, max_new_tokens=steps, seed=1, return_traces=True, eos_token_id=[])
    trace = out.traces[0]
    assert len(trace) == steps
    worst = 0.0
    for step, t in enumerate(trace):
        for b, prompt in enumerate(PROMPTS):
            generated = out.sequences[b, :step].tolist()
            for j in range(k):
                ref = reference_reward(reward_model, tokenizer, prompt, generated, t.topk_ids[b, j].item())
                worst = max(worst, abs(ref - t.rewards[scorer.name][b, j].item()))
    assert worst <= 1e-4, worst


def test_continuation_context_scores_only_generated_text(lm, tokenizer, reward_model):
    scorer = RewardModelScorer(reward_model)  # default: continuation only
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1.0)], k=4)
    out = gen.generate(PROMPTS[:2], max_new_tokens=10, seed=2, return_traces=True, eos_token_id=[])
    for step, t in enumerate(out.traces[0]):
        for b in range(2):
            ids = [reward_model.config.start_token_id] + out.sequences[b, :step].tolist() + [t.topk_ids[b, 0].item()]
            with torch.no_grad():
                ref = reward_model(torch.tensor([ids])).rewards[0, -1].item()
            assert abs(ref - t.rewards[scorer.name][b, 0].item()) <= 1e-4


def test_cache_keeps_only_the_chosen_candidate(reward_model):
    """Memory is O(B·L): after each commit the cache grows by one entry, not by k."""
    B, k = 3, 8
    enc = reward_model.encode(["a", "bb cc", "the quick brown"])
    cache = TorchScoringCache(reward_model, enc["input_ids"], enc["attention_mask"])
    L = cache.length
    for step in range(5):
        cands = torch.randint(3, 200, (B, k))
        cache.score_blocks(cands[..., None], None)
        assert cache.cache.layers[0].keys.shape[2] == L + step + k  # k candidates scored in one forward
        cache.commit_choice(torch.randint(0, k, (B,)))
        assert cache.cache.layers[0].keys.shape[:3] == (B, reward_model.backbone.config.num_key_value_heads, L + step + 1)


def test_rollback_and_append_match_rescoring(reward_model, tokenizer):
    enc = reward_model.encode(["hello there", "x"])
    cache = TorchScoringCache(reward_model, enc["input_ids"], enc["attention_mask"])
    rows = [enc["input_ids"][b][enc["attention_mask"][b].bool()].tolist() for b in range(2)]
    cache.append(torch.tensor([[10, 11], [12, 13]]), None)
    rows = [r + extra for r, extra in zip(rows, [[10, 11], [12, 13]])]
    cache.rollback(torch.tensor([1, 2]))
    rows = [rows[0][:-1], rows[1][:-2]]
    blocks = torch.tensor([[[20, 21], [22, 0]], [[23, 24], [25, 26]]])
    bmask = torch.tensor([[[1, 1], [1, 0]], [[1, 1], [1, 1]]], dtype=torch.bool)
    got = cache.score_blocks(blocks, bmask)
    for b in range(2):
        for j in range(2):
            block = blocks[b, j][bmask[b, j]].tolist()
            with torch.no_grad():
                ref = reward_model(torch.tensor([rows[b] + block])).rewards[0, -1].item()
            assert abs(ref - got[b, j].item()) <= 1e-4

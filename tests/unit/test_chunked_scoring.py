"""A sequence reward scores k candidates at most ``SharedPrefixCache.max_blocks`` per forward (issue 24): the one
forward's attention mask is [B, 1, k·m, T + k·m], quadratic in k, so chunks bound a step's memory for any k. The
rewards, the cache after a commit, and the tokens ``steerkit.generate`` draws are those of a single forward."""

import pytest
import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.errors import SteerkitWarning
from steerkit.rewards.cache import SharedPrefixCache
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.torch_cache import TorchScoringCache
from steerkit.steering import SteeringTerm


def caches(reward_model, texts):
    enc = reward_model.encode(texts)
    return [TorchScoringCache(reward_model, enc["input_ids"], enc["attention_mask"]) for _ in range(2)]


def test_chunked_scores_and_commits_equal_one_forward(reward_model):
    whole, chunked = caches(reward_model, ["a", "bb cc", "the quick brown"])
    chunked.max_blocks = 5  # 37 candidates: chunks of 5, 5, …, 2
    torch.manual_seed(0)
    for step in range(4):
        m = 1 + step % 2  # blocks of one and of two tokens (a bridged reward's candidates), right-padded
        blocks = torch.randint(3, 200, (3, 37, m))
        mask = torch.ones_like(blocks, dtype=torch.bool)
        if m == 2:
            mask[:, ::3, 1] = False
        a, b = whole.score_blocks(blocks, mask), chunked.score_blocks(blocks, mask)
        assert a.shape == b.shape == (3, 37)
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
        choice = torch.tensor([0, 36, 17 + step])
        whole.commit_choice(choice)
        chunked.commit_choice(choice)
        assert torch.equal(whole.mask, chunked.mask) and torch.equal(whole.next_pos, chunked.next_pos)
        for x, y in zip(whole.cache.layers, chunked.cache.layers):
            real = whole.mask[:, None, :, None]
            assert torch.allclose(x.keys * real, y.keys * real, atol=1e-5)


def test_each_forward_holds_at_most_max_blocks_candidates(reward_model, monkeypatch):
    (cache, _) = caches(reward_model, ["one", "two three"])
    cache.max_blocks = 8
    widths = []
    original = cache._forward

    def spy(ids, position_ids, allowed):
        widths.append(allowed.shape[-2])  # query positions in this forward: blocks × m
        return original(ids, position_ids, allowed)

    monkeypatch.setattr(cache, "_forward", spy)
    cache.score_blocks(torch.randint(3, 200, (2, 50, 1)), None)
    assert widths == [8, 8, 8, 8, 8, 8, 2]
    cache.commit_choice(torch.tensor([3, 49]))  # the chosen block runs again: one forward of m tokens
    assert widths[-1] == 1


def test_generate_at_k_the_vocabulary_draws_the_same_tokens_in_chunks(lm, tokenizer, reward_model, monkeypatch):
    vocab = lm.config.vocab_size
    term = [SteeringTerm(RewardModelScorer(reward_model), -8.0)]

    def run(max_blocks):
        monkeypatch.setattr(SharedPrefixCache, "max_blocks", max_blocks)
        with pytest.warns(SteerkitWarning, match="slow"):  # as before: a large k with a sequence reward warns
            gen = RewardAugmentedGenerator(lm, tokenizer, term, k=vocab)
        return gen.generate(["The quick", "Numbers 0123"], max_new_tokens=6, do_sample=False, eos_token_id=[])

    assert torch.equal(run(vocab).sequences, run(64).sequences)

"""A prompt that several rows share (``num_return_sequences``, a request's ``n``) runs through the LM once: its rows
start from copies of its cache. Each row still gets the cache and logits of a forward of every row."""

from __future__ import annotations

import contextlib

import pytest
import torch

import steerkit
from steerkit.engine import lm_cache
from steerkit.engine.lm_cache import LMBatch
from steerkit.engine.rows import distinct_prompts
from steerkit.steering import SteeringTerm
from steerkit.rewards.sequence.scorer import RewardModelScorer

A, B, C = [5, 6, 7, 8, 9], [10, 11], [12, 13, 14]
ROWS = [A, B, A, C, B, A]  # interleaved, of different lengths: a wrong copy would give a row another prompt's state


def test_distinct_prompts_names_the_first_row_of_each_prompt_and_maps_every_row_to_it():
    assert distinct_prompts(ROWS) == ([0, 1, 3], [0, 1, 0, 2, 1, 0])
    assert distinct_prompts([A, B]) == ([0, 1], [0, 1])
    assert distinct_prompts([]) == ([], [])


@contextlib.contextmanager
def forwarded_rows(model):
    """The batch size of every forward of ``model`` in the block."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def every_row(monkeypatch):
    """Make every row run its own copy of its prompt, as before prompts were shared."""
    monkeypatch.setattr(lm_cache, "distinct_prompts", lambda rows_ids: (list(range(len(rows_ids))),
                                                                        list(range(len(rows_ids)))))


def test_prefill_padded_runs_each_prompt_once_and_each_row_gets_every_rows_forward(lm, tokenizer, monkeypatch):
    shared = LMBatch(lm)
    with forwarded_rows(lm) as seen:
        shared.prefill_padded(ROWS, tokenizer)
    assert seen == [3]
    every_row(monkeypatch)
    full = LMBatch(lm)
    with forwarded_rows(lm) as seen:
        full.prefill_padded(ROWS, tokenizer)
    assert seen == [6]
    assert torch.equal(shared.mask, full.mask) and torch.equal(shared.pos, full.pos)
    torch.testing.assert_close(shared.logits, full.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared.hidden, full.hidden, rtol=1e-5, atol=1e-5)
    for a, b in zip(shared.cache.layers, full.cache.layers):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
    for row, first in ((2, 0), (5, 0), (4, 1)):  # copies: bitwise their prompt's first row
        assert torch.equal(shared.logits[row], shared.logits[first])
        assert all(torch.equal(layer.keys[row], layer.keys[first]) for layer in shared.cache.layers)
    shared.advance(torch.tensor([1, 2, 3, 4, 5, 6]))  # the copies are rows of their own: they diverge
    assert not torch.equal(shared.logits[2], shared.logits[0])


def test_prefill_many_runs_each_prompt_once_and_rows_equal_their_own_prefill(lm, tokenizer):
    batch = LMBatch(lm)
    with forwarded_rows(lm) as seen:
        got = batch.prefill_many(ROWS)
    assert sum(seen) == 3
    assert got[0] is got[2] is got[5] and got[1] is got[4]
    for ids, row in zip(ROWS, got):
        alone = batch.prefill(ids)
        assert row.length == len(ids)
        torch.testing.assert_close(row.logits, alone.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(row.cache.layers[-1].keys, alone.cache.layers[-1].keys, rtol=1e-5, atol=1e-5)
    batch.join(got)  # a Prefilled shared by rows joins as a row each
    assert batch.size == 6 and torch.equal(batch.logits[2], batch.logits[0])


@pytest.mark.parametrize("rows", [1, 2])
def test_generate_with_return_sequences_draws_what_a_forward_of_every_row_draws(lm, tokenizer, reward_model,
                                                                                 monkeypatch, rows):
    """Greedy and seeded, with a reward that scores the prompt too: the rows of a shared prompt draw the tokens that
    prefilling each row's copy gave (the tiny models have no near-ties here)."""
    terms = [SteeringTerm(RewardModelScorer(reward_model, context="full"), 3.0)]
    prompts = ["The movie was", "You are a wonderful friend and I"][:rows]

    def run():
        sampled = steerkit.generate(prompts, lm=(lm, tokenizer), rewards=terms, k=5, max_new_tokens=8, seed=4,
                                    num_return_sequences=3)
        greedy = steerkit.generate(prompts, lm=(lm, tokenizer), rewards=terms, k=5, max_new_tokens=8,
                                   do_sample=False, num_return_sequences=2)
        return sampled.sequences, greedy.sequences

    shared = run()
    every_row(monkeypatch)
    full = run()
    assert torch.equal(shared[0], full[0]) and torch.equal(shared[1], full[1])
    assert len({tuple(r) for r in shared[0].tolist()}) > 1  # the copies sampled apart

"""A prompt that several rows share (``num_return_sequences``, a request's ``n``) runs through the LM once: its rows
start from copies of its cache. Each row still gets the cache and logits of a forward of every row, and the server's
rows draw what they draw alone; the rows of a long prompt follow one chunked prefill."""

from __future__ import annotations

from collections import deque

import pytest
import torch

import steerkit
from steerkit.engine import lm_cache
from steerkit.engine.lm_cache import LMBatch
from steerkit.engine.rows import Row, distinct_prompts
from steerkit.serving.engine import Engine
from steerkit.serving.prefill import Prefills
from steerkit.serving.requests import RowSpec
from steerkit.steering import SteeringTerm
from steerkit.rewards.sequence.scorer import RewardModelScorer

from conftest import forward_shapes
from serve_support import queued_tokens

A, B, C = [5, 6, 7, 8, 9], [10, 11], [12, 13, 14]
ROWS = [A, B, A, C, B, A]  # interleaved, of different lengths: a wrong copy would give a row another prompt's state


def test_distinct_prompts_names_the_first_row_of_each_prompt_and_maps_every_row_to_it():
    assert distinct_prompts(ROWS) == ([0, 1, 3], [0, 1, 0, 2, 1, 0])
    assert distinct_prompts([A, B]) == ([0, 1], [0, 1])
    assert distinct_prompts([]) == ([], [])


def every_row(monkeypatch):
    """Make every row run its own copy of its prompt, as before prompts were shared."""
    monkeypatch.setattr(lm_cache, "distinct_prompts", lambda rows_ids: (list(range(len(rows_ids))),
                                                                        list(range(len(rows_ids)))))


def test_prefill_padded_runs_each_prompt_once_and_each_row_gets_every_rows_forward(lm, tokenizer, monkeypatch):
    shared = LMBatch(lm)
    with forward_shapes(lm) as seen:
        shared.prefill_padded(ROWS, tokenizer)
    assert [rows for rows, _ in seen] == [3]
    every_row(monkeypatch)
    full = LMBatch(lm)
    with forward_shapes(lm) as seen:
        full.prefill_padded(ROWS, tokenizer)
    assert [rows for rows, _ in seen] == [6]
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


def prefill_forwards(seen):
    """The batch sizes of the forwards that ran more than one token (prefills; a decode step runs one)."""
    return [shape[0] for shape in seen if shape[1] > 1]


def served(lm, tokenizer, reward, specs, **kw) -> list[list[int]]:
    return queued_tokens(Engine(lm, tokenizer, {"tiny": reward}, default_k=5, max_running=8, max_queue=16, **kw), specs)


def test_a_requests_n_rows_run_their_prompt_once_and_draw_what_each_draws_alone(lm, tokenizer, reward_model):
    reward = RewardModelScorer(reward_model, context="full")
    specs = [RowSpec("The movie was", 6, seed=s, rewards={"tiny": 2.0}) for s in (1, 2, 3)] + [RowSpec("You are", 6,
                                                                                                        seed=4)]
    with forward_shapes(lm) as seen:
        together = served(lm, tokenizer, reward, specs)
    assert sum(prefill_forwards(seen)) == 2  # two distinct prompts, whatever the rows
    assert together == [served(lm, tokenizer, reward, [spec])[0] for spec in specs]
    assert len({tuple(t) for t in together[:3]}) > 1  # the seeds differ


def test_rows_with_one_long_prompt_follow_one_chunked_prefill(lm, tokenizer, reward_model):
    """Prompts longer than a chunk run a chunk per pass: the rows of one such prompt run its chunks once between
    them, and each draws what it draws alone (its own job)."""
    reward = RewardModelScorer(reward_model, context="full")
    prompt = "the quick brown fox jumps over the lazy dog and then the dog"
    length = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert length > 8
    specs = [RowSpec(prompt, 5, seed=s, rewards={"tiny": 2.0}) for s in (1, 2, 3)]
    with forward_shapes(lm) as seen:
        together = served(lm, tokenizer, reward, specs, prefill_chunk=4)
    chunks = [min(4, length - start) for start in range(0, length, 4)]
    assert prefill_forwards(seen) == [1 for n in chunks if n > 1]  # one job's chunks, once (a 1-token one is unseen)
    assert together == [served(lm, tokenizer, reward, [spec], prefill_chunk=4)[0] for spec in specs]


def long_rows(tokenizer, prompts):
    return [Row(p, tokenizer(p, add_special_tokens=False)["input_ids"], [], 5, 1.0, 4) for p in prompts]


def test_a_follower_takes_the_job_over_when_its_row_goes(lm, tokenizer):
    prompt = "the quick brown fox jumps over the lazy dog and then the dog"
    rows = long_rows(tokenizer, [prompt] * 3 + ["a different prompt that is long enough to need chunks"])
    batch = LMBatch(lm)
    prefills = Prefills(batch, 4)
    queue = deque(rows)
    taken = prefills.take(queue, room=8)
    assert taken == rows[:3] and list(queue) == rows[3:]  # copies cost no budget; another long prompt waits
    ready, failed = prefills.run(taken)
    assert not ready and not failed and len(prefills) == 3 and prefills.rows() == rows[:3]
    assert list(prefills.jobs) == [rows[0]] and prefills.followers == {rows[0]: rows[1:3]}
    prefills.drop([rows[0]])
    assert rows[0] not in prefills and rows[1] in prefills and rows[2] in prefills and len(prefills) == 2
    assert list(prefills.jobs) == [rows[1]] and prefills.followers == {rows[1]: [rows[2]]}
    while not ready:
        ready, failed = prefills.run([])
    assert set(ready) == {rows[1], rows[2]} and not failed and len(prefills) == 0
    alone = batch.prefill(rows[1].prompt_ids)
    torch.testing.assert_close(ready[rows[2]].logits, alone.logits, rtol=1e-5, atol=1e-5)
    assert ready[rows[2]] is ready[rows[1]]  # a transformers LM's rows share the Prefilled (join copies it)


def test_a_failing_chunk_fails_every_row_of_its_prompt(lm, tokenizer, monkeypatch):
    rows = long_rows(tokenizer, ["the quick brown fox jumps over the lazy dog and then the dog"] * 2)
    prefills = Prefills(LMBatch(lm), 4)
    taken = prefills.take(deque(rows), room=8)
    prefills.run(taken)
    job = prefills.jobs[rows[0]]
    monkeypatch.setattr(job, "run_chunk", lambda: (_ for _ in ()).throw(RuntimeError("the LM broke")))
    ready, failed = prefills.run([])
    assert not ready and set(failed) == set(rows) and len(prefills) == 0


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

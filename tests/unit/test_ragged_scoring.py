"""Ragged scoring (``SharedPrefixCache.score_blocks(..., active)``): each row is scored only on the blocks it needs, in
groups of rows of like need, and gets the rewards and the cache that scoring every block gives."""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import require_backend
from steerkit.rewards.cache import row_groups
from steerkit.rewards.sequence.scorer import RewardModelScorer

PREFIXES = ["a", "the movie was", "x y", "you are such a", "b", "it"]


@pytest.fixture(scope="module")
def steerkit_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEERKIT_CACHE", str(tmp_path_factory.mktemp("steerkit_cache")))
        yield


def sessions(reward_model, tokenizer, backend: str):
    """Two sessions of the same reward over the same rows: one scored ragged, one on every block."""
    require_backend(backend)
    reward = RewardModelScorer(reward_model, backend=backend, context="full")
    return reward.start(PREFIXES, tokenizer), reward.start(PREFIXES, tokenizer)


def group_cost(groups, counts, forward_cost):
    return sum(len(g) * max(counts[b] for b in g) + forward_cost for g in groups)


def test_row_groups_cover_every_row_once_at_the_least_cost():
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        counts = torch.randint(1, 21, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen).tolist()
        groups = row_groups(counts, max_groups=3, forward_cost=4)
        assert sorted(b for g in groups for b in g) == list(range(len(counts)))
        # against every partition of the rows, in order of need, into at most 3 runs
        order = sorted(range(len(counts)), key=lambda b: counts[b])
        best = min(group_cost([order[i:j] for i, j in zip((0, *cuts), (*cuts, len(order)))], counts, 4)
                   for g in range(3) for cuts in itertools.combinations(range(1, len(order)), g))
        assert group_cost(groups, counts, 4) == best, (counts, groups)
    assert row_groups([5] * 16) == [list(range(16))]  # like needs: one forward
    assert row_groups([]) == []


@pytest.mark.parametrize("backend", ["torch", "onnx", "llama.cpp"])
def test_active_blocks_score_and_commit_as_when_every_block_is_scored(tokenizer, reward_model, backend,
                                                                       steerkit_cache):
    ragged, full = sessions(reward_model, tokenizer, backend)
    assert ragged.ragged
    B, k = len(PREFIXES), 9
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        candidates = torch.randint(3, len(tokenizer), (B, k), generator=gen)
        counts = torch.tensor([1, 9, 2, 3, 2, 5]).roll(step)
        # each row's active blocks anywhere among its k (not only first), at least one
        active = torch.rand((B, k), generator=gen).argsort(-1) < counts[:, None]
        want = full.score(candidates)
        got = ragged.score(candidates, active=active)
        assert torch.allclose(got[active], want[active], atol=1e-5), (got - want)[active].abs().max()
        assert (got[~active] == 0).all()
        chosen = torch.where(active, torch.rand((B, k), generator=gen), -1.0).argmax(-1)  # an active block a row
        ragged.commit_chosen(candidates.gather(1, chosen[:, None])[:, 0], chosen)
        full.commit_chosen(candidates.gather(1, chosen[:, None])[:, 0], chosen)
    if backend != "llama.cpp":  # its cache keeps each row's tokens in a llama.cpp sequence: no mask to compare
        assert ragged.cache.length == full.cache.length
        assert torch.equal(ragged.cache.mask, full.cache.mask)
    else:
        assert ragged.cache.next_pos == full.cache.next_pos
    last = torch.randint(3, len(tokenizer), (B, k), generator=gen)
    assert torch.allclose(ragged.score(last), full.score(last), atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_an_inactive_choice_commits_the_rows_first_active_block(tokenizer, reward_model, backend, steerkit_cache):
    """A finished row of a shared batch is fed padding, whatever it drew: its commit keeps a block it scored."""
    ragged, full = sessions(reward_model, tokenizer, backend)
    B, k = len(PREFIXES), 6
    candidates = torch.arange(10, 10 + B * k).reshape(B, k)
    active = torch.zeros((B, k), dtype=torch.bool)
    active[:, 2] = active[:, 4] = True
    ragged.score(candidates, active=active)
    ragged.commit_chosen(candidates[:, 0], torch.zeros(B, dtype=torch.long))  # block 0: not scored
    full.score(candidates)
    full.commit_chosen(candidates[:, 2], torch.full((B,), 2))
    last = torch.randint(3, len(tokenizer), (B, k), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(ragged.score(last), full.score(last), atol=1e-5)


def test_a_cache_without_the_row_forward_scores_every_block(tokenizer, reward_model):
    """The static cache (the compiled engine's) has no ragged forward: ``active`` is read as every block."""
    reward = RewardModelScorer(reward_model, context="full").compiled_form(compiled=False)
    session = reward.start(PREFIXES, tokenizer)
    assert not session.ragged
    candidates = torch.randint(3, len(tokenizer), (len(PREFIXES), 5), generator=torch.Generator().manual_seed(3))
    active = torch.zeros_like(candidates, dtype=torch.bool)
    active[:, 0] = True
    assert (session.score(candidates, active=active)[:, 1:] != 0).all()


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_an_empty_prefix_scores_ragged(tokenizer, backend, steerkit_cache):
    """A reward model with no start token, on continuations: its cache holds nothing before the first commit (a
    torch layer not yet written to), and a ragged round then scores and commits as a full one does."""
    from steerkit.testing import tiny_reward

    model = tiny_reward(tokenizer, seed=5)
    model.config.start_token_id = None
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    reward = RewardModelScorer(model, backend=backend)
    ragged, full = reward.start(["", ""], tokenizer), reward.start(["", ""], tokenizer)
    assert ragged.cache.length == 0
    candidates = torch.tensor([[5, 6, 7], [8, 9, 10]])
    active = torch.tensor([[True, False, True], [True, True, False]])
    want = full.score(candidates)
    assert torch.allclose(ragged.score(candidates, active=active)[active], want[active], atol=1e-5)
    for session in (ragged, full):
        session.commit_chosen(candidates[:, 0], torch.tensor([0, 1]))
    assert torch.allclose(ragged.score(candidates), full.score(candidates), atol=1e-5)


def test_a_wrapper_that_forwards_ragged_but_not_active_is_not_ragged(tokenizer, reward_model):
    """A session wrapper (a plugin's, or a test's) that forwards every attribute to a ragged session, ``ragged``
    included, but whose ``score`` does not take ``active``: the engine hands it full rows, as to any session."""
    from steerkit.rewards.base import scores_ragged

    class Forwarding:
        def __init__(self, inner):
            self.inner = inner

        def score(self, candidates):
            return self.inner.score(candidates)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    session = RewardModelScorer(reward_model).start(["a"], tokenizer)
    assert scores_ragged(session)
    assert Forwarding(session).ragged and not scores_ragged(Forwarding(session))

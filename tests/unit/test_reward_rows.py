"""Rows joining and leaving a live reward session (``keep_rows`` / ``add_rows``): after any sequence of joins and
leaves, every row's rewards equal scoring that row alone from scratch, on the torch and onnxruntime backends,
for the same-tokenizer and the bridged sessions."""

from __future__ import annotations

import pytest
import torch

from reward_rows_support import PROMPTS, drive, same_tokenizer_reference, text_reference
from tiny import make_tokenizer, tiny_reward

from steerkit.rewards.base import supports_row_changes
from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.sessions import SameTokenizerSession
from steerkit.rewards.sequence.static_cache import StaticScoringCache

#: the torch reward on its own cache, and on the static one (the compiled engine's layout, run eagerly here;
#: tests/unit/test_static_scoring.py runs it compiled)
LAYOUTS = ["dynamic", "static"]


def torch_reward(model, context: str, layout: str) -> RewardModelScorer:
    reward = RewardModelScorer(model, context=context)
    return reward.compiled_form(compiled=False) if layout == "static" else reward


@pytest.fixture(scope="module")
def steerkit_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEERKIT_CACHE", str(tmp_path_factory.mktemp("steerkit_cache")))
        yield


@pytest.fixture(scope="module")
def bridged_rm():
    """A reward model of another tokenizer family (Metaspace + byte fallback) than the byte-level BPE LM."""
    return tiny_reward(make_tokenizer(kind="metaspace", vocab_size=350), seed=4)


@pytest.mark.parametrize("by_index", [False, True], ids=["commit", "commit_chosen"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", [0, 1])
def test_torch_same_tokenizer_rows_join_and_leave(tokenizer, reward_model, seed, layout, by_index):
    reward = torch_reward(reward_model, "full", layout)  # uneven prompts: the merged caches are left-padded
    session = reward.start(["a"], tokenizer)
    assert isinstance(session, SameTokenizerSession)
    assert isinstance(session.cache, StaticScoringCache) == (layout == "static")
    joins, leaves = drive(reward, tokenizer, same_tokenizer_reference(reward_model, tokenizer), seed=seed,
                          by_index=by_index)
    assert joins >= 3 and leaves >= 2


def test_the_engine_commits_by_index(tokenizer, reward_model, monkeypatch):
    """``generate`` tells a same-vocabulary session each row's choice as its index among the candidates
    (``commit_chosen``), so the session searches for nothing and, on a GPU, reads nothing back. (That both commits
    keep the same state: the join/leave test above and the texts here; that generate's tokens did not change:
    test_determinism.py's recorded tokens.)"""
    from steerkit.testing import tiny_lm

    import steerkit
    import steerkit.engine.core as core

    calls = {"commit": 0, "commit_chosen": 0}
    commit, commit_chosen = SameTokenizerSession.commit, SameTokenizerSession.commit_chosen

    def counted(name, method):
        def call(self, *args):
            calls[name] += 1
            return method(self, *args)
        return call

    monkeypatch.setattr(SameTokenizerSession, "commit", counted("commit", commit))
    monkeypatch.setattr(SameTokenizerSession, "commit_chosen", counted("commit_chosen", commit_chosen))
    kwargs = dict(lm=(tiny_lm(tokenizer, seed=3), tokenizer), rewards={RewardModelScorer(reward_model): -4.0}, k=5,
                  max_new_tokens=6, do_sample=False, eos_token_id=[])
    by_index = steerkit.generate(["ab cd", "x"], **kwargs)
    assert calls == {"commit": 0, "commit_chosen": 6}
    monkeypatch.setattr(core, "COMMIT_BY_INDEX", False)  # bench_gpu.py's compiled-search-commit: tokens committed
    assert steerkit.generate(["ab cd", "x"], **kwargs).texts == by_index.texts
    assert calls == {"commit": 6, "commit_chosen": 12}  # commit() keeps the candidate it found through commit_chosen


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_continuation_rows_join_and_leave(tokenizer, reward_model, layout):
    reward = torch_reward(reward_model, "continuation", layout)  # every row starts from the start token alone
    reference = same_tokenizer_reference(reward_model, tokenizer)
    drive(reward, tokenizer, lambda prefix, ids, cands: reference("", ids, cands), seed=3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bridged_rows_join_and_leave(tokenizer, bridged_rm, layout):
    reward = torch_reward(bridged_rm, "full", layout)
    session = reward.start(["x"], tokenizer)
    assert isinstance(session, BridgedSession) and supports_row_changes(session)
    assert isinstance(session.cache, StaticScoringCache) == (layout == "static")
    joins, leaves = drive(reward, tokenizer, text_reference(bridged_rm, tokenizer), seed=5, steps=12)
    assert joins >= 3 and leaves >= 2


def test_onnx_rows_join_and_leave(tokenizer, reward_model, bridged_rm, steerkit_cache):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    reward = RewardModelScorer(reward_model, backend="onnx", context="full")
    session = reward.start(["x"], tokenizer)
    assert type(session.cache).__name__ == "OnnxScoringCache" and supports_row_changes(session)
    drive(reward, tokenizer, same_tokenizer_reference(reward_model, tokenizer), seed=6, steps=10)
    bridged = RewardModelScorer(bridged_rm, backend="onnx", context="full")
    drive(bridged, tokenizer, text_reference(bridged_rm, tokenizer), seed=7, steps=8)


def test_keep_rows_drops_unused_left_padding(tokenizer, reward_model):
    """When the longest row leaves, the columns only it used are freed (the cache does not grow without bound)."""
    reward = RewardModelScorer(reward_model, context="full")
    session = reward.start(["a"], tokenizer)
    session.add_rows(reward.start([PROMPTS[3]], tokenizer))
    long = session.cache.length
    session.keep_rows(torch.tensor([0]))
    assert session.cache.length < long
    assert session.cache.length == session.cache.mask.shape[1] == int(session.cache.mask.sum())
    assert session.cache.cache.layers[0].keys.shape[2] == session.cache.length


def test_add_rows_refuses_another_kind_of_session(tokenizer, reward_model, bridged_rm):
    same = RewardModelScorer(reward_model).start(["a"], tokenizer)
    bridged = RewardModelScorer(bridged_rm).start(["a"], tokenizer)
    with pytest.raises(TypeError):
        same.add_rows(bridged)
    with pytest.raises(TypeError):
        bridged.add_rows(same)


def test_a_session_without_the_methods_does_not_support_row_changes():
    class Plain:
        def score(self, candidates):
            return torch.zeros(candidates.shape)

        def commit(self, tokens):
            pass

    assert not supports_row_changes(Plain())

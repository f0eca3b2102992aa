"""Rows joining and leaving a live reward session (``keep_rows`` / ``add_rows``): after any sequence of joins and
leaves, every row's rewards equal scoring that row alone from scratch, on the torch and onnxruntime backends,
for the same-tokenizer and the bridged sessions."""

from __future__ import annotations

import pytest
import torch

from tiny import make_tokenizer, tiny_reward

from steerkit.rewards.base import supports_row_changes
from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.sessions import SameTokenizerSession

PROMPTS = ["The quick brown fox jumps", "", "You are", "Café déjà vu: naïve 🙂 résumé", "I hate it",
           "Numbers 0123 and"]
TOL = 1e-5


@pytest.fixture(scope="module")
def steerkit_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEERKIT_CACHE", str(tmp_path_factory.mktemp("steerkit_cache")))
        yield


@pytest.fixture(scope="module")
def bridged_rm():
    """A reward model of another tokenizer family (Metaspace + byte fallback) than the byte-level BPE LM."""
    return tiny_reward(make_tokenizer(kind="metaspace", vocab_size=350), seed=4)


def same_tokenizer_reference(rm, lm_tok):
    def reference(prefix: str, ids: list[int], candidates: list[int]) -> list[float]:
        head = [rm.config.start_token_id] + lm_tok(prefix, add_special_tokens=False)["input_ids"] + ids
        batch = torch.tensor([head + [c] for c in candidates])
        with torch.no_grad():
            return rm(batch).rewards[:, -1].tolist()
    return reference


def text_reference(rm, lm_tok):
    def reference(prefix: str, ids: list[int], candidates: list[int]) -> list[float]:
        return rm.score_texts([prefix + lm_tok.decode(ids + [c], skip_special_tokens=True) for c in candidates])
    return reference


def drive(reward, lm_tok, reference, *, steps=14, k=5, seed=0, max_rows=4):
    """Random joins (newcomers started alone, some advanced a few tokens before joining) and leaves (random
    subsets in a random order) between steps; every step compares all rows with ``reference``. Returns the
    number of joins and leaves that happened."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(lm_tok)

    def rand(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=g))

    def step(session, rows, check: bool):
        cands = torch.randint(3, vocab, (len(rows), k), generator=g)
        got = session.score(cands)
        assert got.shape == (len(rows), k)
        if check:
            for b, row in enumerate(rows):
                want = torch.tensor(reference(row["prefix"], row["ids"], cands[b].tolist()))
                diff = (got[b] - want).abs().max().item()
                assert diff <= TOL, f"row {row['prefix']!r} after {len(row['ids'])} tokens differs by {diff:.2e}"
        chosen = cands[torch.arange(len(rows)), torch.randint(0, k, (len(rows),), generator=g)]
        session.commit(chosen)
        for row, token in zip(rows, chosen.tolist()):
            row["ids"].append(token)

    session, rows, joins, leaves = None, [], 0, 0
    for t in range(steps):
        if rows and (rand(3) == 0 or len(rows) == max_rows):  # some rows leave, the rest are reordered
            keep = torch.randperm(len(rows), generator=g)[: rand(len(rows))]
            if len(keep):
                session.keep_rows(keep)
                rows = [rows[i] for i in keep.tolist()]
            else:
                session, rows = None, []
            leaves += 1
        if len(rows) < max_rows and (not rows or rand(2) == 0):
            n = 1 + rand(min(2, max_rows - len(rows)))
            new_rows = [{"prefix": PROMPTS[rand(len(PROMPTS))], "ids": []} for _ in range(n)]
            other = reward.start([r["prefix"] for r in new_rows], lm_tok)
            for _ in range(rand(3)):  # a newcomer may have committed tokens of its own before joining
                step(other, new_rows, check=False)
            if session is None:
                session = other
            else:
                session.add_rows(other)
            rows += new_rows
            joins += 1
        step(session, rows, check=True)
    return joins, leaves


@pytest.mark.parametrize("seed", [0, 1])
def test_torch_same_tokenizer_rows_join_and_leave(tokenizer, reward_model, seed):
    reward = RewardModelScorer(reward_model, context="full")  # uneven prompts: the merged caches are left-padded
    assert isinstance(reward.start(["a"], tokenizer), SameTokenizerSession)
    joins, leaves = drive(reward, tokenizer, same_tokenizer_reference(reward_model, tokenizer), seed=seed)
    assert joins >= 3 and leaves >= 2


def test_torch_continuation_rows_join_and_leave(tokenizer, reward_model):
    reward = RewardModelScorer(reward_model)  # continuation: every row starts from the start token alone
    reference = same_tokenizer_reference(reward_model, tokenizer)
    drive(reward, tokenizer, lambda prefix, ids, cands: reference("", ids, cands), seed=3)


def test_bridged_rows_join_and_leave(tokenizer, bridged_rm):
    reward = RewardModelScorer(bridged_rm, context="full")
    session = reward.start(["x"], tokenizer)
    assert isinstance(session, BridgedSession) and supports_row_changes(session)
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

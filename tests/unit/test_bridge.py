"""Tokenizer bridging: a reward model from another tokenizer family must score exactly what it would score
from scratch on the decoded text (``RewardModel.score_texts``), at every step, for every candidate."""

from __future__ import annotations

import pytest
import torch

from conftest import require_backend
from tiny import make_tokenizer, tiny_lm, tiny_reward

from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.sessions import SameTokenizerSession

# multi-byte characters (accents, emoji, CJK and € outside the tiny vocabularies: byte tokens), leading and
# repeated spaces, tabs, newlines, digits; rows of different lengths so that one row finishes early
TEXTS = [
    "Café déjà 🙂 ñandú 中文 €42, naïve 3.5 🚀  two  spaces 😀x 12 end.",
    "  Über 0123 straße 😀😀 x\tz\n中 ok 7",
]
PREFIXES = ["Prompt: héllo", "Other prompt 1"]


@pytest.fixture(scope="module")
def families():
    return {"bpe": make_tokenizer(kind="bpe"), "metaspace": make_tokenizer(kind="metaspace", vocab_size=350)}


def drive(session, lm_tok, rm, texts, prefixes, *, k=8, seed=0, force_every=0, tol=1e-4, ragged=False):
    """Feed LM-tokenized ``texts`` through ``session`` one token per step; compare every candidate's reward
    with scoring ``prefix + decode(ids so far + candidate)`` from scratch. Returns the number of steps.

    ``ragged``: each step marks some candidates ``active`` (the committed one among them, but where a step forces a
    token, and every fifth step none of row 0's: it is read as its first); those alone must equal scoring from
    scratch, the others score 0."""
    ids = [lm_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    B, steps = len(texts), max(len(x) for x in ids)
    pad, eos = lm_tok.pad_token_id, lm_tok.eos_token_id
    g = torch.Generator().manual_seed(seed)
    done = [[] for _ in range(B)]
    for t in range(steps):
        nxt = [ids[b][t] if t < len(ids[b]) else pad for b in range(B)]
        cands = torch.randint(0, len(lm_tok), (B, k), generator=g)
        forced = force_every and t % force_every == force_every - 1
        if forced:  # the committed token is not among the candidates
            cands[cands == torch.tensor(nxt)[:, None]] = 7
        else:
            cands[:, 0] = torch.tensor(nxt)
        cands[:, 1] = eos  # a special token decodes to nothing
        cands = cands[:, torch.randperm(k, generator=g)]
        read = torch.ones((B, k), dtype=torch.bool)
        if ragged:
            read = (torch.rand((B, k), generator=g) < 0.3) | (cands == torch.tensor(nxt)[:, None])
            if t % 5 == 4:
                read[0] = False
            got = session.score(cands, active=read)
            read[~read.any(-1), 0] = True
            assert (got[~read] == 0).all()
        else:
            got = session.score(cands)
        texts_now = [prefixes[b] + lm_tok.decode(done[b] + [c], skip_special_tokens=True)
                     for b in range(B) for c in cands[b].tolist()]
        want = torch.tensor(rm.score_texts(texts_now)).view(B, k)
        diff = (got - want)[read].abs().max().item()
        assert diff <= tol, f"step {t}: reward differs by {diff:.2e} from scoring the decoded text from scratch"
        session.commit(torch.tensor(nxt))
        for b in range(B):
            if t < len(ids[b]):
                done[b].append(nxt[b])
    return steps


def partial_utf8_steps(lm_tok, text):
    ids = lm_tok(text, add_special_tokens=False)["input_ids"]
    return sum("\ufffd" in lm_tok.decode(ids[:i], skip_special_tokens=True) for i in range(len(ids) + 1))


@pytest.mark.parametrize("lm_kind,rm_kind", [("bpe", "metaspace"), ("metaspace", "bpe")])
@pytest.mark.parametrize("context", ["continuation", "full"])
def test_bridged_rewards_equal_scoring_from_scratch(families, lm_kind, rm_kind, context):
    lm_tok, rm_tok = families[lm_kind], families[rm_kind]
    rm = tiny_reward(rm_tok, seed=4)
    scorer = RewardModelScorer(rm, context=context)
    session = scorer.start(PREFIXES, lm_tok)
    assert isinstance(session, BridgedSession)
    blocks = []
    score_blocks = session.cache.score_blocks
    session.cache.score_blocks = lambda ids, mask: blocks.append(mask.sum(-1).min().item()) or score_blocks(ids, mask)
    prefixes = PREFIXES if context == "full" else ["", ""]
    steps = drive(session, lm_tok, rm, TEXTS, prefixes, force_every=9)
    # the test text really exercises what it claims to
    assert steps >= 20
    assert partial_utf8_steps(lm_tok, TEXTS[0]) >= 3  # incomplete multi-byte characters were committed
    # incremental: the cache covers the committed text up to a late boundary; blocks stay short
    total = [len(rm_tok(p + t, add_special_tokens=False)["input_ids"]) for p, t in zip(prefixes, TEXTS)]
    assert all(s > 0.7 * len(p + t) for s, p, t in zip(session.stable, prefixes, TEXTS))
    median = sorted(blocks)[len(blocks) // 2]  # widest block of each step (U+FFFD tails are long in bytes)
    assert median <= 10 and 4 * median < min(total)


@pytest.mark.parametrize("lm_kind,rm_kind", [("bpe", "metaspace"), ("metaspace", "bpe")])
def test_random_text_fuzz(families, lm_kind, rm_kind):
    import random

    pieces = ["Café", " déjà", " 🙂", "🚀", " naïve", " 12", "3.5", "  ", "\t", "\n", " ñ", "中文", "€", " x", "y",
              "'s", " don't", "!!", " Über", "😀😀", " a", "  b", ",", "."]
    rm = tiny_reward(families[rm_kind], seed=5)
    for seed in range(3):
        rnd = random.Random(seed)
        texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(6, 14))) for _ in range(3)]
        session = RewardModelScorer(rm).start(["", "", ""], families[lm_kind])
        drive(session, families[lm_kind], rm, texts, ["", "", ""], k=rnd.choice([2, 5, 12]), seed=seed,
              force_every=rnd.choice([0, 4, 6]))


@pytest.mark.parametrize("backend", ["torch", "onnx", "llama.cpp"])
@pytest.mark.parametrize("lm_kind,rm_kind", [("bpe", "metaspace"), ("metaspace", "bpe")])
def test_ragged_rounds_score_only_the_active_candidates(families, lm_kind, rm_kind, backend, tmp_path, monkeypatch):
    """A pruned step's round hands the bridged session each row's own candidates (``active``): only those are
    decoded, re-tokenized and scored, each exactly as from scratch, with forced tokens, finished rows and a row with
    none active among them; the session stays exact over a whole text."""
    require_backend(backend)
    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path))  # the onnx and GGUF exports of the tiny reward
    lm_tok, rm = families[lm_kind], tiny_reward(families[rm_kind], seed=9)
    session = RewardModelScorer(rm, backend=backend, context="full").start(PREFIXES, lm_tok)
    assert isinstance(session, BridgedSession) and session.ragged
    decoded = []  # candidates whose text was worked out, per call
    extensions = session._extensions
    session._extensions = lambda rows, cands: decoded.append(sum(map(len, cands))) or extensions(rows, cands)
    steps = drive(session, lm_tok, rm, TEXTS, PREFIXES, k=10, force_every=7, ragged=True)
    assert steps >= 20
    assert sum(decoded) < 0.6 * 10 * len(TEXTS) * steps, (sum(decoded), steps)  # not all k a row and step


def widths_recorded(session):
    """``(session, widths)``: a bridged session whose cache records each scoring call's widest block (reward
    tokens) into ``widths``."""
    assert isinstance(session, BridgedSession)
    widths, score_blocks = [], session.cache.score_blocks
    session.cache.score_blocks = lambda ids, mask, *a: widths.append(int(mask.sum(-1).max())) or score_blocks(
        ids, mask, *a)
    return session, widths


@pytest.mark.parametrize("lm_kind", ["metaspace", "other bpe"])
def test_a_long_run_without_whitespace_settles_at_other_clean_splits(families, lm_kind, monkeypatch):
    """A byte-level reward tokenizer behind text with no whitespace (markup, a URL): past ``max_tail`` tokens after
    the boundary the session settles at another split that re-tokenizes cleanly, so its blocks stop growing with the
    text; every reward stays equal to scoring from scratch."""
    texts = ["<x><y>" * 6 + "http://ab.cd/e/f?g=h", "a.b.c/d-e_f" * 3]
    rm = tiny_reward(families["bpe"], seed=3)
    lm_tok = families["metaspace"] if lm_kind == "metaspace" else make_tokenizer(kind="bpe", vocab_size=420)
    widths = {}
    for cap in (10 ** 9, BridgedSession.max_tail):
        monkeypatch.setattr(BridgedSession, "max_tail", cap)
        monkeypatch.setattr(BridgedSession, "max_block", 10 ** 9)  # no cut at a token: these splits alone
        session, widths[cap] = widths_recorded(RewardModelScorer(rm, context="full").start(["", "p"], lm_tok))
        drive(session, lm_tok, rm, texts, ["", "p"], k=4, force_every=5)
    assert max(widths[10 ** 9]) >= 40
    assert max(widths[BridgedSession.max_tail]) <= BridgedSession.max_tail + 8, widths


@pytest.mark.parametrize("lm_kind,rm_kind,run", [("other bpe", "bpe", "中文字符没有空格"), ("metaspace", "bpe", "abcdefghij"),
                                                 ("bpe", "metaspace", "abcdefghij")],
                         ids=["chinese-byte-level", "word-byte-level", "word-sentencepiece"])
def test_a_run_that_never_splits_is_cut_at_a_token(families, lm_kind, rm_kind, run, monkeypatch):
    """Text that neither whitespace nor the reward tokenizer's pre-tokens split (Chinese, or a long word: one
    byte-level pre-token; a long word under a SentencePiece-style reward tokenizer): without the cut at a token, each
    candidate's block grows with the text; with it, a block stays within ``max_block`` tokens plus a candidate's.
    Under the byte-level reward tokenizer every cut here re-tokenizes cleanly, so every reward still equals scoring
    from scratch; under the SentencePiece one the text after a cut reads as a word start, which is not checked."""
    texts = [run * (75 // len(run)), "ab" + run[:3] * (60 // len(run[:3]))]
    lm_tok = make_tokenizer(kind="bpe", vocab_size=420) if lm_kind == "other bpe" else families[lm_kind]
    rm = tiny_reward(families[rm_kind], seed=6)
    widths, steps = {}, {}
    for cap in (10 ** 9, BridgedSession.max_block):
        monkeypatch.setattr(BridgedSession, "max_block", cap)
        session, widths[cap] = widths_recorded(RewardModelScorer(rm, context="full").start(["", "p"], lm_tok))
        tol = 1e-4 if rm_kind == "bpe" else float("inf")
        steps[cap] = drive(session, lm_tok, rm, texts, ["", "p"], k=4, force_every=7, tol=tol)
    assert max(widths[10 ** 9]) >= 2 * BridgedSession.max_block, widths[10 ** 9]
    assert max(widths[BridgedSession.max_block]) <= BridgedSession.max_block + 12, widths[BridgedSession.max_block]
    assert steps[BridgedSession.max_block] >= 20


def test_same_vocabulary_uses_the_plain_session(families):
    rm = tiny_reward(families["bpe"])
    assert isinstance(RewardModelScorer(rm).start(["a"], families["bpe"]), SameTokenizerSession)
    assert isinstance(RewardModelScorer(rm).start(["a"], families["metaspace"]), BridgedSession)


def test_generate_with_a_bridged_reward_traces_exact_rewards(families):
    """End to end through the decoder (sampling, finished rows padded): every traced reward of every candidate
    equals the reward model's from-scratch score of the decoded continuation plus that candidate."""
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.steering import SteeringTerm

    lm_tok = families["metaspace"]
    lm = tiny_lm(lm_tok, seed=2)
    rm = tiny_reward(families["bpe"], seed=6)
    term = SteeringTerm(RewardModelScorer(rm, name="bridged"), beta=3.0)
    out = RewardAugmentedGenerator(lm, lm_tok, [term], k=6).generate(
        ["Café au", "Numbers 12"], max_new_tokens=24, num_return_sequences=2, seed=3, return_traces=True)
    (trace,) = out.traces
    assert len(trace) >= 20
    for step, st in enumerate(trace):
        texts = []
        for row in range(out.sequences.shape[0]):
            done = out.sequences[row, :step].tolist()
            texts += [lm_tok.decode(done + [c], skip_special_tokens=True) for c in st.topk_ids[row].tolist()]
        want = torch.tensor(rm.score_texts(texts)).view_as(st.rewards["bridged"])
        live = (st.chosen >= 0)[:, None].expand_as(want)
        assert torch.allclose(st.rewards["bridged"][live], want[live], atol=1e-4), step


def test_hf_logits_processor_with_a_bridged_reward(families):
    from steerkit.hf import RewardAugmentedLogitsProcessor
    from steerkit.steering import SteeringTerm

    lm_tok = families["bpe"]
    lm = tiny_lm(lm_tok, seed=1)
    rm = tiny_reward(families["metaspace"], seed=7)
    proc = RewardAugmentedLogitsProcessor(lm_tok, [SteeringTerm(RewardModelScorer(rm, name="r"), beta=2.0)], k=5)
    enc = lm_tok(["Café 🙂"], return_tensors="pt", add_special_tokens=False)
    seq = lm.generate(**enc, logits_processor=[proc], do_sample=True, top_k=0, max_new_tokens=12,
                      pad_token_id=lm_tok.pad_token_id)
    step = proc.last_step
    done = seq[0, enc["input_ids"].shape[1]:-1].tolist()
    texts = [lm_tok.decode(done + [c], skip_special_tokens=True) for c in step.topk_ids[0].tolist()]
    assert torch.allclose(step.rewards["r"][0], torch.tensor(rm.score_texts(texts)), atol=1e-4)


def test_bridging_on_the_onnx_backend(families):
    pytest.importorskip("onnxruntime")
    from steerkit.rewards.onnx.backend import OnnxScoringCache

    rm = tiny_reward(families["bpe"], seed=8)
    session = RewardModelScorer(rm, backend="onnx").start(["", ""], families["metaspace"])
    assert isinstance(session, BridgedSession) and isinstance(session.cache, OnnxScoringCache)
    assert drive(session, families["metaspace"], rm, TEXTS, ["", ""], force_every=9) >= 20

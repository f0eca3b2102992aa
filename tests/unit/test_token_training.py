"""`steerkit train` with kind: token, from labels and by distillation from a sequence reward model (tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("token-train")
    tok = make_tokenizer()
    save_tiny_lm(root / "backbone", tok, seed=3)
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(120):
            text, label = labelled_review(i)
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
    from steerkit.rewards.model import RewardModel

    backbone_rm = RewardModel.from_backbone(str(root / "backbone"), name="teacher")
    torch.manual_seed(0)
    torch.nn.init.normal_(backbone_rm.head.weight, std=0.5)
    backbone_rm.save_pretrained(root / "teacher")
    return root


def config(root: Path, name: str, **extra):
    from steerkit.training import TrainConfig

    return TrainConfig.from_dict({
        "name": name, "backbone": str(root / "backbone"), "method": "lora", "kind": "token", "max_length": 16,
        "data_root": str(root), "output_dir": str(root / name),
        "data": [{"path": "reviews.jsonl", "text": "text", "label": "label"}],
        "steps": 12, "batch_size": 8, "lr": 5e-3, "seed": 7, "threads": 1, "dev_fraction": 0.1,
        "checkpoint_every": 4, **extra})


def test_label_training_writes_a_token_reward_with_card(workspace):
    import steerkit
    from steerkit.rewards.token.session import TokenReward
    from steerkit.training import train

    result = train(config(workspace, "labels", steps=30), progress=False)
    reward = steerkit.load_reward(str(result.output_dir))
    assert isinstance(reward, TokenReward)
    assert result.metrics["dev"]["all"]["auroc"] > 0.5  # learnable set: the realized-token loss fits it
    card = (result.output_dir / "README.md").read_text(encoding="utf-8")
    assert "token-level head" in card and "e_v the frozen output embeddings" in card
    from steerkit.training.assess import assess  # `steerkit train --assess` measures a token model as training did

    measured = assess(config(workspace, "labels", steps=30), result.output_dir)
    assert measured["dev"]["all"]["n"] == result.metrics["dev"]["all"]["n"]
    assert measured["dev"]["all"]["mse"] == pytest.approx(result.metrics["dev"]["all"]["mse"], abs=1e-6)


def test_distillation_fits_the_teacher_and_resumes_to_the_same_weights(workspace):
    from steerkit.training import train
    from steerkit.training.trainer import Callbacks

    distill = {"teacher": str(workspace / "teacher"), "lm": str(workspace / "backbone"), "prompts": 24,
               "prompt_words": 3, "max_new_tokens": 4, "k": 5, "steer_betas": [0.0, 5.0],
               "generation_batch_size": 8, "holdout_fraction": 0.25}
    full = train(config(workspace, "distilled", distill=distill), progress=False)
    held = full.metrics["distillation"]["held_out"]
    assert held["n_candidates"] > 0 and held["mse"] < 0.25

    class Crash(Exception):
        pass

    def crash(step, path):
        if step == 8:
            raise Crash

    cfg = config(workspace, "distilled-resumed", distill=distill)
    with pytest.raises(Crash):
        train(cfg, progress=False, callbacks=Callbacks(on_checkpoint=crash))
    resumed = train(cfg, resume=True, progress=False)
    a = load_file(str(full.output_dir / "head.safetensors"))
    b = load_file(str(resumed.output_dir / "head.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.metrics["training"]["resumed_from"] == "step-0000008"


def test_distillation_needs_kind_token(workspace):
    from steerkit.errors import ConfigError
    from steerkit.training import train

    with pytest.raises(ConfigError, match="kind: token"):
        train(config(workspace, "bad", kind="sequence", distill={"teacher": str(workspace / "teacher")}),
              progress=False)

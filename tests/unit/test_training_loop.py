"""The one training loop (steerkit/training/loop.py): label training and distillation get the same checks —
a non-finite loss writes the last good checkpoint and raises ConfigError, a model with nothing to train is
refused, resuming with other trainable parameters is refused — and the same monitoring; plus the seed
rules and the single same_vocabulary the training modules now share."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from steerkit.errors import CheckpointError, ConfigError  # noqa: E402
from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm  # noqa: E402
from steerkit.training import TrainConfig, train  # noqa: E402
from steerkit.training import trainer as trainer_module  # noqa: E402
from steerkit.training.distill import DistillationLoss  # noqa: E402
from steerkit.training.distill_data import SAMPLES_NAME  # noqa: E402
from steerkit.training.trainer import Callbacks, LabelLoss  # noqa: E402

KINDS = ["labels", "distill"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(80):
            text, label = labelled_review(i)
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
    from steerkit.rewards.model import RewardModel

    teacher = RewardModel.from_backbone(str(root / "backbone"), name="teacher")
    torch.manual_seed(0)
    torch.nn.init.normal_(teacher.head.weight, std=0.5)
    teacher.save_pretrained(root / "teacher")
    return root


def config(root: Path, name: str, kind: str, **extra) -> TrainConfig:
    values = {"name": name, "backbone": str(root / "backbone"), "method": "lora", "kind": "token", "max_length": 16,
              "data_root": str(root), "output_dir": str(root / name),
              "data": [{"path": "reviews.jsonl", "text": "text", "label": "label"}],
              "steps": 8, "batch_size": 8, "lr": 5e-3, "seed": 7, "threads": 1, "dev_fraction": 0.1,
              "eval_every": 100, "checkpoint_every": 100, "device": "cpu"}
    if kind == "distill":
        values["distill"] = {"teacher": str(root / "teacher"), "lm": str(root / "backbone"), "prompts": 16,
                             "prompt_words": 3, "max_new_tokens": 4, "k": 5, "generation_batch_size": 8,
                             "holdout_fraction": 0.25, "label_weight": 0.5}
    return TrainConfig.from_dict({**values, **extra}, source="test")


class Crash(Exception):
    pass


def strategy_of(kind: str):
    return LabelLoss if kind == "labels" else DistillationLoss


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_loss_writes_the_last_good_checkpoint_and_raises(workspace, monkeypatch, kind):
    strategy = strategy_of(kind)
    original, calls = strategy.loss, []

    def loss(self, model, batch):
        calls.append(1)
        value = original(self, model, batch)
        return value * float("nan") if len(calls) == 3 else value

    monkeypatch.setattr(strategy, "loss", loss)
    cfg = config(workspace, f"nan-{kind}", kind)
    with pytest.raises(ConfigError, match=r"Loss became nan at step 3; lower the learning rate\. "
                                          r"Last good state saved in .*step-0000002"):
        train(cfg, progress=False)
    ckpt = cfg.checkpoint_path
    assert (ckpt / "latest").read_text().strip() == "step-0000002"
    assert not Path(cfg.output_dir).exists()

    monkeypatch.setattr(strategy, "loss", original)  # the cause removed: the run continues from the checkpoint
    steps = []
    result = train(cfg, resume=True, progress=False, callbacks=Callbacks(on_step=lambda s, _: steps.append(s)))
    assert steps[0] == 3 and result.metrics["training"]["resumed_from"] == "step-0000002"


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_with_nothing_to_train_is_refused_before_any_work(workspace, monkeypatch, kind):
    build = trainer_module.build_model

    def frozen(cfg):
        model = build(cfg)
        model.requires_grad_(False)
        return model

    monkeypatch.setattr(trainer_module, "build_model", frozen)
    cfg = config(workspace, f"frozen-{kind}", kind)
    with pytest.raises(ConfigError, match="Nothing to train"):
        train(cfg, progress=False, callbacks=Callbacks(on_step=lambda *_: pytest.fail("a step was taken")))
    assert not (cfg.checkpoint_path / SAMPLES_NAME).exists()  # distillation: refused before sampling
    assert not Path(cfg.output_dir).exists()


@pytest.mark.parametrize("kind", KINDS)
def test_resuming_with_other_trainable_parameters_is_refused(workspace, monkeypatch, kind):
    cfg = config(workspace, f"retrained-{kind}", kind, checkpoint_every=4)

    def crash(step, path):
        raise Crash

    with pytest.raises(Crash):
        train(cfg, progress=False, callbacks=Callbacks(on_checkpoint=crash))
    build = trainer_module.build_model

    def head_only(c):  # same configuration (same fingerprint), but the LoRA weights are no longer trained
        model = build(c)
        model.backbone.requires_grad_(False)
        return model

    monkeypatch.setattr(trainer_module, "build_model", head_only)
    with pytest.raises(CheckpointError, match=r"does not match the model's trainable parameters \(no longer trained"):
        train(cfg, resume=True, progress=False, callbacks=Callbacks(on_step=lambda *_: pytest.fail("a step")))
    assert (cfg.checkpoint_path / "latest").read_text().strip() == "step-0000004"  # the checkpoint stays


def test_a_checkpoint_with_other_shapes_is_refused():
    from steerkit.training.run_state import trainable_mismatch

    params = {"a": torch.nn.Parameter(torch.zeros(2, 3)), "b": torch.nn.Parameter(torch.zeros(4))}
    assert trainable_mismatch({"a": torch.zeros(2, 3), "b": torch.zeros(4)}, params) == ""
    assert trainable_mismatch({"a": torch.zeros(3, 2), "b": torch.zeros(4)}, params) == "another shape: a"
    assert trainable_mismatch({"a": torch.zeros(2, 3), "c": torch.zeros(4)}, params) == (
        "not in the checkpoint: b; no longer trained: c")


def test_distillation_monitors_the_dev_rows_and_the_teacher(workspace):
    result = train(config(workspace, "monitored", "distill", eval_every=3), progress=False)
    monitored = [h for h in result.metrics["history"] if "dev" in h]
    assert [h["step"] for h in monitored] == [3, 6]
    for entry in monitored:
        assert set(entry["dev"]) == {"mse", "auroc", "accuracy"}
        assert set(entry["teacher"]) == {"mse", "top1_agreement"} and entry["teacher"]["mse"] >= 0
    assert [h["step"] for h in result.metrics["history"] if "loss" in h] == [8]


def test_distillation_samples_where_the_student_trains(workspace, monkeypatch):
    import steerkit.devices

    placed = []
    real_place = steerkit.devices.place

    def place(model, terms, device):
        placed.append((device, [t.name for t in terms], [t.weight(0) for t in terms]))
        return real_place(model, terms, device)

    monkeypatch.setattr(steerkit.devices, "place", place)
    train(config(workspace, "placed", "distill", steps=2, distill={
        "teacher": str(workspace / "teacher"), "lm": str(workspace / "backbone"), "prompts": 8, "prompt_words": 3,
        "max_new_tokens": 3, "k": 4, "steer_betas": [0.0, 2.0], "holdout_fraction": 0.25}), progress=False)
    # one set-up per steer_betas value (assembly.assemble), each placing the LM and the teacher on config.device
    assert [(device, names) for device, names, _ in placed] == [("cpu", ["teacher"])] * 2
    assert sorted(w for _, _, weights in placed for w in weights) == [0.0, 2.0]


# -- seeds and vocabularies --------------------------------------------------------------------------------------


def test_training_seeds_are_the_rules_of_steerkit_seeds():
    """The derivations moved to steerkit.seeds give exactly the numbers the training modules used before."""
    from steerkit.seeds import mixed_seed, unit_hash
    from steerkit.training.data import Example, epoch_indices, length_grouped_batches

    for seed in (0, 7, 123456789, -3):
        for epoch in (0, 1, 5):
            assert mixed_seed(seed, 1_000_003, epoch) == seed * 1_000_003 + epoch
            assert mixed_seed(seed, 7_919, epoch + 17) == seed * 7_919 + epoch + 17
            assert mixed_seed(seed, 1009, epoch) == seed * 1009 + epoch
            assert mixed_seed(seed, 7, epoch) == seed * 7 + epoch
    key = "7:split:reviews.jsonl:12"
    assert unit_hash(key) == int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64

    examples = [Example(text=f"t{i}", label=float(i % 2), source=0, line=i) for i in range(30)]
    legacy = torch.Generator().manual_seed(7 * 1_000_003 + 2)
    assert epoch_indices(examples, [1.0], 7, 2) == torch.randperm(30, generator=legacy).tolist()
    order = list(range(30))
    batches = length_grouped_batches(order, [1] * 30, 4, 7, 2)
    legacy = torch.Generator().manual_seed(7 * 7_919 + 2 + 17)
    perm = torch.randperm(8, generator=legacy).tolist()
    assert batches == [[order[j] for j in range(p * 4, min(p * 4 + 4, 30))] for p in perm]


def test_one_same_vocabulary():
    from steerkit.rewards import vocab
    from steerkit.rewards.sequence import scorer
    from steerkit.rewards.token import model as token_model  # check_vocabulary lives there
    from steerkit.training import distill_data

    assert scorer.same_vocabulary is token_model.same_vocabulary is vocab.same_vocabulary
    assert distill_data.same_vocabulary is vocab.same_vocabulary
    tok = make_tokenizer()
    assert vocab.same_vocabulary(tok, tok) and vocab.same_vocabulary(tok, make_tokenizer())

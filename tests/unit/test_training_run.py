"""End-to-end training on a tiny backbone: output loads everywhere, SIGKILL + --resume equals an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("config_names_its_data_root")

from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny backbone saved as a transformers directory, and a small labelled JSONL file."""
    root = tmp_path_factory.mktemp("train")
    save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(120):
            text, label = labelled_review(i)
            fh.write(json.dumps({"review": {"text": text, "stars": 1 + 4 * label}}) + "\n")
    (root / "test.txt").write_text("I love this movie and so much fun\n", encoding="utf-8")
    return root


def write_config(workspace: Path, name: str, **extra) -> Path:
    config = {
        "name": "tinyrm", "attribute": "probability the review is positive",
        "backbone": str(workspace / "backbone"), "method": "lora", "max_length": 16,
        "data_root": str(workspace), "output_dir": str(workspace / name),
        "data": [{"path": "reviews.jsonl", "text": "review.text", "label": "review.stars",
                  "transform": {"rescale": [1, 5]}}],
        "eval": [{"path": "test.txt", "label_value": 1, "name": "held-out"}],
        "steps": 12, "batch_size": 8, "lr": 5e-3, "seed": 7, "threads": 1, "dev_fraction": 0.1,
        "eval_every": 5, "checkpoint_every": 4, "keep_checkpoints": 2,
        "limitations": ["A test model."],
        **extra,
    }
    path = workspace / f"{name}.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def run_cli(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    # not `-m steerkit.cli`: as __main__ it would be a second module, without the commands registered on steerkit.cli
    return subprocess.run([sys.executable, "-c", "from steerkit.cli import main; main()", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return {**{f"adapter.{k}": v for k, v in load_file(str(directory / "adapter.safetensors")).items()},
            **{f"head.{k}": v for k, v in load_file(str(directory / "head.safetensors")).items()}}


HANG_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from steerkit.training import TrainConfig
    from steerkit.training.trainer import Callbacks, train

    config, marker, hang_at = TrainConfig.from_file(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

    def on_step(step, loss):
        if step == hang_at:            # past a checkpoint, mid-way to the next one
            marker.write_text(str(step))
            time.sleep(600)            # the parent SIGKILLs us here

    train(config, progress=False, callbacks=Callbacks(on_step=on_step))
""")


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(workspace):
    full_cfg = write_config(workspace, "uninterrupted")
    done = run_cli("train", str(full_cfg), "--quiet")
    assert done.returncode == 0, done.stderr
    reference = weights(workspace / "uninterrupted")

    killed_cfg = write_config(workspace, "killed")
    marker = workspace / "hung-at"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    with subprocess.Popen([sys.executable, "-c", HANG_SCRIPT, str(killed_cfg), str(marker), "6"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:  # closes the pipe
        try:
            deadline = time.monotonic() + 240
            while not marker.exists():
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "training never reached step 6"
                time.sleep(0.1)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGKILL
    checkpoints = workspace / "killed.checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step-0000004"
    assert not (workspace / "killed").exists()  # nothing half-written where the model goes

    again = run_cli("train", str(killed_cfg), "--quiet")  # without --resume: refuses to clobber the checkpoints
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = run_cli("train", str(killed_cfg), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr and "step 4/12" in resumed.stderr
    result = weights(workspace / "killed")
    assert result.keys() == reference.keys()
    for name in reference:
        assert torch.allclose(result[name], reference[name], atol=1e-6, rtol=0), name
    assert not checkpoints.exists()  # cleaned up after success

    metrics = json.loads((workspace / "killed" / "metrics.json").read_text())
    assert metrics["training"]["resumed_from"].endswith("step-0000004")


@pytest.mark.slow
def test_trained_directory_loads_everywhere(workspace):
    import steerkit
    from steerkit.rewards.model import RewardModel
    from steerkit.training import TrainConfig, train

    config = TrainConfig.from_file(write_config(workspace, "loadable", steps=30, checkpoint_every=100,
                                                card=str(workspace / "card.md")))
    result = train(config, progress=False)
    out = result.output_dir
    assert {"reward_config.json", "head.safetensors", "adapter.safetensors", "metrics.json", "README.md",
            "training_config.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "reward_config.json").read_text())
    assert saved["backbone"] == str(workspace / "backbone") and len(saved["backbone_fingerprint"]) == 64
    assert saved["method"] == "lora" and saved["name"] == "tinyrm" and saved["tokenizer"] == saved["backbone"]

    model = RewardModel.from_pretrained(out)
    texts = ["I love this movie and so much fun", "I hate it and terrible and awful"]
    rewards = model.score_texts(texts)
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert rewards[0] > rewards[1]  # it learned something

    # the trained (unmerged) model and the reloaded (merged) one agree
    scorer = steerkit.load_reward(str(out))
    assert scorer.model.score_texts(texts) == pytest.approx(rewards, abs=1e-6)

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["dev"]["all"]) >= {"mse", "auroc", "accuracy", "accuracy_at_25pct", "accuracy_at_50pct",
                                          "accuracy_at_75pct"}
    assert metrics["eval"]["held-out"]["n"] == 1
    assert metrics["training"]["train_seconds"] > 0 and metrics["data"][0]["sha256"]
    card = (workspace / "card.md").read_text()
    assert card == (out / "README.md").read_text()
    for needle in ("reviews.jsonl", "Intended use", "Limitations", "A test model.", "Data licences", "AUROC"):
        assert needle in card
    portable = json.loads((out / "training_config.json").read_text())  # no machine-specific output/data paths
    assert portable["data_root"] == workspace.name and portable["output_dir"] == "loadable"


def test_head_and_full_methods_save_and_load(workspace):
    from steerkit.rewards.model import RewardModel
    from steerkit.training import TrainConfig, train

    for method in ("head", "full"):
        config = TrainConfig.from_file(write_config(workspace, f"m-{method}", method=method, steps=3,
                                                    checkpoint_every=100, eval=[]))
        out = train(config, progress=False).output_dir
        files = {p.name for p in out.iterdir()}
        assert ("backbone.safetensors" in files) == (method == "full") and "adapter.safetensors" not in files
        model = RewardModel.from_pretrained(out)
        assert model.config.method == method and len(model.score_texts(["so much fun"])) == 1


def test_model_files_record_no_path_of_this_machine(workspace):
    """A source beside the config (``relative_to: config``) is recorded as the config wrote it, relative to the
    config's directory, in training_config.json and metrics.json; the data root and output by their names."""
    from steerkit.training import TrainConfig, train

    beside = workspace / "configs"
    beside.mkdir(exist_ok=True)
    path = write_config(workspace, "portable", steps=3, checkpoint_every=100,
                        eval=[{"path": "../test.txt", "relative_to": "config", "label_value": 1, "name": "beside"}])
    moved = beside / path.name
    path.replace(moved)
    config = TrainConfig.from_file(moved)
    assert config.eval[0].path == str(beside / "../test.txt")  # read from where it is
    out = train(config, progress=False).output_dir
    recorded = {name: (out / name).read_text(encoding="utf-8") for name in ("training_config.json", "metrics.json")}
    for name, text in recorded.items():  # (the backbone stays as given: a directory here, a name when shipped)
        assert str(beside) not in text and f'"{workspace}"' not in text, name
    assert json.loads(recorded["training_config.json"])["eval"][0]["path"] == "../test.txt"
    assert json.loads(recorded["metrics.json"])["eval_data"][0]["path"] == "../test.txt"
    assert json.loads(recorded["metrics.json"])["data"][0]["path"] == "reviews.jsonl"


def test_cli_reports_bad_data_with_exit_code_2_and_keeps_the_existing_model(workspace):
    bad = workspace / "bad.csv"
    bad.write_text("text,label\nfine,1\nbroken,1.7\n", encoding="utf-8")
    existing = workspace / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("old model")
    proc = run_cli("train", "--data", str(bad), "--label", "label", "--backbone", str(workspace / "backbone"),
                   "-o", str(existing), "--steps", "2", "--quiet")
    assert proc.returncode == 2
    assert f"{bad}:3:" in proc.stderr and "outside [0, 1]" in proc.stderr
    assert (existing / "keep.txt").read_text() == "old model"

"""Training never deletes what it did not create, cleans up after killed checkpoint writes, refuses datasets
too small for a dev split, and keeps the loss moving average across a resume (issue 10, items 1-3, 10, 11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("peft")

from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm  # noqa: E402

from steerkit.errors import CheckpointError, ConfigError, DataError, OutputExistsError  # noqa: E402
from steerkit.training import TrainConfig  # noqa: E402
from steerkit.training.checkpoint import clean_interrupted_writes, remove_checkpoints  # noqa: E402
from steerkit.training.data import DataSource, build_dataset  # noqa: E402
from steerkit.training.trainer import Callbacks, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny backbone saved as a transformers directory, and a small labelled JSONL file."""
    root = tmp_path_factory.mktemp("safety")
    save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(40):
            text, label = labelled_review(i)
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
    (root / "one.jsonl").write_text(json.dumps({"text": "only one row", "label": 1}) + "\n", encoding="utf-8")
    (root / "two.jsonl").write_text("".join(json.dumps({"text": t, "label": i}) + "\n"
                                            for i, t in enumerate(["a bad row", "a good row"])), encoding="utf-8")
    return root


def config(workspace: Path, output, **extra) -> TrainConfig:
    values = {
        "name": "tinyrm", "backbone": str(workspace / "backbone"), "method": "head", "max_length": 12,
        "data_root": str(workspace), "output_dir": str(output),
        "data": [{"path": "reviews.jsonl", "text": "text", "label": "label"}],
        "steps": 4, "batch_size": 4, "lr": 5e-3, "seed": 7, "threads": 1, "dev_fraction": 0.2,
        "eval_every": 100, "checkpoint_every": 100, "eval_batch_size": 16,
        **extra,
    }
    return TrainConfig.from_dict(values, source="test")


class Crash(Exception):
    """Raised from a step callback: the process dies mid-run, as a kill would stop it."""


def never_train(step, loss):
    raise AssertionError("training started although the output is refused")


def tree(path: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


# -- 1. the output path -----------------------------------------------------------------------------------------


def test_a_regular_file_at_output_is_refused_before_training_even_with_overwrite(workspace, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="not a directory.*another --output"):
            train(config(workspace, target), overwrite=overwrite, progress=False,
                  callbacks=Callbacks(on_step=never_train))
    assert target.read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no .notes.txt.old.PID left behind


def test_a_non_empty_directory_is_refused_and_overwrite_only_replaces_a_reward_model(workspace, tmp_path):
    mine = tmp_path / "photos"
    mine.mkdir()
    (mine / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    before = tree(mine)
    with pytest.raises(OutputExistsError, match="not a steerkit reward model"):
        train(config(workspace, mine), progress=False, callbacks=Callbacks(on_step=never_train))
    with pytest.raises(OutputExistsError, match="not a steerkit reward model.*even with --overwrite"):
        train(config(workspace, mine, overwrite=True), progress=False, callbacks=Callbacks(on_step=never_train))
    assert tree(mine) == before

    model_dir = tmp_path / "rm"
    first = train(config(workspace, model_dir), progress=False)  # a fresh path: fine
    assert (first.output_dir / "reward_config.json").is_file()
    (model_dir / "marker").write_text("first model")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        train(config(workspace, model_dir), progress=False, callbacks=Callbacks(on_step=never_train))
    assert (model_dir / "marker").read_text() == "first model"
    train(config(workspace, model_dir, overwrite=True), progress=False)  # a reward model, --overwrite: replaced
    assert (model_dir / "reward_config.json").is_file() and not (model_dir / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos", "rm"]  # no temporaries left

    empty = tmp_path / "empty"
    empty.mkdir()
    assert (train(config(workspace, empty), progress=False).output_dir / "reward_config.json").is_file()


def test_output_is_checked_again_at_write_time(workspace, tmp_path):
    output = tmp_path / "out"

    def someone_writes_there(step, loss):
        if step == 1:
            output.mkdir()
            (output / "report.txt").write_text("written during training")

    with pytest.raises(OutputExistsError):
        train(config(workspace, output), progress=False, callbacks=Callbacks(on_step=someone_writes_there))
    assert tree(output) == {"report.txt": b"written during training"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_cli_refuses_a_file_at_output_with_exit_2(workspace, tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"precious")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-c", "from steerkit.cli import main; main()", "train",
                           "--data", str(workspace / "reviews.jsonl"), "--label", "label",
                           "--backbone", str(workspace / "backbone"), "--method", "head", "-o", str(target),
                           "--steps", "1", "--overwrite", "--quiet"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "not a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]


def test_checkpoint_dir_inside_output_is_refused(workspace, tmp_path):
    with pytest.raises(ConfigError, match="inside output_dir"):
        train(config(workspace, tmp_path / "rm", checkpoint_dir=str(tmp_path / "rm" / "ckpt")), progress=False,
              callbacks=Callbacks(on_step=never_train))


# -- 2. the checkpoint directory ----------------------------------------------------------------------------------


def test_an_existing_checkpoint_dir_keeps_everything_the_run_did_not_create(workspace, tmp_path):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub").mkdir()
    (mine / "sub" / "data.csv").write_text("a,b\n")
    before = tree(mine)
    seen = []
    train(config(workspace, tmp_path / "rm", checkpoint_dir=str(mine), checkpoint_every=1), progress=False,
          callbacks=Callbacks(on_checkpoint=lambda step, path: seen.append(path.name)))
    assert seen  # checkpoints were written there ...
    assert tree(mine) == before  # ... and only they were removed

    empty = tmp_path / "empty-ckpt"
    empty.mkdir()
    train(config(workspace, tmp_path / "rm2", checkpoint_dir=str(empty), checkpoint_every=1), progress=False)
    assert empty.is_dir() and not any(empty.iterdir())  # not created by the run: stays

    train(config(workspace, tmp_path / "rm3", checkpoint_every=1), progress=False)
    assert not (tmp_path / "rm3.checkpoints").exists()  # created by the run: removed


def test_overwrite_discards_only_the_earlier_checkpoints(workspace, tmp_path):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    cfg = config(workspace, tmp_path / "rm", checkpoint_dir=str(mine), checkpoint_every=1, steps=6)

    def crash(step, loss):
        if step == 3:
            raise Crash

    with pytest.raises(Crash):
        train(cfg, progress=False, callbacks=Callbacks(on_step=crash))
    assert (mine / "latest").is_file()
    with pytest.raises(CheckpointError, match="--resume"):
        train(cfg, progress=False, callbacks=Callbacks(on_step=never_train))
    steps = []
    train(cfg, overwrite=True, progress=False, callbacks=Callbacks(on_step=lambda s, _: steps.append(s)))
    assert steps[0] == 1  # started again
    assert tree(mine) == {"notes.txt": b"keep me"}


# -- 3 and 11. resume: leftovers of killed writes, and the loss moving average ----------------------------------


def test_resume_cleans_killed_writes_and_continues_the_loss_average(workspace, tmp_path):
    extra = {"steps": 12, "checkpoint_every": 4, "eval_every": 5}
    reference = train(config(workspace, tmp_path / "uninterrupted", **extra), progress=False)

    cfg = config(workspace, tmp_path / "killed", **extra)
    ckpt = tmp_path / "killed.checkpoints"

    def crash(step, loss):
        if step == 6:
            raise Crash

    with pytest.raises(Crash):
        train(cfg, progress=False, callbacks=Callbacks(on_step=crash))
    assert (ckpt / "latest").read_text().strip() == "step-0000004"
    # what checkpoint writes killed at the wrong moment leave: save_checkpoint's temporary directory and
    # atomic_write_text's temporary file for `latest`
    leftovers = [ckpt / ".step-0000008.tmp4242", ckpt / ".step-0000012.tmp77", ckpt / ".latest.a1b2c3_z"]
    leftovers[0].mkdir()
    (leftovers[0] / "trainable.safetensors").write_bytes(b"\0" * 1000)
    leftovers[1].mkdir()
    leftovers[2].write_text("step-0000008\n")
    # names that only look alike are not ours
    decoys = [ckpt / ".latest.keep", ckpt / ".step-0000008.tmp", ckpt / "step-notes", ckpt / ".latest.abcdefghi",
              ckpt / "notes.txt"]
    for d in decoys:
        d.write_text("user file")

    at_first_step = []

    def look(step, loss):
        if not at_first_step:
            at_first_step.append({p.name for p in ckpt.iterdir()})

    resumed = train(cfg, resume=True, progress=False, callbacks=Callbacks(on_step=look))
    assert at_first_step and not {p.name for p in leftovers} & at_first_step[0]  # gone at start-up
    assert {d.name for d in decoys} <= at_first_step[0]
    assert all(d.read_text() == "user file" for d in decoys)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(d.name for d in decoys)  # only the run's files went

    assert resumed.metrics["training"]["resumed_from"] == "step-0000004"
    ref_loss = [h for h in reference.metrics["history"] if "loss" in h]
    got_loss = [h for h in resumed.metrics["history"] if "loss" in h]
    assert [h["step"] for h in got_loss] == [h["step"] for h in ref_loss] == [12]
    for got, ref in zip(got_loss, ref_loss):
        assert got["loss"] == pytest.approx(ref["loss"], abs=2e-6)
    saved = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert saved["history"] == resumed.metrics["history"]


def test_clean_interrupted_writes_matches_exact_names_only(tmp_path):
    (tmp_path / ".step-0000001.tmp123").mkdir()
    (tmp_path / ".latest.abcd_123").write_text("x")
    keep = [".step-0000001.tmp123x", "step-0000001.tmp123", ".latest.ABCDEFGH", ".latest.abc", ".latest.abcd_1234",
            "latest"]
    for name in keep:
        (tmp_path / name).write_text("user")
    (tmp_path / ".latest.dir_1234").mkdir()  # right name, wrong kind: not ours
    os.symlink(tmp_path / "latest", tmp_path / ".latest.link1234")
    removed = clean_interrupted_writes(tmp_path)
    assert sorted(p.name for p in removed) == [".latest.abcd_123", ".step-0000001.tmp123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + [".latest.dir_1234", ".latest.link1234"])
    remove_checkpoints(tmp_path, remove_dir=True)  # removes `latest`, keeps the rest and so the directory
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [n for n in keep if n != "latest"] + [".latest.dir_1234", ".latest.link1234"])


# -- 10. too little data for a dev split --------------------------------------------------------------------------


def test_one_example_is_a_data_error_naming_the_minimum(workspace, tmp_path):
    cfg = config(workspace, tmp_path / "rm", data=[{"path": "one.jsonl", "text": "text", "label": "label"}])
    with pytest.raises(DataError, match=r"at least 2 usable examples.*one\.jsonl: 1.*dev_fraction: 0"):
        train(cfg, progress=False, callbacks=Callbacks(on_step=never_train))
    assert not (tmp_path / "rm").exists()


def test_two_examples_always_give_one_dev_row(workspace):
    source = DataSource(path="two.jsonl", text="text", label="label")
    for seed in range(20):
        ds = build_dataset([source], [], workspace, seed=seed, dev_fraction=0.05, dev_max_per_source=None, dedup=True)
        assert len(ds.dev) == 1 and len(ds.train) == 1 and ds.stats[0].dev == 1
        again = build_dataset([source], [], workspace, seed=seed, dev_fraction=0.05, dev_max_per_source=None,
                              dedup=True)
        assert [e.text for e in again.dev] == [e.text for e in ds.dev]  # still seeded


def test_two_examples_train_with_dev_metrics(workspace, tmp_path):
    cfg = config(workspace, tmp_path / "rm", data=[{"path": "two.jsonl", "text": "text", "label": "label"}],
                 dev_fraction=0.05, steps=1, seed=0)  # seed 0 draws no dev row by itself
    result = train(cfg, progress=False)
    assert result.metrics["dev"]["all"]["n"] == 1
    assert result.metrics["data"][0]["dev"] == 1 and result.metrics["data"][0]["train"] == 1


def test_no_dev_split_and_no_eval_set_warns(workspace, tmp_path):
    cfg = config(workspace, tmp_path / "rm", data=[{"path": "one.jsonl", "text": "text", "label": "label"}],
                 dev_fraction=0, steps=1)
    with pytest.warns(UserWarning, match="nothing measures the trained model"):
        result = train(cfg, progress=False)
    assert result.metrics["dev"] == {}
    with_eval = config(workspace, tmp_path / "rm2", data=[{"path": "one.jsonl", "text": "text", "label": "label"}],
                       eval=[{"path": "two.jsonl", "text": "text", "label": "label"}], dev_fraction=0, steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert train(with_eval, progress=False).metrics["eval"]

"""benchmarks/compare_reward_auroc.py on a set with categories (``by``, the functional cases): each model's correct
count and mean ρ per category are what ``steerkit train CONFIG --assess MODEL`` reports for that category."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CASES = [("They are a plague.", 1, "derogation"), ("They are vermin, all of them.", 1, "derogation"),
         ("Saying they are vermin is wrong.", 0, "counter"), ("That claim is hateful.", 0, "counter"),
         ("Calling them a plague is a lie.", 0, "counter"), ("The museum opens at nine.", 0, "neutral")]


def test_per_category_counts_equal_what_assess_reports(tmp_path):
    from steerkit.rewards.model import RewardModel
    from steerkit.training import TrainConfig
    from steerkit.training.assess import assess

    save_tiny_lm(tmp_path / "backbone", make_tokenizer(), seed=3)
    with open(tmp_path / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(40):
            text, label = labelled_review(i)
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
    (tmp_path / "cases.jsonl").write_text("".join(json.dumps({"text": t, "label": y, "category": c}) + "\n"
                                                  for t, y, c in CASES), encoding="utf-8")
    models = []
    for seed in (0, 1):  # two untrained heads that score differently
        model = RewardModel.from_backbone(str(tmp_path / "backbone"), name="toy")
        torch.manual_seed(seed)
        torch.nn.init.normal_(model.head.weight, std=2.0)
        model.save_pretrained(tmp_path / f"m{seed}")
        models.append(f"m{seed}={tmp_path / f'm{seed}'}")
    config = tmp_path / "config.yaml"
    config.write_text(f"output_dir: out\nbackbone: {tmp_path / 'backbone'}\nmax_length: 16\nthreads: 1\n"
                      "data: [{path: reviews.jsonl, label: label}]\n"
                      "eval: [{name: cases, path: cases.jsonl, label: label, by: category}]\n", encoding="utf-8")
    out = tmp_path / "compare.json"
    run = subprocess.run([sys.executable, str(BENCHMARKS / "compare_reward_auroc.py"), str(config), "--data-root",
                          str(tmp_path), "--set", "cases", "--resamples", "20", "--out", str(out), *models],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert set(record["categories"]) == {"counter", "derogation", "neutral"}
    seen = set()
    for seed in (0, 1):
        measured = assess(TrainConfig.from_file(config, overrides={"data_root": str(tmp_path)}), tmp_path / f"m{seed}")
        for category, counts in record["categories"].items():
            mine, theirs = counts[f"m{seed}"], measured["eval"][f"cases / {category}"]
            assert mine["n"] == theirs["n"] and mine["correct"] == round(theirs["accuracy"] * theirs["n"])
            assert mine["mean_reward"] == pytest.approx(theirs["mean_reward"], abs=1e-6)
            seen.add(round(mine["mean_reward"], 6))
        assert record["models"][f"m{seed}"]["auroc"] == pytest.approx(measured["eval"]["cases"]["auroc"])
        assert f"m{seed} " in run.stdout and "derogation:" in run.stdout
    assert len(seen) > 3  # the two models and three categories differ: a real comparison, not one number repeated

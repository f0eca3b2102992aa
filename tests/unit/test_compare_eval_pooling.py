"""benchmarks/compare_eval_runs.py --more: runs of two models on other prompts pooled into one paired comparison give
what one run of all the prompts gives; a prompt in two pooled runs is refused. --eval-lm: runs rescored by a second
fluency LM compare one judge at a time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def write_run(directory: Path, prompts: range, rng: random.Random) -> Path:
    directory.mkdir(parents=True)
    scores, fluency = [], []
    for i in prompts:
        for setting in ("k20-beta10", "k20-beta50"):
            scores.append({"scorer": "tox", "prompt_set": "set", "index": i, "setting": setting,
                           "scores": [rng.random() for _ in range(4)]})
            fluency.append({"eval_lm": "lm", "prompt_set": "set", "index": i, "setting": setting,
                            "perplexities": [rng.uniform(5, 50) for _ in range(4)]})
    (directory / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scores))
    (directory / "fluency.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fluency))
    (directory / "metrics.json").write_text(json.dumps(
        {"results": [{"prompt_set": "set", "setting": "k20-beta10", "scorers": {"tox": {"avg_max_toxicity": 0.1}}}]}))
    return directory


def split(run: Path, out: Path, keep) -> Path:
    out.mkdir(parents=True)
    for name in ("scores.jsonl", "fluency.jsonl"):
        lines = [line for line in (run / name).read_text().splitlines() if keep(json.loads(line)["index"])]
        (out / name).write_text("".join(line + "\n" for line in lines))
    (out / "metrics.json").write_text((run / "metrics.json").read_text())
    return out


def test_pooled_runs_equal_one_run_of_all_prompts(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from compare_eval_runs import paired_table

    a = write_run(tmp_path / "a", range(12), random.Random(0))
    b = write_run(tmp_path / "b", range(12), random.Random(1))
    parts = {}  # each run split into prompts 0-4 and 5-11
    for name, run in (("a", a), ("b", b)):
        head = split(run, tmp_path / f"{name}1", lambda i: i < 5)
        parts[name] = (head, split(run, tmp_path / f"{name}2", lambda i: i >= 5))
    whole = paired_table(a, b, ("A", "B"), resamples=200)
    pooled = paired_table(parts["a"][0], parts["b"][0], ("A", "B"), resamples=200,
                          more=[(parts["a"][1], parts["b"][1])])
    first = paired_table(parts["a"][0], parts["b"][0], ("A", "B"), resamples=200)
    assert pooled == whole and "| 12 |" in whole
    assert first != whole and "| 5 |" in first
    with pytest.raises(SystemExit, match="also in an earlier run"):
        paired_table(a, b, ("A", "B"), resamples=10, more=[(parts["a"][1], parts["b"][1])])


def test_a_run_rescored_by_a_second_fluency_lm_compares_one_judge_at_a_time(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from compare_eval_runs import paired_table

    a = write_run(tmp_path / "a", range(8), random.Random(0))
    b = write_run(tmp_path / "b", range(8), random.Random(1))
    before = paired_table(a, b, ("A", "B"), resamples=100)
    for run in (a, b):  # the same records judged again by "other", at ten times the perplexity
        lines = (run / "fluency.jsonl").read_text().splitlines()
        again = [dict(r, eval_lm="other", perplexities=[10 * v for v in r["perplexities"]])
                 for r in map(json.loads, lines)]
        (run / "fluency.jsonl").write_text("\n".join(lines) + "\n" + "".join(json.dumps(r) + "\n" for r in again))
    with pytest.raises(SystemExit, match="several fluency LMs.*--eval-lm"):
        paired_table(a, b, ("A", "B"), resamples=10)
    assert paired_table(a, b, ("A", "B"), resamples=100, eval_lm="lm") == before
    with pytest.raises(SystemExit, match="no perplexities by 'gemma'.*lm, other"):
        paired_table(a, b, ("A", "B"), resamples=10, eval_lm="gemma")
    other = paired_table(a, b, ("A", "B"), resamples=100, eval_lm="other")
    ppl = [line for line in other.splitlines() if "median ppl" in line]
    first = [line for line in before.splitlines() if "median ppl" in line]
    assert len(ppl) == len(first) == 2
    for mine, theirs in zip(ppl, first):  # ten times every perplexity: ten times the medians and the difference
        va, vb = (float(c) for c in mine.split("|")[4:6])
        wa, wb = (float(c) for c in theirs.split("|")[4:6])
        assert va == pytest.approx(10 * wa, abs=0.06) and vb == pytest.approx(10 * wb, abs=0.06)

"""``steerkit train`` prints one metric line per set, never wrapped at the console width: a log or a ``grep`` on
``acc@50%=`` must not depend on the terminal's width or on the length of the set's name."""

from __future__ import annotations

from types import SimpleNamespace

from steerkit.cli import train

METRICS = {"n": 120, "mse": 0.1234, "auroc": 0.912, "accuracy": 0.9, "mean_reward": 0.523,
           "accuracy_at_50pct": 0.933}
LONG_SET = "a-held-out-evaluation-set-with-a-long-name-from-a-deep-directory/" * 2 + "test.jsonl"


def test_metric_lines_are_single_lines_on_a_narrow_non_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    metrics = {"eval": {LONG_SET: METRICS, "short": dict(METRICS, auroc=None)}, "dev": {"dev": METRICS}}
    result = SimpleNamespace(metrics=metrics, output_dir="/tmp/out", steps=1, seconds=1.0)
    train._print_result(result, as_json=False)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 4, lines
    assert lines[0] == (f"eval {LONG_SET}: n=120 mse=0.1234 auroc=0.912 acc=0.900 mean ρ=0.523 acc@50%=0.933")
    assert lines[1].startswith("eval short: n=120 ") and lines[1].endswith(" mean ρ=0.523 acc@50%=0.933")
    assert lines[2].startswith("dev dev: ") and "acc@50%=0.933" in lines[2]
    assert lines[3].startswith("Choosing β: `steerkit calibrate /tmp/out` ")  # the one line on how to pick β
    assert captured.out == "/tmp/out\n"

"""Every CLI command, given each class of bad input, exits 2 with one ``error:`` line on stderr and no traceback.

The commands run in-process through :func:`steerkit.cli.main` (the console script's entry point, the same
code path as ``steerkit ...`` in a shell), on tiny models saved to temporary directories.
"""

from __future__ import annotations

import json

import pytest
import torch

from tiny import make_tokenizer, save_tiny_lm

from steerkit.cli import main
from steerkit.rewards.model import RewardModel

BOMB = "\n".join(['a: &a ["x","x","x","x","x","x","x","x","x"]']
                 + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefg", "bcdefgh")])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-errors")
    tok = make_tokenizer()
    lm_dir = save_tiny_lm(root / "lm", tok, seed=5)
    rm = RewardModel.from_backbone(str(lm_dir), 1, name="tiny-rm")
    rm_dir = rm.save_pretrained(root / "rm")
    nan_rm = RewardModel.from_backbone(str(lm_dir), 1, name="nan-rm")
    with torch.no_grad():
        nan_rm.head.weight.fill_(float("nan"))
    nan_dir = nan_rm.save_pretrained(root / "rm-nan")
    (root / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    (root / "latin1.yaml").write_bytes(b"k: 5\nprompts: [caf\xe9]\n")
    (root / "dup.yaml").write_text("k: 5\nk: 6\n", encoding="utf-8")
    (root / "bomb.yaml").write_text(BOMB + "\nprompts: *h\n", encoding="utf-8")
    (root / "empty.gguf").write_bytes(b"")
    (root / "garbage.gguf").write_bytes(b"\x00not a gguf file at all" * 10)
    (root / "half.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    (root / "notempty").mkdir()
    (root / "notempty" / "precious.txt").write_text("keep me", encoding="utf-8")
    with open(root / "labels.jsonl", "w", encoding="utf-8") as fh:
        for i in range(40):
            fh.write(json.dumps({"text": f"{'good great' if i % 2 else 'bad awful'} {i}", "label": i % 2}) + "\n")
    (root / "train.yaml").write_text(json.dumps({
        "name": "t", "attribute": "positive", "backbone": str(lm_dir), "method": "lora", "max_length": 16,
        "data_root": str(root), "data": [{"path": "labels.jsonl", "text": "text", "label": "label"}],
        "steps": 2, "batch_size": 4, "threads": 1}), encoding="utf-8")
    return {"root": root, "lm": str(lm_dir), "rm": str(rm_dir), "nan": str(nan_dir)}


def run(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def _cases():
    def gen(*args):
        return ["generate", "--lm", "{lm}", "-t", "2", *args]

    return {
        # input encoding and files
        "generate/non-utf8-argv": ["generate", "caf\udce9"],
        "score/non-utf8-argv": ["score", "--reward", "{rm}", "caf\udce9"],
        "generate/missing-prompts-file": gen("--prompts-file", "{root}/nope.txt"),
        "generate/non-utf8-prompts-file": gen("--prompts-file", "{root}/latin1.txt"),
        "generate/prompts-file-is-dir": gen("--prompts-file", "{root}"),
        "generate/non-utf8-config": ["generate", "--config", "{root}/latin1.yaml"],
        "generate/duplicate-keys": ["generate", "--config", "{root}/dup.yaml", "hi"],
        "generate/alias-bomb": ["generate", "--config", "{root}/bomb.yaml"],
        "generate/missing-config": ["generate", "--config", "{root}/nope.yaml", "hi"],
        # models and devices
        "generate/empty-gguf": ["generate", "hi", "--lm", "{root}/empty.gguf"],
        "generate/garbage-gguf": ["generate", "hi", "--lm", "{root}/garbage.gguf"],
        "generate/truncated-gguf": ["generate", "hi", "--lm", "{root}/half.gguf"],
        "generate/unknown-lm": ["generate", "hi", "--lm", "no-such-model"],
        "generate/device-meta": gen("hi", "--device", "meta"),
        "generate/device-xpu": gen("hi", "--device", "xpu"),
        "generate/device-nonsense": gen("hi", "--device", "nonsense"),
        # steering values
        "generate/k-zero": gen("hi", "-k", "0"),
        "generate/k-not-int": gen("hi", "-k", "abc"),
        "generate/k-too-big": gen("hi", "-k", "100000"),
        "generate/beta-nan": gen("hi", "--reward", "{rm}=nan"),
        "generate/beta-overflows-float32": gen("hi", "--reward", "{rm}=1e39"),
        "generate/betas-sum-overflows": gen("hi", "--reward", "{rm}=3e38", "--reward", "{nan}=3e38"),
        "generate/beta-missing": gen("hi", "--reward", "{rm}"),
        "generate/unknown-reward": gen("hi", "--reward", "no-such-reward=1"),
        "generate/nan-reward": gen("hi", "--reward", "{nan}=-5", "--seed", "0"),
        "generate/empty-stop": gen("hi", "--stop", ""),
        "generate/zero-temperature": gen("hi", "--temperature", "0"),
        "generate/underflowing-temperature": gen("hi", "--temperature", "1e-50"),
        "generate/bogus-backend": gen("hi", "--reward", "{rm}=1", "--backend", "bogus"),
        "generate/unknown-option": ["generate", "hi", "--bogus"],
        "generate/bad-threads": ["--threads", "0", "generate", "hi"],
        "generate/no-prompts": gen(),
        # score
        "score/bogus-backend": ["score", "--reward", "{rm}", "--backend", "bogus", "hi"],
        "score/not-a-reward-model": ["score", "--reward", "positive-words", "hi"],
        "score/unknown-reward": ["score", "--reward", "no-such-reward", "hi"],
        "score/nan-reward": ["score", "--reward", "{nan}", "--json", "hi"],
        "score/longer-than-context": ["score", "--reward", "{rm}", "word " * 400],
        # calibrate
        "calibrate/empty-betas": ["calibrate", "{rm}", "--lm", "{lm}", "--betas", ""],
        "calibrate/beta-nan": ["calibrate", "{rm}", "--lm", "{lm}", "--betas=-5,nan"],
        "calibrate/unknown-reward": ["calibrate", "no-such-reward", "--lm", "{lm}"],
        "calibrate/nan-reward": ["calibrate", "{nan}", "--lm", "{lm}", "--betas", "5", "-t", "2", "-n", "1"],
        # train, eval, export, plugins
        "average/one-model": ["average", "{rm}", "-o", "{root}/avg"],
        "average/not-a-model": ["average", "{rm}", "{root}", "-o", "{root}/avg"],
        "average/existing-output": ["average", "{rm}", "{nan}", "-o", "{root}/notempty"],
        "train/missing-config": ["train", "{root}/nope.yaml"],
        "train/duplicate-keys": ["train", "{root}/dup.yaml"],
        "train/existing-output": ["train", "{root}/train.yaml", "-o", "{root}/notempty"],
        "train/output-is-a-file": ["train", "{root}/train.yaml", "-o", "{root}/labels.jsonl"],
        "eval/missing-prompts": ["eval", "toxicity", "--lm", "{lm}", "--output", "{root}/run", "--no-fluency"],
        "eval/alias-bomb": ["eval", "toxicity", "--config", "{root}/bomb.yaml"],
        "export/unknown-reward": ["export", "onnx", "no-such-reward", "--out", "{root}/onnx"],
        "export/non-empty-out": ["export", "onnx", "{rm}", "--out", "{root}/notempty"],
        "plugins/unknown-option": ["plugins", "--bogus"],
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, files, capsys):
    argv = [a.format(**files) for a in CASES[name]]
    code, out, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}; stderr: {err}"
    assert "Traceback" not in err and "Traceback" not in out
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in err


def test_existing_output_is_left_intact(files, capsys):
    run(["train", str(files["root"] / "train.yaml"), "-o", str(files["root"] / "notempty")], capsys)
    assert (files["root"] / "notempty" / "precious.txt").read_text(encoding="utf-8") == "keep me"


def test_large_k_warning_is_one_line(files, capsys, monkeypatch):
    import sys
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):  # Python's default, undoing pytest's capture
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "showwarning", show)
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # as a user's interpreter has it (the suite turns warnings into errors)
        code, _, err = run(["generate", "hi", "--lm", files["lm"], "--reward", f"{files['rm']}=1", "-k", "250",
                            "-t", "1"], capsys)
    assert code == 0
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "250" in warning[0] and "token-level" in warning[0], err


def test_help_shows_defaults_and_plain_flags(capsys, monkeypatch):
    import typer.rich_utils

    # one option per line, so that no default is wrapped inside a box: rich reads $COLUMNS when typer builds the
    # help console, but typer read $TERMINAL_WIDTH (which wins) once, at import, so set its copy too
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 250)
    code, out, _ = run(["generate", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for default in ("[default: smollm2-135m-instruct]", "[default: 20]", "[default: 1]", "[default: 1.0]"):
        assert default in text, default
    greedy = next(line for line in out.splitlines() if "--greedy" in line)
    assert "<bool>" not in greedy


def test_a_bug_is_reported_as_internal_error_with_exit_1(monkeypatch, capsys):
    """An unexpected exception is not dressed up as a user error: exit 1, one line, and how to get the trace."""
    import steerkit.cli.generate as cli

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "read_prompts_file", broken)
    code, _, err = run(["generate", "--prompts-file", "x.txt"], capsys)
    assert code == 1 and err.startswith("error: internal error (ZeroDivisionError: boom)")
    assert "STEERKIT_DEBUG=1" in err and len(err.strip().splitlines()) == 1


def test_score_table_prints_the_text_as_given(files, capsys, monkeypatch):
    """Scored text that looks like Rich markup (a pip extra, a style tag) is printed as it is, not styled away."""
    monkeypatch.setenv("COLUMNS", "200")
    text = 'pip install "steerkit-rad[ray]" and [bold]this[/bold]'
    code, out, _ = run(["score", "--reward", files["rm"], text], capsys)
    assert code == 0
    assert text in out

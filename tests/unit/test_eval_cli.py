"""``steerkit eval``: flags and config files are equivalent; an end-to-end run on tiny saved models."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from steerkit.cli import app
from steerkit.errors import ConfigError
from steerkit.cli.evaluate import build_config
from steerkit.evaluation.config import EvalConfig
from steerkit.models import resolve
from steerkit.rewards.model import RewardModel
from tiny import tiny_lm

FLAGS = dict(prompts=[], field=None, limit=None, offset=None, lm=None, reward=None, direction=None, betas=[], ks=[],
             num_continuations=None, max_new_tokens=None, temperature=None, seed=None, batch_size=None, backend=None,
             scorers=[], eval_lm=None, output=None, threads=None)


def flags(**kw):
    return {**FLAGS, **kw}


def test_defaults_follow_the_paper_and_the_task():
    cfg = build_config("toxicity", None, **flags(prompts=["p.jsonl"]))
    assert (cfg.num_continuations, cfg.max_new_tokens, cfg.ks, cfg.betas) == (25, 20, [20], [10, 20, 50, 100])
    assert cfg.reward == "toxicity" and cfg.direction == "decrease"
    assert cfg.scorers == ["tox-block", "alt-profanity-check"] and cfg.eval_lm == "gemma3-270m"
    assert [s.name for s in cfg.grid()] == ["unsteered-k20", "k20-beta10", "k20-beta20", "k20-beta50", "k20-beta100"]
    assert cfg.grid()[1].rewards[0].beta == -10
    sent = build_config("sentiment", None, **flags(prompts=["neg=a.jsonl", "neutral=b.jsonl"]))
    assert sent.direction == "increase" and sent.grid()[1].rewards[0].beta == 10
    assert [p.name for p in sent.prompts] == ["neg", "neutral"] and sent.scorers == ["vader", "textblob"]


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_config_file_is_equivalent_to_flags(tmp_path, suffix):
    data = {"task": "sentiment", "lm": "some-lm", "reward": "rm-dir", "betas": [5.0, 15.0], "ks": [10, 30],
            "num_continuations": 4, "max_new_tokens": 7, "seed": 3, "scorers": ["vader"], "eval_lm": "eval-lm",
            "output": "out", "prompts": [{"name": "neg", "path": "neg.jsonl", "field": "prompt.text", "limit": 9}]}
    path = tmp_path / f"eval{suffix}"
    if suffix == ".yaml":
        import yaml

        path.write_text(yaml.safe_dump(data))
    elif suffix == ".toml":
        lines = [f'{k} = {json.dumps(v)}' for k, v in data.items() if k != "prompts"]
        lines += ["[[prompts]]", 'name = "neg"', 'path = "neg.jsonl"', 'field = "prompt.text"', "limit = 9"]
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(json.dumps(data))
    from_file = build_config("sentiment", path, **flags())
    from_flags = build_config("sentiment", None, **flags(
        prompts=[f"neg={tmp_path / 'neg.jsonl'}"], limit=9, lm="some-lm", reward="rm-dir", betas=[5, 15], ks=[10, 30],
        num_continuations=4, max_new_tokens=7, seed=3, scorers=["vader"], eval_lm="eval-lm",
        output=str(tmp_path / "out")))
    assert from_file == from_flags  # relative paths in a file are relative to the file
    # flags override the file
    assert build_config("sentiment", path, **flags(limit=2, betas=[1])).prompts[0].limit == 2


def test_invalid_config_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("task: toxicity\nbetas: [10, -5]\nnum_continuations: 0\nwhat: 1\n")
    with pytest.raises(ConfigError) as info:
        EvalConfig.from_file(path)
    msg = str(info.value)
    assert "betas" in msg and "num_continuations" in msg and "what" in msg
    with pytest.raises(ConfigError, match="No prompts"):
        EvalConfig(task="toxicity").require_prompts()
    with pytest.raises(ConfigError, match="unique"):
        EvalConfig.from_dict({"prompts": [{"path": "a.jsonl"}], "settings": [{"name": "k20-beta10", "k": 5}]})


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("models")
    lm_dir = root / "lm"
    tiny_lm(tokenizer, seed=3).save_pretrained(lm_dir)
    tokenizer.save_pretrained(lm_dir)
    rm = RewardModel.from_causal_lm(tiny_lm(tokenizer, seed=4), tokenizer, reference=str(lm_dir),
                                    fingerprint=resolve(str(lm_dir)).fingerprint, name="tinyrm")
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    rm_dir = rm.save_pretrained(root / "rm")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"meta": {"text": t}}) + "\n" for t in ["The quick", "I love", "This is"]))
    return lm_dir, rm_dir, prompts


def test_cli_end_to_end_resume_and_report(tmp_path, saved_models):
    lm_dir, rm_dir, prompts = saved_models
    out = tmp_path / "run"
    args = ["eval", "toxicity", "--prompts", f"tiny={prompts}", "--field", "meta.text", "--lm", str(lm_dir),
            "--reward", str(rm_dir), "--beta", "5", "--beta", "50", "-n", "2", "-t", "3",
            "--scorer", f"reward:{rm_dir}", "--eval-lm", str(lm_dir), "-o", str(out), "--threads", "1", "-q",
            "--no-compile"]
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert json.loads((out / "config.json").read_text())["compile"] is False
    for name in ("generations.jsonl", "scores.jsonl", "fluency.jsonl", "metrics.json", "report.md", "config.json"):
        assert (out / name).exists(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["setting"] for r in metrics["results"]] == ["unsteered-k20", "k20-beta5", "k20-beta50"]
    assert all(r["num_prompts"] == 3 and f"reward:{rm_dir}" in r["scorers"] for r in metrics["results"])
    n_lines = len((out / "generations.jsonl").read_text().splitlines())
    assert n_lines == 9
    again = runner.invoke(app, args, env={"COLUMNS": "40"})  # narrow: the note must still be one whole line
    assert again.exit_code == 0, again.output + repr(again.exception)
    assert any(line.startswith("resuming ") and str(out) in line
               and line.endswith(": 9 of 9 prompt×setting units already done") for line in again.output.splitlines()), \
        again.output
    assert len((out / "generations.jsonl").read_text().splitlines()) == 9
    (out / "report.md").unlink()
    rebuilt = runner.invoke(app, ["eval", "report", str(out), "--no-plots"])
    assert rebuilt.exit_code == 0, rebuilt.output + repr(rebuilt.exception)
    assert "Avg Max Toxicity" in (out / "report.md").read_text()
    # a run directory is self-contained: on another machine, without the prompt file, it still rebuilds
    before = json.loads((out / "metrics.json").read_text())["results"]
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    hidden = prompts.rename(tmp_path / "hidden.jsonl")
    try:
        rebuilt = runner.invoke(app, ["eval", "report", str(moved), "--no-plots"])
    finally:
        hidden.rename(prompts)  # the module's other tests use the same prompt file
    assert rebuilt.exit_code == 0, rebuilt.output + repr(rebuilt.exception)
    after = json.loads((moved / "metrics.json").read_text())["results"]
    assert [(r["setting"], r["num_prompts"], r["scorers"]) for r in after] == \
        [(r["setting"], r["num_prompts"], r["scorers"]) for r in before]


def test_cli_estimate_does_not_write_generations(tmp_path, saved_models):
    lm_dir, rm_dir, prompts = saved_models
    out = tmp_path / "est"
    result = CliRunner().invoke(app, ["eval", "sentiment", "-p", str(prompts), "--field", "meta.text", "--lm",
                                      str(lm_dir), "-r", str(rm_dir), "-b", "5", "-n", "2", "-t", "3", "--eval-lm",
                                      str(lm_dir), "-o", str(out), "--estimate", "--threads", "1"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    est = json.loads(result.stdout[result.stdout.index("{"):])
    assert est["prompts"] == 3 and est["settings"] == 2 and est["total_seconds"] > 0
    assert not (out / "generations.jsonl").exists() or not (out / "generations.jsonl").read_text()


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from steerkit.cli import main; main()", "eval", "toxicity", "-o",
                           str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "No prompts" in proc.stderr and "Traceback" not in proc.stderr


def test_scorers_command_lists_builtins():
    result = CliRunner().invoke(app, ["eval", "scorers", "--json"])
    names = {e["name"] for e in json.loads(result.stdout)}
    assert {"tox-block", "alt-profanity-check", "vader", "textblob", "hf-classifier", "perspective"} <= names


def test_ctrl_c_reports_how_to_resume(tmp_path, saved_models, monkeypatch):
    from steerkit.evaluation import runner as runner_module

    lm_dir, rm_dir, prompts = saved_models

    def interrupted(self, stages):
        self.generate(limit=2)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_module.EvalRunner, "run", interrupted)
    result = CliRunner().invoke(app, ["eval", "toxicity", "-p", str(prompts), "--field", "meta.text", "--lm",
                                      str(lm_dir), "-r", str(rm_dir), "-b", "5", "-n", "2", "-t", "3",
                                      "--no-fluency", "-o", str(tmp_path / "run"), "-q", "--threads", "1"])
    assert result.exit_code == 130
    text = " ".join(result.output.split())
    assert "2 of 6" in text and "rerun the same command to resume" in text


def test_plots_of_a_scorer_with_a_long_reward_path_get_valid_file_names(tmp_path, saved_models):
    """A scorer named by a reward directory's path goes into the plots' file names: a path longer than a file name
    may be (255 bytes) still gives plots, each named within the limit (it ended in an OSError before)."""
    lm_dir, rm_dir, prompts = saved_models
    deep = tmp_path.joinpath(*[f"{c * 60}" for c in "defg"]) / "rm"
    shutil.copytree(rm_dir, deep)
    assert len(f"reward:{deep}".encode()) > 255
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["eval", "toxicity", "--prompts", f"tiny={prompts}", "--field", "meta.text",
                                      "--lm", str(lm_dir), "--reward", str(rm_dir), "--beta", "5", "-n", "1", "-t",
                                      "2", "--scorer", f"reward:{deep}", "--eval-lm", str(lm_dir), "-o", str(out),
                                      "--threads", "1", "-q", "--no-compile"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert any(name.startswith("toxicity_vs_perplexity_tiny_reward_") and name.endswith(".png") for name in plots)
    assert all(len(name.encode()) <= 255 for name in plots), plots


@pytest.mark.parametrize("where", ["prompts", "settings"])
def test_names_that_become_file_names_are_bounded(where):
    def config(name: str) -> dict:
        data = {"task": "toxicity", "prompts": [{"path": "p.jsonl", "name": "p"}], "lm": "x", "reward": "r"}
        if where == "prompts":
            data["prompts"][0]["name"] = name
        else:
            data["settings"] = [{"name": name, "k": 20}]
        return data

    with pytest.raises(ConfigError, match="at most 100 characters"):
        EvalConfig.from_dict(config("n" * 101))
    EvalConfig.from_dict(config("n" * 100))

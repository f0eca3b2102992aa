"""SteeringConfig files (YAML / TOML): composition of several rewards, and errors that name the field."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from tiny import make_tokenizer, tiny_lm

from steerkit.cli import app
from steerkit.config import SteeringConfig
from steerkit.errors import ConfigError
from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.model import RewardModel
from steerkit.steering import BetaSchedule


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A tiny LM directory, a reward model on the same tokenizer and one on another tokenizer family."""
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for kind, seed in (("bpe", 21), ("metaspace", 22)):
        tok = make_tokenizer(kind=kind)
        lm = tiny_lm(tok, seed=seed)
        lm.save_pretrained(root / f"lm-{kind}")
        tok.save_pretrained(root / f"lm-{kind}")
        rm = RewardModel.from_backbone(str(root / f"lm-{kind}"), 1, name=f"rm-{kind}")
        torch.nn.init.normal_(rm.head.weight, std=0.5)
        dirs[kind] = rm.save_pretrained(root / f"rm-{kind}")
    dirs["lm"] = root / "lm-bpe"
    return dirs


def write(path, text):
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_yaml_config_with_two_rewards_builds_terms(tmp_path, model_dirs):
    cfg = SteeringConfig.from_file(write(tmp_path / "steer.yaml", f"""
        lm: {model_dirs['lm']}
        k: 7
        rewards:
          - name: {model_dirs['bpe']}
            label: same
            beta: -3
            transform: clamp
            clamp: [0.1, 0.6]
            schedule: linear
            beta_start: 0
            ramp_steps: 3
          - name: {model_dirs['metaspace']}
            label: bridged
            beta: 2.5
            transform: invert
            context: full
        """))
    same, bridged = cfg.build_terms()
    assert (same.name, bridged.name) == ("same", "bridged")
    assert same.schedule == BetaSchedule(-3.0, "linear", 0.0, 3)
    assert [same.weight(t) for t in range(4)] == [0.0, -1.0, -2.0, -3.0]
    assert bridged.weight(0) == bridged.weight(50) == 2.5
    rho = torch.tensor([0.0, 0.5, 0.9])
    assert torch.allclose(same.transform(rho), torch.tensor([0.1, 0.5, 0.6]))
    assert torch.allclose(bridged.transform(rho), torch.tensor([1.0, 0.5, 0.1]))
    assert bridged.reward.context == "full"
    assert isinstance(bridged.reward.start(["x"], make_tokenizer(kind="bpe")), BridgedSession)


def test_toml_config_is_equivalent(tmp_path, model_dirs):
    toml = SteeringConfig.from_file(write(tmp_path / "steer.toml", f"""
        lm = "{model_dirs['lm']}"
        k = 5
        prompts = ["Hello"]
        [[rewards]]
        name = "{model_dirs['bpe']}"
        beta = -2.0
        """))
    yaml = SteeringConfig.from_file(write(tmp_path / "steer.yaml", f"""
        lm: {model_dirs['lm']}
        k: 5
        prompts: [Hello]
        rewards: [{{name: {model_dirs['bpe']}, beta: -2}}]
        """))
    assert toml == yaml


@pytest.mark.parametrize("body,where,what", [
    ("temprature: 0.7\n", "temprature", "Extra inputs are not permitted"),
    ("rewards:\n  - {name: a, beta: 1}\n  - {name: b, bta: 2}\n", "rewards.1.bta", "Extra inputs are not permitted"),
    ("rewards:\n  - {name: a, beta: 1}\n  - {name: b}\n", "rewards.1.beta", "Field required"),
    ("rewards:\n  - {name: a, beta: .nan}\n", "rewards.0.beta", "finite"),
    ("rewards:\n  - {name: a, beta: strong}\n", "rewards.0.beta", "valid number"),
    ("rewards:\n  - {name: a, beta: 1, transform: square}\n", "rewards.0.transform", "'none', 'invert' or 'clamp'"),
    ("rewards:\n  - {name: a, beta: 1, clamp: [0.8, 0.2]}\n", "rewards.0", "clamp must satisfy"),
    ("rewards:\n  - {name: a, beta: 1, schedule: linear, ramp_steps: 0}\n", "rewards.0.ramp_steps", "greater than or equal to 1"),
    ("k: 0\n", "k", "greater than or equal to 1"),
    ("temperature: -1\n", "temperature", "greater than 0"),
    ("backend: tensorflow\n", "backend", "'torch', 'onnx', 'torch-bf16', 'torch-bf16-compute', 'torch-int8', 'onnx-int8', 'llama.cpp' or 'llama.cpp-q8'"),
])
def test_bad_config_names_the_field(tmp_path, body, where, what):
    path = write(tmp_path / "bad.yaml", body)
    with pytest.raises(ConfigError) as info:
        SteeringConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"\n  {where}: " in message and what in message, message


def test_a_check_across_fields_names_them_without_echoing_the_whole_config(tmp_path):
    path = write(tmp_path / "bad.yaml", "engine: llama.cpp\ncompile: true\nprompts: [hello]\n")
    with pytest.raises(ConfigError) as info:
        SteeringConfig.from_file(path)
    message = str(info.value)
    assert "\n  (top level): compile and dtype apply to engine='steerkit'" in message, message
    assert "(got" not in message and "hello" not in message, message


def test_unparsable_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="could not be parsed"):
        SteeringConfig.from_file(write(tmp_path / "x.toml", "k = = 3\n"))
    with pytest.raises(ConfigError, match="mapping at the top level"):
        SteeringConfig.from_file(write(tmp_path / "x.yaml", "- a\n- b\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        SteeringConfig.from_file(tmp_path / "missing.yaml")


def test_cli_generate_with_config_file(tmp_path, model_dirs):
    path = write(tmp_path / "steer.yaml", f"""
        lm: {model_dirs['lm']}
        k: 5
        max_new_tokens: 6
        seed: 1
        prompts: ["Café 12", "The movie"]
        rewards:
          - {{name: {model_dirs['bpe']}, label: same, beta: -3, schedule: linear, ramp_steps: 4}}
          - {{name: {model_dirs['metaspace']}, label: bridged, beta: 2, transform: invert}}
        """)
    result = CliRunner().invoke(app, ["generate", "--config", str(path), "--json", "--traces"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert [r["label"] for r in payload["rewards"]] == ["same", "bridged"]
    assert [g["prompt"] for g in payload["generations"]] == ["Café 12", "The movie"]
    steps = payload["traces"][0]
    assert [s["betas"]["same"] for s in steps[:4]] == [0.0, -0.75, -1.5, -2.25]
    assert all(len(s["rewards"]["bridged"][0]) == 5 for s in steps)
    # command-line flags override the file, and are validated with the same field paths
    result = CliRunner().invoke(app, ["generate", "--config", str(path), "--k", "3", "--json"])
    assert json.loads(result.output.strip().splitlines()[-1])["k"] == 3
    result = CliRunner().invoke(app, ["generate", "--config", str(path), "--k", "0"])
    assert isinstance(result.exception, ConfigError) and "\n  k: " in str(result.exception)


def test_cli_reports_config_errors_without_traceback(tmp_path):
    import subprocess
    import sys

    path = write(tmp_path / "bad.yaml", "rewards:\n  - {name: toxicity, beta: 1, bta: 2}\n")
    proc = subprocess.run([sys.executable, "-m", "steerkit.cli", "generate", "--config", str(path), "hi"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "rewards.0.bta" in proc.stderr and "Traceback" not in proc.stderr

"""`steerkit import rad`: the CLI converts a RAD checkpoint; bad layouts are one error line, exit 2."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from steerkit.cli import app
from steerkit.rewards.model import RewardModel
from test_rad_import import RadRewardModel, assert_same_rewards, tiny_gpt2


def test_import_rad_command_writes_a_clamp_reward_model(tokenizer, tmp_path):
    backbone = tmp_path / "gpt2"
    tiny_gpt2(tokenizer, seed=2).save_pretrained(backbone)
    tokenizer.save_pretrained(backbone)
    rad = RadRewardModel(tokenizer)
    torch.save(rad.state_dict(), tmp_path / "pytorch_model.bin")
    runner = CliRunner()
    result = runner.invoke(app, ["import", "rad", str(tmp_path / "pytorch_model.bin"), "--backbone", str(backbone),
                                 "--out", str(tmp_path / "rm"), "--name", "rad-cli", "--json"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["output_function"] == "clamp" and config["name"] == "rad-cli"
    assert config["start_token_id"] is None  # RAD reads a text's own ids
    assert_same_rewards(rad, RewardModel.from_pretrained(tmp_path / "rm"), tokenizer)


def test_import_rad_command_refuses_a_bad_layout_in_one_line(tokenizer, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    torch.save({"weight": torch.zeros(2)}, tmp_path / "bad.pt")
    result = subprocess.run([sys.executable, "-c", "from steerkit.cli import main; main()", "import", "rad",
                             str(tmp_path / "bad.pt"), "--backbone", str(tmp_path), "--out", str(tmp_path / "rm")],
                            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": ""})
    assert result.returncode == 2 and result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    assert "head" in result.stderr and not (tmp_path / "rm").exists()

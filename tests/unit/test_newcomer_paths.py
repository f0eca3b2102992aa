"""Issue 27: what a newcomer training and packaging a reward model reads must be true."""

import re

import pytest
from typer.testing import CliRunner

from steerkit.cli import app
from steerkit.errors import PluginError
from steerkit.registry import get_registry


def _help(command: list[str]) -> str:
    result = CliRunner().invoke(app, command, env={"COLUMNS": "200", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return re.sub(r"\s+", " ", result.output)


def test_train_flags_the_docs_name_exist_and_label_shows_its_default():
    text = _help(["train", "--help"])
    for flag in ("--num-layers", "--layers", "--lora-r", "--lora-alpha", "--dev-fraction", "--label"):
        assert flag in text, flag
    assert "[default: label]" in text


def test_lora_alpha_and_dev_fraction_flags_reach_the_config(tmp_path):
    from steerkit.cli.train import _config_from_options

    overrides = {"data": [{"path": str(tmp_path / "d.jsonl"), "label": "label"}], "output_dir": str(tmp_path / "o"),
                 "dev_fraction": 0.2, "num_layers": 2}
    cfg = _config_from_options(None, overrides, {"r": None, "alpha": 8})  # r keeps its default (8)
    assert cfg.lora.alpha == 8 and cfg.lora.r == 8 and cfg.dev_fraction == 0.2 and cfg.num_layers == 2


def test_docs_list_exactly_the_train_flags():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    section = docs[docs.index("**Which fields are flags.**"):docs.index("## Recipes that generalise")]
    text = _help(["train", "--help"])
    for flag in re.findall(r"`(--[a-z-]+)`", section):
        assert flag in text, f"docs/training.md names {flag}, which `steerkit train` does not have"


def test_an_unknown_reward_does_not_point_at_a_checkout_path():
    with pytest.raises(PluginError) as info:
        get_registry().get("reward", "no-such-reward-anywhere")
    assert "./plugins" not in str(info.value) and "steerkit setup" in str(info.value)


def test_the_card_limitations_are_not_written_for_toxicity_only():
    from steerkit.training.card import GENERIC_LIMITATIONS

    assert not any("harm" in line for line in GENERIC_LIMITATIONS)

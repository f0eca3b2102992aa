"""Every command's ``--backend`` help is one text (``cli.common.BACKEND_HELP``) and names every built-in backend."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from steerkit.cli import app
from steerkit.cli.common import BACKEND_HELP
from steerkit.rewards.backends import backend_names


def test_the_backend_help_names_every_builtin_backend():
    named = set(re.findall(r"[\w.\-]+", BACKEND_HELP))
    missing = [name for name in backend_names() if name not in named]
    assert not missing, f"BACKEND_HELP does not name {missing}"


def test_every_command_with_backend_shows_that_help():
    runner = CliRunner()
    for command in (["generate"], ["serve"], ["score"], ["calibrate"], ["eval", "toxicity"]):
        out = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400", "TERM": "dumb", "NO_COLOR": "1"})
        assert out.exit_code == 0, out.output
        text = " ".join(out.output.split())
        assert "onnx-int8" in text and "llama.cpp-q8" in text, (command, text[:300])

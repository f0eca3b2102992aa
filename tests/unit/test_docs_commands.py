"""The documentation's examples as a user copies them (in the manner of datasette's docs tests).

* Every ``steerkit ...`` command in a shell block of the README, ``docs/`` and the plugins' READMEs names a command
  that exists and only options that command has, so a renamed or removed flag fails here, not in a user's terminal.
* Every Python block parses (an excerpt marked as a snippet of a source file is checked against that file by
  test_plugin_docs.py; here it only has to be Python).
* Every YAML block is a valid config of its kind, through the same validation a config file gets: the README's
  steering config, the training configs (a block that shows a few fields is checked inside docs/training.md's
  whole example), and the Ray Serve replicas section. A documented key that was renamed fails here.
* No line is an unfilled template marker (a bare ``WORD_LIKE_THIS`` line, as a README once shipped).
"""

from __future__ import annotations

import ast
import re
import shlex
import textwrap
from pathlib import Path

import pytest
import typer
import yaml
from docs_support import blocks, commands

from steerkit.cli.app import build_app
from steerkit.config import SteeringConfig
from steerkit.distributed.serve import ReplicaConfig
from steerkit.errors import ConfigError
from steerkit.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("plugins/*/README.md"))]
SHELL = {"bash", "sh", "shell", "console", "text", ""}
MARKER = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def problems_of(command, text: str) -> list[str]:
    """What is wrong with one documented command line against the click command tree ``command``."""
    words = shlex.split(text, comments=True)
    redirect = next((i for i, w in enumerate(words) if w[:1] in "<>" or w.startswith("2>")), len(words))
    words, path, node = words[1:redirect], ["steerkit"], command
    while hasattr(node, "list_commands") and words and not words[0].startswith("-"):
        sub = node.get_command(None, words[0])
        if sub is None:
            return [f"`{' '.join(path)}` has no command {words[0]!r}"]
        node, path, words = sub, [*path, words.pop(0)], words
    options = {"--help"}
    for param in node.params:
        options.update(param.opts)
        options.update(param.secondary_opts)
    return [f"`{' '.join(path)}` has no option {word.split('=', 1)[0]}" for word in words
            if re.match(r"^--?[A-Za-z]", word) and word.split("=", 1)[0] not in options]


@pytest.fixture(scope="module")
def cli():
    return typer.main.get_command(build_app(plugins=True))


def documented_commands():
    for path in DOCS:
        for language, start, lines in blocks(path.read_text(encoding="utf-8")):
            if language in SHELL:
                for offset, text in commands(lines):
                    yield f"{path.relative_to(ROOT)}:{start + offset}", text


def test_the_checks_see_a_wrong_command_and_a_wrong_option(cli):
    assert problems_of(cli, "steerkit generate 'hi' --reward toxicity=-5 -k 20 --seed 0") == []
    assert problems_of(cli, "steerkit export onnx toxicity --out dir > log.txt") == []
    assert problems_of(cli, "steerkit generate 'hi' --rewards toxicity=-5") == ["`steerkit generate` has no option "
                                                                               "--rewards"]
    assert problems_of(cli, "steerkit export tflite toxicity") == ["`steerkit export` has no command 'tflite'"]
    found = commands(["pip install x && steerkit score \\", "    --reward toxicity 'a b'  # a comment",
                      "$ steerkit plugins --json | jq ."])
    assert [(offset, shlex.split(text, comments=True)) for offset, text in found] == [
        (0, ["steerkit", "score", "--reward", "toxicity", "a b"]), (2, ["steerkit", "plugins", "--json"])]
    assert MARKER.match("SIZE_LINE") and not MARKER.match("RAD") and not MARKER.match("Size_line")


def test_every_documented_command_and_option_exists(cli):
    seen = list(documented_commands())
    assert len(seen) > 50, "the docs' shell blocks were not read"
    wrong = [f"{where}: {problem}: {text}" for where, text in seen for problem in problems_of(cli, text)]
    assert not wrong, "\n".join(wrong)


def test_every_python_block_parses():
    wrong, seen = [], 0
    for path in DOCS:
        for language, start, lines in blocks(path.read_text(encoding="utf-8")):
            if language == "python":
                seen += 1
                try:
                    ast.parse(textwrap.dedent("\n".join(lines)))
                except SyntaxError as exc:
                    wrong.append(f"{path.relative_to(ROOT)}:{start + (exc.lineno or 1) - 1}: {exc.msg}")
    assert seen > 10
    assert not wrong, "\n".join(wrong)


def test_no_unfilled_template_marker():
    wrong = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in [*DOCS, *ROOT.glob("model_cards/*.md")]
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if MARKER.match(line.strip())]
    assert not wrong, "fill in or remove:\n" + "\n".join(wrong)


def yaml_blocks(name: str) -> list[tuple[str, dict]]:
    path = ROOT / name
    return [(f"{name}:{start}", yaml.safe_load("\n".join(lines)))
            for language, start, lines in blocks(path.read_text(encoding="utf-8")) if language == "yaml"]


#: The documents with YAML blocks, and the config their blocks belong to.
YAML_CONFIGS = {"README.md": SteeringConfig, "docs/training.md": TrainConfig, "docs/token_rewards.md": TrainConfig,
                "docs/scaling.md": ReplicaConfig}


def validate(where: str, data: dict, config, training_example: dict) -> None:
    """One documented YAML block through the validation of the ``config`` it belongs to: a training block inside
    docs/training.md's whole example, a Ray Serve block as ``ReplicaConfig.from_file`` reads its section."""
    if config is TrainConfig:
        data = {**training_example, **data}
    elif config is ReplicaConfig:
        data = data.get("ray_serve", data)
    config.from_dict(data, source=where)


def test_every_yaml_block_is_a_valid_config():
    example = yaml_blocks("docs/training.md")[0][1]
    assert {"name", "backbone", "data"} <= set(example), "docs/training.md's first YAML block is not a whole config"
    seen = [(where, data, config) for name, config in YAML_CONFIGS.items() for where, data in yaml_blocks(name)]
    assert len(seen) >= 6
    for where, data, config in seen:
        validate(where, data, config, example)
    documented = {str(p.relative_to(ROOT)) for p in DOCS for language, _, _ in blocks(p.read_text(encoding="utf-8"))
                  if language == "yaml"}
    assert documented <= set(YAML_CONFIGS), f"a new document has YAML blocks: add it to YAML_CONFIGS ({documented})"


def test_the_yaml_check_sees_a_renamed_key():
    example = yaml_blocks("docs/training.md")[0][1]
    with pytest.raises(ConfigError, match="num_layer"):
        validate("docs/x.md:1", {"num_layer": 4}, TrainConfig, example)
    with pytest.raises(ConfigError, match="beta"):
        validate("README.md:1", {"lm": "x", "rewards": [{"name": "toxicity", "weight": -5}]}, SteeringConfig, example)
    with pytest.raises(ConfigError, match="replica"):
        validate("docs/x.md:1", {"ray_serve": {"replica": 2}}, ReplicaConfig, example)

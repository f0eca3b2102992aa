"""The documentation's examples as a user copies them (in the manner of datasette's docs tests).

* Every ``steerkit ...`` command in a shell block of the README, ``docs/`` and the plugins' READMEs names a command
  that exists and only options that command has, so a renamed or removed flag fails here, not in a user's terminal.
* Every Python block parses (an excerpt marked as a snippet of a source file is checked against that file by
  test_plugin_docs.py; here it only has to be Python).
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
from docs_support import blocks, commands

from steerkit.cli.app import build_app

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

"""Reading the documentation's fenced code blocks: tests/unit/test_docs_commands.py and
tests/integration/test_readme_examples.py."""

from __future__ import annotations

import re

FENCE = re.compile(r"^\s*```(\w*)\s*$")


def blocks(text: str):
    """(language, first line number, lines) of each fenced code block."""
    language, lines, start = None, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence and language is None:
            language, lines, start = fence.group(1), [], number + 1
        elif fence and not fence.group(1):
            yield language, start, lines
            language = None
        elif language is not None:
            lines.append(line)


def commands(lines: list[str]):
    """(offset, text) of each ``steerkit`` command in a shell block: continuation lines joined, a ``$ `` prompt
    dropped, pipelines and ``&&`` lists split."""
    joined, current, first = [], "", None
    for offset, line in enumerate(lines):
        first = offset if first is None else first
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append((first, current + line))
        current, first = "", None
    for offset, line in joined:
        line = line.strip().removeprefix("$ ")
        for part in re.split(r"&&|\|\||;|\|", line):
            if part.strip().startswith("steerkit "):
                yield offset, part.strip()

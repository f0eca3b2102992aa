"""docs/plugins.md stays in step with the code (the datasette rule): every hookspec has a documented section,
every documented hook exists, and every snippet marked with its source file is copied verbatim from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from steerkit import registry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins.md"


def hookspecs() -> list[str]:
    return sorted(name for name in dir(registry.HookSpecs)
                  if getattr(getattr(registry.HookSpecs, name), f"{registry.GROUP}_spec", None) is not None)


def reference_sections() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    reference = text.split("\n## Hook reference\n", 1)[1]
    parts = re.split(r"^### (\w+)\((.*?)\)\s*$", reference, flags=re.M)
    return {parts[i]: parts[i + 2] for i in range(1, len(parts), 3)}


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].replace("``", "`").split())


def test_hookspecs_exist_and_have_docstrings():
    names = hookspecs()
    assert {"register_reward_models", "register_scorers", "register_commands"} <= set(names)
    for name in names:
        doc = getattr(registry.HookSpecs, name).__doc__ or ""
        assert len(doc.split()) > 20, f"hookspec {name} needs a docstring: it is the reference documentation"
    for name in ("register_reward_models", "register_scorers"):
        assert "register(name, factory" in getattr(registry.HookSpecs, name).__doc__, name


@pytest.mark.parametrize("name", hookspecs())
def test_every_hookspec_has_a_section(name):
    sections = reference_sections()
    assert name in sections, f"docs/plugins.md lacks a '### {name}(...)' section under '## Hook reference'"
    doc = getattr(registry.HookSpecs, name).__doc__
    assert first_paragraph(doc) in " ".join(sections[name].split()), (name, first_paragraph(doc))


def test_no_section_documents_a_hook_that_does_not_exist():
    assert sorted(reference_sections()) == hookspecs()


def test_snippets_are_copied_from_the_example_package():
    text = DOC.read_text(encoding="utf-8")
    snippets = re.findall(r"<!-- snippet: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S)
    assert len(snippets) >= 4
    for path, code in snippets:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert code in source, f"docs/plugins.md snippet from {path} differs from the file:\n{code}"

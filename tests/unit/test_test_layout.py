"""The test tree has no packages (no ``__init__.py``), so pytest imports each test file by its basename: two files
with one name in different folders stop the whole collection ("import file mismatch")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], [n for n, c in names.items() if c > 1]

"""Append-only JSONL result files that survive interruption.

Each finished unit of work (one prompt under one setting) is one line, written and fsynced before the
next unit starts. A run killed mid-write leaves at most one partial last line, which :class:`JsonlStore`
drops (truncating the file back to the last complete line) when it is reopened; every complete line is
kept and its key marked done, so a resumed run redoes nothing and loses nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Hashable, Iterator

from ..errors import DataError


class JsonlStore:
    def __init__(self, path: str | os.PathLike, key: Callable[[dict], Hashable]):
        self.path = Path(path)
        self.key = key
        self.records: dict[Hashable, dict] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._recover()

    def _recover(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1  # bytes up to and including the last newline
        if good < len(data):  # a partial last line from an interrupted write
            with self.path.open("r+b") as fh:
                fh.truncate(good)
        # split on "\n" only: str.splitlines() would also split inside strings at U+2028, U+0085, \x0c…,
        # which json.dumps(ensure_ascii=False) writes raw and generated text does contain
        for lineno, raw in enumerate(data[:good].split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{self.path}:{lineno} is not valid JSON ({getattr(exc, 'msg', exc)}); the file was edited or "
                                "corrupted. Delete that line (or the file) to redo those results.") from None
            self.records[self.key(record)] = record  # a duplicate key keeps the last line

    def __contains__(self, key: Hashable) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.records.values())

    def get(self, key: Hashable) -> dict | None:
        return self.records.get(key)

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self.records[self.key(record)] = record

    def extend(self, records: list[dict]) -> None:
        if not records:
            return
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            fh.flush()
            os.fsync(fh.fileno())
        for r in records:
            self.records[self.key(r)] = r

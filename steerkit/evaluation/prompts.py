"""Prompt files: JSONL records with the prompt text at a dotted field (``prompt.text``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..seeds import keyed_seed


@dataclass(frozen=True)
class Prompt:
    index: int  # 0-based record number in the file (blank lines not counted)
    text: str


def get_field(record, dotted: str, where: str):
    value = record
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            keys = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise DataError(f"{where}: no field {dotted!r} (stopped at {part!r}; available: {keys}). "
                            "Pass --field with the dotted path to the prompt text.")
    return value


def load_prompts(path: str | Path, field: str = "prompt.text", limit: int | None = None, offset: int = 0) -> list[Prompt]:
    """Read prompts ``offset .. offset+limit`` of a JSONL file (plain ``.txt``: one prompt per line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Prompt file {path} does not exist.")
    prompts: list[Prompt] = []
    index = 0
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if index < offset:
                index += 1
                continue
            if limit is not None and len(prompts) >= limit:
                break
            where = f"{path}:{lineno}"
            if path.suffix == ".txt":
                text = line.rstrip("\n")
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{where}: not valid JSON ({exc.msg}).") from None
                text = get_field(record, field, where)
            if not isinstance(text, str) or not text:
                raise DataError(f"{where}: field {field!r} is {text!r}; prompts must be non-empty strings.")
            prompts.append(Prompt(index, text))
            index += 1
    if not prompts:
        raise DataError(f"{path} has no prompts in the requested range (offset {offset}, limit {limit}).")
    return prompts


def unit_seed(seed: int, prompt_set: str, index: int) -> int:
    """The sampling seed of one prompt: a function of (seed, prompt set, prompt index) only, so a resumed run
    produces exactly what an uninterrupted one would, and all settings share random numbers per prompt."""
    return keyed_seed(seed, prompt_set, index)

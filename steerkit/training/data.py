"""Training data: read CSV / TSV / JSONL / plain-text files into (text, label) examples.

Every problem a user can cause raises :class:`~steerkit.errors.DataError` naming the file, the line and
what is wrong (missing column, non-UTF-8 bytes, empty file, a label that is not a number, NaN, or out of
[0, 1] after the transform, an empty text). All files are read and validated before training starts, so
a bad row never interrupts a run half way.

Labels are turned into ρ targets in [0, 1] by each source's :class:`~steerkit.training.sources.LabelTransform`
(:mod:`steerkit.training.sources` holds the source config). Several sources are mixed with weights
(:func:`epoch_indices`), de-duplicated on a normalised form of the text, and split into train / dev with
a seeded, per-source split (:func:`build_dataset`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from ..errors import DataError
from ..seeds import mixed_seed, unit_hash
from .sources import DataSource
from .surface import apply_transforms

csv.field_size_limit(1 << 24)

@dataclass
class Example:
    text: str
    label: float
    source: int  # index of the DataSource
    line: int
    category: str | None = None  # the value of the source's `by` field (per-category metrics)


@dataclass
class SourceStats:
    name: str
    path: str
    rows: int = 0  # rows read from the file
    skipped: int = 0  # invalid rows skipped (skip_invalid)
    filtered: int = 0  # valid rows that keep_matching left out
    used: int = 0  # rows kept after limit
    duplicates: int = 0
    train: int = 0
    dev: int = 0
    augmented: int = 0  # augmented copies added to the training split
    sha256: str = ""
    licence: str | None = None
    skip_reasons: dict[str, int] = field(default_factory=dict)


def _decode(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"{path}: data file does not exist (check `data_root` / --data-root).")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path}: file is empty.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                        "re-encode the file as UTF-8.") from None
    return text[1:] if text.startswith("\ufeff") else text


def _lines(content: str) -> list[str]:
    """Split on newlines only: str.splitlines() also splits on U+2028, U+0085 ..., which occur inside texts."""
    return [line[:-1] if line.endswith("\r") else line for line in content.split("\n")]


def _dotted(record, dotted: str):
    """Follow ``a.b.c`` through nested dicts; raise KeyError naming the missing part."""
    value = record
    for i, part in enumerate(dotted.split(".")):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(".".join(dotted.split(".")[: i + 1]))
    return value


def _rows(source: DataSource, path: Path) -> Iterator[tuple[int, object, object, str | None]]:
    """Yield (line number, raw text, raw label, category or None) for each record of a file."""
    fmt = source.file_format(path)
    content = _decode(path)
    if fmt == "lines":
        if source.label is not None:
            raise DataError(f"{path}: a plain-text file has no columns; use `label_value` instead of `label`.")
        for number, line in enumerate(_lines(content), start=1):
            if line.strip():
                yield number, line, source.label_value, None
        return
    if fmt == "jsonl":
        for number, line in enumerate(_lines(content), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: invalid JSON ({exc.msg}).") from None
            try:
                text = _dotted(record, source.text)
            except KeyError as exc:
                yield number, _RowProblem(f"missing text field {exc.args[0]!r}{_keys_hint(record)}", "text missing"), None, None
                continue
            if source.label is None:
                label = source.label_value
            else:
                try:
                    label = _dotted(record, source.label)
                except KeyError as exc:
                    yield number, _RowProblem(f"missing label field {exc.args[0]!r}{_keys_hint(record)}", "label missing"), None, None
                    continue
            category = None
            if source.by is not None:
                try:
                    category = str(_dotted(record, source.by))
                except KeyError as exc:
                    raise DataError(f"{path}:{number}: missing `by` field {exc.args[0]!r}{_keys_hint(record)}.") from None
            yield number, text, label, category
        return
    delimiter = "\t" if fmt == "tsv" else ","
    quoting = csv.QUOTE_NONE if source.quoting == "none" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=delimiter, quoting=quoting)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: file is empty.") from None
    except csv.Error as exc:
        raise DataError(f"{path}:1: malformed header ({exc}).") from None
    columns = {name.strip(): i for i, name in enumerate(header)}
    for wanted in (source.text, source.label, source.by):
        if wanted is not None and wanted not in columns:
            raise DataError(f"{path}:1: missing column {wanted!r}; the header has {sorted(columns)}.")
    text_col = columns[source.text]
    label_col = columns[source.label] if source.label is not None else None
    by_col = columns[source.by] if source.by is not None else None
    line = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataError(f"{path}:{line}: malformed {fmt.upper()} row ({exc}).") from None
        start, line = line, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        needed = max(text_col, label_col if label_col is not None else 0, by_col if by_col is not None else 0)
        if len(row) <= needed:
            yield start, _RowProblem(f"row has {len(row)} fields, expected at least {needed + 1} (columns "
                                     f"{list(columns)}); check the delimiter and quoting", "row too short"), None, None
            continue
        yield (start, row[text_col], (row[label_col] if label_col is not None else source.label_value),
               row[by_col] if by_col is not None else None)


class _RowProblem(str):
    """A row-level problem found while parsing (too few fields, a missing JSON field): skippable with skip_invalid."""

    def __new__(cls, message: str, kind: str):
        obj = super().__new__(cls, message)
        obj.kind = kind
        return obj


def _keys_hint(record) -> str:
    return f" (record keys: {sorted(record)[:12]})" if isinstance(record, dict) else f" (record is {type(record).__name__})"


def read_source(source: DataSource, index: int, data_root: Path | None, seed: int = 0) -> tuple[list[Example], SourceStats]:
    """Read and validate one source. Raises DataError on the first bad row unless ``skip_invalid``."""
    from ..files import sha256_file

    path = source.resolve(data_root)
    stats = SourceStats(name=source.display_name, path=source.path, licence=source.licence)
    examples: list[Example] = []
    for number, raw_text, raw_label, category in _rows(source, path):
        stats.rows += 1
        problem = kind = None
        if isinstance(raw_text, _RowProblem):
            problem, kind = str(raw_text), raw_text.kind
        elif not isinstance(raw_text, str):
            problem = f"text is {type(raw_text).__name__}, not a string" if raw_text is not None else "text is null"
            kind = "text missing"
        elif not raw_text.strip():
            problem, kind = "text is empty", "text empty"
        if problem is None:
            try:
                label = source.transform.apply(raw_label)
            except ValueError as exc:
                problem, kind = str(exc), ("label missing" if raw_label is None else "label invalid")
        if problem is not None:
            if source.skip_invalid:
                stats.skipped += 1
                stats.skip_reasons[kind] = stats.skip_reasons.get(kind, 0) + 1
                continue
            raise DataError(f"{path}:{number}: {problem}. "
                            "Fix the row, or set `skip_invalid: true` for this source to drop such rows.")
        if not source.keeps(raw_text):
            stats.filtered += 1
            continue
        text = raw_text
        for old, new in source.replace.items():
            text = text.replace(old, new)
        if source.transforms:
            text = apply_transforms(text, source.transforms, set(), f"{seed}:view:{source.path}:{number}")
        if not text.strip():
            if source.skip_invalid:
                stats.skipped += 1
                stats.skip_reasons["text empty"] = stats.skip_reasons.get("text empty", 0) + 1
                continue
            raise DataError(f"{path}:{number}: text is empty after the `replace` substitutions.")
        examples.append(Example(text.strip(), label, index, number, category))
    if not examples:
        unmatched = f", {stats.filtered} not matching keep_matching {source.keep_matching!r}" if stats.filtered else ""
        raise DataError(f"{path}: no usable rows ({stats.rows} read, {stats.skipped} skipped as invalid{unmatched}).")
    if source.limit is not None and len(examples) > source.limit:
        # the lowest hashes of (seed, file, line): two views of one file with the same limit keep the same lines
        scores = [unit_hash(f"{seed}:limit:{source.path}:{ex.line}") for ex in examples]
        keep = sorted(sorted(range(len(examples)), key=lambda i: scores[i])[: source.limit])
        examples = [examples[i] for i in keep]
    stats.used = len(examples)
    stats.sha256 = sha256_file(path)
    return examples, stats


_NORMALISE = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    """The de-duplication key: lower case, punctuation and spacing removed (so tokenized copies match)."""
    return _NORMALISE.sub(" ", text.lower()).strip()


MIN_EXAMPLES_FOR_DEV = 2  # in one source: one held out for the dev split, one to train on


@dataclass
class Dataset:
    sources: list[DataSource]
    stats: list[SourceStats]
    train: list[Example]
    dev: list[Example]
    eval_sets: list[tuple[DataSource, list[Example], SourceStats]]
    removed_overlap: int = 0  # training rows dropped because they appear in an evaluation set

    @property
    def file_hashes(self) -> dict[str, str]:
        """SHA-256 of every file read (training and evaluation), by path: what a resumed run must find unchanged."""
        return {s.path: s.sha256 for s in self.stats + [st for _, _, st in self.eval_sets]}


def build_dataset(sources: list[DataSource], eval_sources: list[DataSource], data_root: Path | None, *,
                  seed: int, dev_fraction: float, dev_max_per_source: int | None, dedup: bool) -> Dataset:
    """Read everything, de-duplicate, drop evaluation texts from training, split train/dev per source."""
    eval_sets = []
    eval_keys: set[str] = set()
    for i, source in enumerate(eval_sources):
        examples, stats = read_source(source, i, data_root, seed)
        eval_sets.append((source, examples, stats))
        eval_keys.update(normalise(e.text) for e in examples)

    all_stats, per_source = [], []
    seen: set[str] = set()
    removed_overlap = 0
    for i, source in enumerate(sources):
        examples, stats = read_source(source, i, data_root, seed)
        kept = []
        for ex in examples:
            key = normalise(ex.text)
            if key in eval_keys:
                removed_overlap += 1
                stats.duplicates += 1
                continue
            if dedup:
                if key in seen:
                    stats.duplicates += 1
                    continue
                seen.add(key)
            kept.append(ex)
        if not kept:
            raise DataError(f"{source.resolve(data_root)}: every row is a duplicate of an earlier source or an "
                            "evaluation set; nothing left to train on.")
        per_source.append(kept)
        all_stats.append(stats)

    # dev membership is a pure function of (seed, file, line): two views of one file (e.g. the prompt and
    # the continuation of the same record) fall on the same side of the split
    all_scores = [[unit_hash(f"{seed}:split:{sources[i].path}:{ex.line}") for ex in kept]
                  for i, kept in enumerate(per_source)]
    dev_sets = []
    for kept, scores in zip(per_source, all_scores):
        dev_idx = {j for j, u in enumerate(scores) if u < dev_fraction}
        if dev_max_per_source is not None and len(dev_idx) > dev_max_per_source:
            dev_idx = set(sorted(dev_idx, key=lambda j: scores[j])[:dev_max_per_source])
        if len(dev_idx) == len(kept):  # keep at least one training row
            dev_idx.discard(max(dev_idx, key=lambda j: scores[j]))
        dev_sets.append(dev_idx)
    if dev_fraction > 0 and not any(dev_sets):
        # A small dataset can draw no dev row at all; then nothing would measure the model and metrics.json /
        # the card would say `dev: {}` without a word. Hold out the lowest-scoring row of the largest source
        # that can spare one (still a pure function of seed, file and line), so that "at least 2 rows in one
        # source" is an exact minimum; below it there is nothing to hold out and that is an error, not a warning:
        # dev_fraction > 0 asks for a dev split, and `dev_fraction: 0` is the explicit way to train without one
        # (the trainer then warns if no eval set measures the model either).
        spare = [i for i, kept in enumerate(per_source) if len(kept) >= MIN_EXAMPLES_FOR_DEV]
        if not spare:
            counts = ", ".join(f"{sources[i].resolve(data_root)}: {len(kept)}" for i, kept in enumerate(per_source))
            raise DataError(
                f"Too few examples to hold out a dev split: the dev split is a seeded dev_fraction "
                f"({dev_fraction:g}) of each training source's rows, always leaving each source one row to train "
                f"on, so it needs at least {MIN_EXAMPLES_FOR_DEV} usable examples (after de-duplication) in one "
                f"source; got {counts}. Add examples, or set dev_fraction: 0 to train without a dev split "
                "(then give an eval set, --eval FILE, so that the model is measured).")
        i = max(spare, key=lambda s: len(per_source[s]))
        dev_sets[i] = {min(range(len(per_source[i])), key=lambda j: all_scores[i][j])}

    train, dev = [], []
    for i, (kept, dev_idx) in enumerate(zip(per_source, dev_sets)):
        for j, ex in enumerate(kept):
            (dev if j in dev_idx else train).append(ex)
        all_stats[i].dev = len(dev_idx)
        all_stats[i].train = len(kept) - len(dev_idx)
    return Dataset(sources, all_stats, train, dev, eval_sets, removed_overlap)


def epoch_indices(examples: list[Example], weights: list[float], seed: int, epoch: int) -> list[int]:
    """The examples of one epoch: each source contributes weight x its size (sampled), then shuffled.

    A weight of 2 shows every row twice, 0.5 a random half; deterministic in (seed, epoch).
    """
    generator = torch.Generator().manual_seed(mixed_seed(seed, 1_000_003, epoch))
    by_source: dict[int, list[int]] = {}
    for i, ex in enumerate(examples):
        by_source.setdefault(ex.source, []).append(i)
    chosen: list[int] = []
    for source in sorted(by_source):
        idx = by_source[source]
        want = int(round(weights[source] * len(idx)))
        full, rest = divmod(want, len(idx))
        chosen.extend(idx * full)
        if rest:
            pick = torch.randperm(len(idx), generator=generator)[:rest].tolist()
            chosen.extend(idx[p] for p in sorted(pick))
    perm = torch.randperm(len(chosen), generator=generator).tolist()
    return [chosen[p] for p in perm]


def length_grouped_batches(order: list[int], lengths: list[int], batch_size: int, seed: int, epoch: int,
                           group: int = 50) -> list[list[int]]:
    """Batches of similar length (less padding): sort within windows of ``group`` batches, shuffle batches."""
    batches: list[list[int]] = []
    window = batch_size * group
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        batches.extend(chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size))
    generator = torch.Generator().manual_seed(mixed_seed(seed, 7_919, int(epoch) + 17))
    perm = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[p] for p in perm]


def tokenize(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids of each text (no special tokens), truncated so that start token + text <= max_length."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [row[: max_length - 1] for row in ids]


def collate(rows: list[list[int]], start_token_id: int | None, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Start token + ids, left padded, with position ids derived from the mask (as RewardModel.encode).

    ``start_token_id`` None (a model without a start token, such as an imported RAD model) lays out the ids
    alone."""
    start = [] if start_token_id is None else [start_token_id]
    width = max(len(r) for r in rows) + len(start)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row) + len(start)
        if n:
            ids[i, width - n:] = torch.tensor(start + row, dtype=torch.long)
        mask[i, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}

"""A training data source as a config names it: the file, its format and fields, its weight, and the
:class:`LabelTransform` that turns its raw labels into ρ targets in [0, 1] (``map`` raw values, ``rescale`` a
range such as [-4, 4], ``binary`` threshold, ``invert``). :mod:`steerkit.training.data` reads sources.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import DataError
from .surface import Transform

Format = Literal["auto", "csv", "tsv", "jsonl", "lines"]
_SUFFIX_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
                   ".txt": "lines"}


class LabelTransform(BaseModel):
    """Raw label -> ρ target in [0, 1]. Applied in order: map, rescale, clip, binary, invert."""

    model_config = ConfigDict(extra="forbid")
    map: dict[str, float] | None = Field(
        default=None, description="Raw value -> number, e.g. {'positive': 1, 'negative': 0} or Davidson classes")
    rescale: tuple[float, float] | None = Field(
        default=None, description="Linearly map [low, high] to [0, 1], e.g. [-4, 4]")
    clip: bool = Field(default=False, description="Clamp to [0, 1] after the rescale: e.g. rescale [2, 4] with clip "
                       "turns ratings 1-5 into 0 at 2 or less, 0.5 at 3, 1 at 4 or more")
    binary: float | None = Field(default=None, description="Threshold: label >= threshold -> 1, else 0")
    invert: bool = Field(default=False, description="ρ = 1 - label (e.g. to score 'negative' instead of 'positive')")

    @model_validator(mode="after")
    def _check(self):
        if self.rescale is not None and not self.rescale[0] < self.rescale[1]:
            raise ValueError(f"rescale must be [low, high] with low < high, got {list(self.rescale)}")
        if self.clip and self.rescale is None:  # else a label from a wrong column would clamp instead of failing
            raise ValueError("clip clamps what a rescale maps outside [0, 1]; give `rescale: [low, high]` with it")
        return self

    def apply(self, raw) -> float:
        """Raise ValueError with a short reason when the raw value cannot become a valid target."""
        if raw is None:
            raise ValueError("label is missing (null)")
        if self.map is not None:
            key = str(raw).strip() if not isinstance(raw, bool) else str(int(raw))
            if isinstance(raw, float) and raw.is_integer():
                key = str(int(raw))
            if key not in self.map:
                raise ValueError(f"label {raw!r} is not one of the mapped values {sorted(self.map)}")
            value = float(self.map[key])
        else:
            value = _to_float(raw)
        if math.isnan(value):
            raise ValueError("label is NaN")
        if math.isinf(value):
            raise ValueError(f"label is {value}")
        if self.rescale is not None:
            lo, hi = self.rescale
            value = (value - lo) / (hi - lo)
        if self.clip:
            value = min(1.0, max(0.0, value))
        if self.binary is not None:
            value = 1.0 if value >= self.binary else 0.0
        if self.invert:
            value = 1.0 - value
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"label {raw!r} becomes {value:g} after the transform, outside [0, 1] "
                             "(add a `rescale` or `binary` transform)")
        return value


def _to_float(raw) -> float:
    if isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            raise ValueError("label is empty")
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"label {raw!r} is not a number (use `map` to turn categories into numbers)") from None
    raise ValueError(f"label {raw!r} is not a number")


class DataSource(BaseModel):
    """One data file (or one view of it: the same file may appear twice with different columns)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="File path, relative to data_root unless absolute")
    name: str | None = Field(default=None, description="Display name in metrics and the model card")
    format: Format = "auto"
    text: str = Field(default="text", min_length=1, description="Text column, or dotted JSON path (continuation.text)")
    label: str | None = Field(default=None, description="Label column or dotted JSON path")
    label_value: float | None = Field(default=None, description="Constant label for every row (e.g. a file of toxic sentences)")
    transform: LabelTransform = LabelTransform()
    quoting: Literal["default", "none"] = Field(default="default", description="CSV/TSV quoting; 'none' = csv.QUOTE_NONE")
    weight: float = Field(default=1.0, gt=0, description="Sampling weight: each epoch draws weight x rows from this source")
    limit: int | None = Field(default=None, ge=1, description="Use at most this many rows (seeded sample)")
    skip_invalid: bool = Field(default=False, description="Skip rows with an empty text or an invalid label instead of failing")
    keep_matching: str | None = Field(
        default=None, min_length=1, description="A regular expression (Python syntax, case-insensitive): keep only "
        "rows whose text, as read, contains a match; the others are counted as filtered, not as invalid")
    max_length: int | None = Field(default=None, ge=2, description="Token limit for this source (evaluation sets)")
    replace: dict[str, str] = Field(default={}, description="Literal replacements in the text, e.g. {'<br />': ' '}")
    group: str | None = Field(default=None, description="Sources with the same group are pooled in metrics "
                              "(e.g. a file of toxic and a file of normal sentences -> one AUROC)")
    licence: str | None = None
    relative_to: Literal["data_root", "config"] = Field(
        default="data_root", description="A relative path is relative to data_root, or to the config file's directory")
    transforms: list[Transform] = Field(default=[], description="Surface-form transforms applied to every text as "
                                        "it is read (e.g. a detokenized view of a tokenized test set)")
    by: str | None = Field(default=None, description="Evaluation sets: also report metrics per value of this "
                           "column / dotted path (e.g. the category of a functional test case)")

    @field_validator("keep_matching")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value, re.IGNORECASE)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc}); write it in Python's `re` syntax") from None
        return value

    def keeps(self, text: str) -> bool:
        """Whether ``keep_matching`` (if set) keeps this row's text."""
        return self.keep_matching is None or re.search(self.keep_matching, text, re.IGNORECASE) is not None

    @model_validator(mode="after")
    def _one_label(self):
        if (self.label is None) == (self.label_value is None):
            raise ValueError("give exactly one of `label` (a column) or `label_value` (a constant)")
        if self.label_value is not None and not 0.0 <= self.label_value <= 1.0:
            raise ValueError(f"label_value must be in [0, 1], got {self.label_value}")
        return self

    @property
    def display_name(self) -> str:
        return self.name or self.path

    @property
    def metrics_name(self) -> str:
        return self.group or self.display_name

    def resolve(self, data_root: Path | None) -> Path:
        path = Path(self.path).expanduser()
        if not path.is_absolute() and data_root is not None:
            path = data_root / path
        return path

    def file_format(self, path: Path) -> str:
        if self.format != "auto":
            return self.format
        fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise DataError(f"{path}: cannot tell the format from the suffix {path.suffix!r}; "
                            "set `format` to csv, tsv, jsonl or lines.")
        return fmt

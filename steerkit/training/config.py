"""``TrainConfig``: everything ``steerkit train`` needs, from flags or an equivalent YAML / TOML / JSON file.

Unknown keys and bad values raise :class:`~steerkit.errors.ConfigError` naming the field path
(``data.1.transform.rescale``). Relative paths in a file (``data_root``, ``output_dir``,
``checkpoint_dir``, ``card``) are resolved against the file's directory, so a config works from any
working directory. ``data_root`` precedence: ``--data-root`` flag, then ``$STEERKIT_DATA_ROOT``, then the
file (a relative value from a flag or the environment is relative to the working directory).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, PrivateAttr

from ..config import ValidatedConfig, load_config_file
from ..models import DEFAULT_LM
from ..rewards.model import LoraSettings
from .data import DataSource

DATA_ROOT_ENV = "STEERKIT_DATA_ROOT"
DEFAULT_LR = {"head": 1e-3, "lora": 5e-4, "full": 5e-5}
_PATH_FIELDS = ("data_root", "output_dir", "checkpoint_dir", "card")


class TrainConfig(ValidatedConfig):
    _source: ClassVar[str] = "training config"
    model_config = ConfigDict(extra="forbid")

    # what the reward measures
    name: str = Field(default="reward", min_length=1)
    attribute: str = Field(default="", description="What ρ is, e.g. 'probability the text is toxic'")

    # model
    backbone: str = Field(default=DEFAULT_LM, min_length=1)
    num_layers: int | None = Field(default=None, ge=1, description="Keep the first N transformer layers")
    method: Literal["lora", "head", "full"] = "lora"
    lora: LoraSettings = LoraSettings()
    max_length: int = Field(default=64, ge=2, description="Tokens per text, start token included")

    # data
    data_root: str | None = None
    data: list[DataSource] = Field(min_length=1)
    eval: list[DataSource] = Field(default=[], description="Held-out test sets, evaluated after training")
    dev_fraction: float = Field(default=0.05, ge=0, lt=1)
    dev_max_per_source: int | None = Field(default=1000, ge=1)
    dedup: bool = True

    # optimisation
    loss: Literal["cumulative", "last"] = "cumulative"
    seed: int = 0
    batch_size: int = Field(default=16, ge=1)
    steps: int | None = Field(default=None, ge=1, description="Optimizer steps (default: `epochs` over the data)")
    epochs: float = Field(default=1.0, gt=0)
    lr: float | None = Field(default=None, gt=0, description="Default: 1e-3 head, 5e-4 lora, 5e-5 full")
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_fraction: float = Field(default=0.05, ge=0, lt=1)
    grad_clip: float | None = Field(default=1.0, gt=0)
    threads: int | None = Field(default=None, ge=1, description="torch threads (default: torch's own)")

    # evaluation and checkpoints
    eval_every: int = Field(default=200, ge=1, description="Dev evaluation every N steps (on eval_limit rows)")
    eval_limit: int = Field(default=500, ge=1)
    eval_batch_size: int = Field(default=64, ge=1)
    checkpoint_every: int = Field(default=200, ge=1)
    keep_checkpoints: int = Field(default=2, ge=1)

    # output
    output_dir: str = Field(min_length=1)
    checkpoint_dir: str | None = Field(default=None, description="Default: <output_dir>.checkpoints")
    keep_checkpoint_dir: bool = Field(default=False, description="Keep checkpoints after a successful run")
    overwrite: bool = Field(default=False, description="Replace an existing output_dir if it is a steerkit reward "
                            "model (anything else is always refused) and discard an earlier run's checkpoints")
    card: str | None = Field(default=None, description="Also write the model card here (README.md is always written)")
    intended_use: str = ""
    limitations: list[str] = []

    _source_file: str | None = PrivateAttr(default=None)  # the file this config was read from, for the card

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike, overrides: dict | None = None) -> "TrainConfig":
        path = Path(path)
        data = load_config_file(path)
        base = path.resolve().parent
        for key in _PATH_FIELDS:
            value = data.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                data[key] = str(base / value)
        if os.environ.get(DATA_ROOT_ENV):  # the environment overrides the file; flags (overrides) win over both
            data["data_root"] = os.environ[DATA_ROOT_ENV]
        config = cls.from_dict({**data, **(overrides or {})}, source=str(path))
        config._source_file = str(path)
        return config

    def with_overrides(self, values: dict) -> "TrainConfig":
        config = self.from_dict({**self.model_dump(), **{k: v for k, v in values.items() if v is not None}},
                                source="command-line options")
        config._source_file = self._source_file
        return config

    @property
    def source_file(self) -> str | None:
        return self._source_file

    # -- derived values -------------------------------------------------------------------------
    def resolved_data_root(self) -> Path | None:
        root = os.environ.get(DATA_ROOT_ENV) if self.data_root is None else self.data_root
        return Path(root).expanduser() if root else None

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.method]

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(str(Path(self.output_dir)) + ".checkpoints")

    def run_fingerprint(self) -> str:
        """What a checkpoint must agree with to be resumed: everything that shapes the training trajectory."""
        ignore = {"eval_every", "eval_limit", "eval_batch_size", "checkpoint_every", "keep_checkpoints",
                  "output_dir", "checkpoint_dir", "keep_checkpoint_dir", "card", "intended_use", "limitations",
                  "threads", "data_root", "attribute", "name", "overwrite"}
        payload = {k: v for k, v in self.model_dump(mode="json").items() if k not in ignore}
        for key in ("data", "eval"):
            payload[key] = [{k: v for k, v in d.items() if k not in {"name", "licence"}} for d in payload[key]]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


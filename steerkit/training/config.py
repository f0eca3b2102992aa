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

from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from ..config import ValidatedConfig, load_config_file
from ..devices import DeviceName
from ..errors import ConfigError
from ..models import DEFAULT_LM
from ..rewards.model import LoraSettings, TokenHeadSettings
from .augment import AugmentConfig
from .data import DataSource, Dataset, build_dataset
from .distill_config import DistillConfig

DATA_ROOT_ENV = "STEERKIT_DATA_ROOT"
DEFAULT_LR = {"head": 1e-3, "lora": 5e-4, "full": 5e-5}
#: what ``data_from: OTHER.yaml`` takes from the other config (keys set in this file win)
DATA_KEYS = ("data_root", "data", "eval", "dev_fraction", "dev_max_per_source", "dedup", "augment")
#: the other configs a config may take sections from, in order (a later one wins; keys set in the file win over all):
#: ``data_from`` the data recipe, ``eval_from`` only the held-out sets (e.g. a newer config's, with an older recipe)
INCLUDES = (("data_from", DATA_KEYS), ("eval_from", ("eval",)))
#: ``data_extra`` / ``eval_extra``: sources appended to ``data`` / ``eval`` after the includes (an included recipe
#: plus a source or two, without copying its list)
EXTRAS = ("data", "eval")
#: ``data_weights: {NAME: WEIGHT}``: the weight of included (or listed) data sources by name, set after the includes
#: and extras (a recipe with one source re-weighted, without a copy of its data list); ``data_update: {NAME: {FIELD:
#: VALUE}}`` sets any of a source's fields the same way (e.g. its label column and transform), then the weights
WEIGHTS = "data_weights"
UPDATES = "data_update"
_PATH_FIELDS = ("data_root", "output_dir", "checkpoint_dir", "card", "cross_source")


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
    kind: Literal["sequence", "token"] = Field(default="sequence", description="token: a token-level head that "
                                               "scores every next token from the prefix (docs/training.md)")
    token_head: TokenHeadSettings = TokenHeadSettings()
    distill: DistillConfig | None = Field(default=None, description="kind token: fit a sequence reward model's "
                                          "scores of sampled top-k candidates instead of the labels")
    lora: LoraSettings = LoraSettings()
    max_length: int = Field(default=64, ge=2, description="Tokens per text, start token included")

    # data
    data_root: str | None = None
    data: list[DataSource] = Field(min_length=1)
    eval: list[DataSource] = Field(default=[], description="Held-out test sets, evaluated after training")
    dev_fraction: float = Field(default=0.05, ge=0, lt=1)
    dev_max_per_source: int | None = Field(default=1000, ge=1)
    dedup: bool = True
    augment: AugmentConfig = AugmentConfig()
    leave_out: list[str] = Field(default=[], description="Sources (name or group) held out of training whole and "
                                 "evaluated as a test set: one fold of leave-one-source-out validation")
    leave_out_limit: int | None = Field(default=2000, ge=1, description="Rows of a left-out source to evaluate on")
    selection_metric: Literal["auroc", "accuracy"] = Field(
        default="auroc", description="The metric of the leave-one-source-out matrix (and of choosing a recipe)")
    cross_source: str | None = Field(default=None, description="cross_source.json of `steerkit train --cross-source` "
                                     "to report in the model card")

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
    device: DeviceName = Field(default=None, description="cpu (default), cuda, cuda:1, mps ...")

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

    @model_validator(mode="after")
    def _lm_state_head_reads_the_whole_lm(self) -> "TrainConfig":
        if self.token_head.lm_state and (self.kind != "token" or self.method != "head" or self.distill is not None):
            raise ValueError("token_head.lm_state trains a token-level head on the LM's own final hidden state: it "
                             "needs kind: token and method: head (the LM is not changed), and no distill.")
        return self

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike, overrides: dict | None = None) -> "TrainConfig":
        path = Path(path)
        data = _with_includes(path)
        base = path.resolve().parent
        for key in _PATH_FIELDS:
            value = data.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                data[key] = str(base / value)
        for key in ("data", "eval"):  # sources that live next to the config (e.g. functional tests under tests/)
            for source in data.get(key) or []:
                if isinstance(source, dict) and source.get("relative_to") == "config" and isinstance(
                        source.get("path"), str) and not Path(source["path"]).expanduser().is_absolute():
                    source["path"] = str(base / source["path"])
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

    def split_leave_out(self) -> tuple[list[DataSource], list[DataSource]]:
        """(training sources, left-out sources turned into test sets) for ``leave_out``."""
        if not self.leave_out:
            return list(self.data), []
        known = {n for s in self.data for n in (s.display_name, s.metrics_name)}
        unknown = [n for n in self.leave_out if n not in known]
        if unknown:
            raise ConfigError(f"leave_out names {unknown} match no training source; the sources are "
                              f"{sorted(known)} (a name or a group).")
        out = set(self.leave_out)
        kept = [s for s in self.data if not {s.display_name, s.metrics_name} & out]
        if not kept:
            raise ConfigError("leave_out removes every training source; leave at least one in.")
        held = [s.model_copy(update={"group": f"left out: {s.metrics_name}", "skip_invalid": True,
                                     "limit": min(s.limit or self.leave_out_limit or 10**9,
                                                  self.leave_out_limit or 10**9)})
                for s in self.data if {s.display_name, s.metrics_name} & out]
        return kept, held

    def read_dataset(self) -> Dataset:
        """Read and split the data this config names: training sources less ``leave_out``, whose rows join the
        ``eval`` sets (no augmentation: that is the trainer's, for the training split only)."""
        sources, left_out = self.split_leave_out()
        return build_dataset(sources, self.eval + left_out, self.resolved_data_root(), seed=self.seed,
                             dev_fraction=self.dev_fraction, dev_max_per_source=self.dev_max_per_source,
                             dedup=self.dedup)

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
                  "threads", "data_root", "attribute", "name", "overwrite", "device", "cross_source",
                  "selection_metric"}
        if self.kind == "sequence":  # the token-level fields leave sequence runs' fingerprints as they were
            ignore |= {"kind", "token_head", "distill"}
        payload = {k: v for k, v in self.model_dump(mode="json").items() if k not in ignore}
        for key in ("data", "eval"):
            payload[key] = [{k: v for k, v in d.items() if k not in {"name", "licence", "relative_to"}}
                            for d in payload[key]]
            for d in payload[key]:  # a transform without a clip (a source without a filter) fingerprints as before
                if not d["transform"]["clip"]:
                    del d["transform"]["clip"]
                if d["keep_matching"] is None:
                    del d["keep_matching"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _with_includes(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The raw config of ``path`` with its includes resolved: the sections ``data_from`` / ``eval_from`` name taken
    from those configs (in this directory; themselves resolved the same way, so one may extend another), the file's
    own keys winning, then its ``data_extra`` / ``eval_extra`` appended, then its ``data_update`` and
    ``data_weights`` set."""
    resolved = path.resolve()
    if resolved in seen:
        raise ConfigError(f"{path}: data_from / eval_from form a cycle: "
                          + " -> ".join(p.name for p in (*seen, resolved)))
    data = load_config_file(path)
    shared: dict = {}  # sections of other configs in this directory (token variants, older recipes)
    for key, sections in INCLUDES:
        include = data.pop(key, None)
        if isinstance(include, str):
            other = _with_includes(resolved.parent / include, (*seen, resolved))
            shared.update({k: other[k] for k in sections if k in other})
    extras = {key: data.pop(f"{key}_extra", None) for key in EXTRAS}
    updates = data.pop(UPDATES, None)
    weights = data.pop(WEIGHTS, None)
    data = {**shared, **data}
    for key, extra in extras.items():
        if extra is not None:
            if not isinstance(extra, list):
                raise ConfigError(f"{path}: {key}_extra must be a list of sources, like {key}.")
            data[key] = list(data.get(key) or []) + extra
    if updates is not None:
        if not isinstance(updates, dict) or not all(isinstance(v, dict) for v in updates.values()):
            raise ConfigError(f"{path}: {UPDATES} must map source names to the fields to set, e.g. "
                              "{ToxiGen annotated: {label: toxicity_human}}.")
        data["data"] = _updated(path, UPDATES, list(data.get("data") or []), updates)
    if weights is not None:
        if not isinstance(weights, dict):
            raise ConfigError(f"{path}: {WEIGHTS} must map source names to weights, e.g. {{RTP continuations: 1.5}}.")
        data["data"] = _updated(path, WEIGHTS, list(data.get("data") or []),
                                {name: {"weight": weight} for name, weight in weights.items()})
    return data


def _updated(path: Path, key: str, sources: list, updates: dict) -> list:
    """``sources`` with ``updates`` ({source name: {field: value}}) set (the fields are then validated as any
    source's are); a name no source has is a ConfigError."""
    names = [s.get("name") for s in sources if isinstance(s, dict)]
    if unknown := [n for n in updates if n not in names]:
        raise ConfigError(f"{path}: {key} names {unknown}, which no data source has; the sources are {names}.")
    return [{**s, **updates[s["name"]]} if isinstance(s, dict) and s.get("name") in updates else s
            for s in sources]

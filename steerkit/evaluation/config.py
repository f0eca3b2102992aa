"""``EvalConfig``: everything ``steerkit eval`` needs; a YAML/TOML/JSON file is equivalent to the flags.

    task: toxicity
    lm: smollm2-135m-instruct
    prompts:
      - {name: nontoxic, path: ../shared/data/prompts/toxicity_nontoxic_eval.jsonl, field: prompt.text, limit: 100}
    reward: toxicity            # registered name or reward-model directory; steered away from (direction: decrease)
    betas: [10, 20, 50, 100]
    ks: [20]
    num_continuations: 25
    max_new_tokens: 20
    scorers: [tox-block, alt-profanity-check]
    eval_lm: gemma3-270m
    output: runs/eval-toxicity
    settings:                   # extra settings besides the grid, e.g. a composed run
      - {name: composed, k: 20, rewards: [{name: toxicity, beta: -50}, {name: sentiment, beta: 50}]}

Relative paths in a file (prompt files, ``output``) are relative to the file's directory.
CLI flags override file values (``steerkit eval toxicity --config FILE --limit 5``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import BackendName, EngineName, LMDtype, RewardSpec, ValidatedConfig, load_config_file
from ..devices import DeviceName
from ..errors import ConfigError
from ..models import DEFAULT_EVAL_LM, DEFAULT_LM

Task = Literal["toxicity", "sentiment"]
DEFAULT_SCORERS = {"toxicity": ["tox-block", "alt-profanity-check"], "sentiment": ["vader", "textblob"]}
DEFAULT_DIRECTION = {"toxicity": "decrease", "sentiment": "increase"}
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,99}$")  # names of files: at most 100 characters


class PromptSet(BaseModel):
    """One JSONL prompt file; ``field`` is a dotted path to the prompt text in each record."""

    model_config = ConfigDict(extra="forbid")
    name: str = ""
    path: str = Field(min_length=1)
    field: str = "prompt.text"
    limit: int | None = Field(default=None, ge=1)
    offset: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _name(self):
        if not self.name:
            self.name = Path(self.path).stem.replace("_prompts", "") or "prompts"
        if not _SAFE.match(self.name):
            raise ValueError(f"prompt set name {self.name!r} may only use letters, digits and . _ = + - (at most "
                             "100 characters); name the set: --prompts NAME=PATH, or name: in the config")
        return self


class Setting(BaseModel):
    """One decoding setting: top-k plus any number of signed reward weights (none = unsteered)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    k: int = Field(default=20, ge=1)
    rewards: list[RewardSpec] = []

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        if not _SAFE.match(v):
            raise ValueError(f"setting name {v!r} may only use letters, digits and . _ = + - (at most 100 characters)")
        return v

    @property
    def steered(self) -> bool:
        return any(r.beta for r in self.rewards)

    def beta(self) -> float:
        """|β| of the single reward (the grid's β); NaN for composed settings."""
        if not self.rewards:
            return 0.0
        return abs(self.rewards[0].beta) if len(self.rewards) == 1 else float("nan")


class EvalConfig(ValidatedConfig):
    _source: ClassVar[str] = "eval config"
    model_config = ConfigDict(extra="forbid")
    task: Task = "toxicity"
    lm: str = DEFAULT_LM
    prompts: list[PromptSet] = []
    reward: str | None = None
    direction: Literal["increase", "decrease"] | None = None
    betas: list[float] = [10, 20, 50, 100]
    ks: list[int] = [20]
    baseline: bool = True
    settings: list[Setting] = []
    num_continuations: int = Field(default=25, ge=1)
    max_new_tokens: int = Field(default=20, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    seed: int = 0
    batch_size: int | None = Field(default=None, ge=1)
    backend: BackendName = "auto"  # each reward picks: an ONNX export runs on onnx, anything else on torch
    scorers: list[str | dict] = []
    fluency: bool = True
    eval_lm: str = DEFAULT_EVAL_LM
    fluency_batch_size: int = Field(default=25, ge=1)
    fluency_samples: int | None = Field(default=None, ge=1)  # perplexity of the first m continuations per prompt only
    dist_normalize: Literal["words", "ngrams"] = "words"
    trace: bool = True
    trace_prompt: int = Field(default=0, ge=0)
    output: str = ""
    plots: bool = True
    threads: int | None = Field(default=None, ge=1)  # torch intra-op threads (1 is fastest on a busy 2-core box)
    device: DeviceName = None  # torch device for the LM, torch rewards and the eval LM: cpu, cuda, cuda:1, mps
    # steerkit's engine on the compiled static-shape step (as `steerkit generate --compile`; the same tokens at fp32).
    # None: where it pays, from the run's pending decode steps and the device (steerkit.compiling.compile_pays)
    compile: bool | None = None
    #: what runs the LM: steerkit's engine, or llama.cpp on a packaged or .gguf LM, on the CPU (docs/llama_cpp.md)
    engine: EngineName = "steerkit"
    #: the LM's weights in steerkit's engine: float32 as loaded, bfloat16 (bf16 weights and matmuls), weight-only int8
    dtype: LMDtype = "float32"

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: list[float]) -> list[float]:
        for b in v:
            if not math.isfinite(b) or b <= 0:
                raise ValueError(f"grid betas are magnitudes > 0 (the direction sets the sign), got {b}")
        return v

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v):
            raise ValueError("every k must be >= 1")
        return v

    @model_validator(mode="after")
    def _defaults(self):
        from ..validators import validate_engine_device, validate_lm_options

        validate_lm_options(self.engine, bool(self.compile), self.dtype)
        validate_engine_device(self.engine, self.device)
        if self.direction is None:
            self.direction = DEFAULT_DIRECTION[self.task]
        if self.reward is None:
            self.reward = self.task
        if not self.scorers:
            self.scorers = list(DEFAULT_SCORERS[self.task])
        if not self.output:
            self.output = f"runs/eval-{self.task}"
        names = [s.name for s in self.grid()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"setting names must be unique; repeated: {', '.join(dupes)}")
        sets = [p.name for p in self.prompts]
        if len(set(sets)) != len(sets):
            raise ValueError(f"prompt set names must be unique, got {sets}")
        return self

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, *, relative_to_file: bool = True, **overrides) -> "EvalConfig":
        """Load a config file; relative prompt paths and ``output`` are relative to the file's directory."""
        data = load_config_file(path)
        if relative_to_file:
            base = Path(path).resolve().parent
            prompts = data.get("prompts")
            if isinstance(prompts, list):
                data["prompts"] = [{**p, "path": os.path.normpath(base / p["path"])} if isinstance(p, dict) and isinstance(p.get("path"), str)
                                   and not Path(p["path"]).expanduser().is_absolute() else p for p in prompts]
            if isinstance(data.get("output"), str) and data["output"] and not Path(data["output"]).is_absolute():
                data["output"] = os.path.normpath(base / data["output"])
        return cls.from_dict({**data, **overrides}, source=str(path))

    def resolved(self) -> "EvalConfig":
        """A copy with absolute prompt paths (what a run directory's config.json records)."""
        prompts = [{**p.model_dump(), "path": str(Path(p.path).expanduser().resolve())} for p in self.prompts]
        return self.with_overrides({"prompts": prompts})

    def with_overrides(self, values: dict) -> "EvalConfig":
        data = self.model_dump(exclude_none=False)
        data.update(values)
        for key in ("direction", "reward"):  # recompute task-dependent defaults when the task changes
            if "task" in values and key not in values:
                data[key] = None
        return self.from_dict(data, source="command-line options")

    # -- the grid -------------------------------------------------------------------------------
    def grid(self) -> list[Setting]:
        """Unsteered baseline per k, then every (k, β) with the task reward, then the extra settings."""
        sign = -1.0 if self.direction == "decrease" else 1.0
        out: list[Setting] = []
        for k in self.ks:
            if self.baseline:
                out.append(Setting(name=f"unsteered-k{k}", k=k))
            for beta in self.betas:
                out.append(Setting(name=f"k{k}-beta{beta:g}", k=k,
                                   rewards=[RewardSpec(name=self.reward, beta=sign * beta)]))
        return out + list(self.settings)

    def setting_key(self, setting: Setting) -> str:
        """Hash of everything that changes a setting's generations (not the prompts or the scorers)."""
        payload = {"lm": self.lm, "k": setting.k, "rewards": [r.model_dump() for r in setting.rewards],
                   "n": self.num_continuations, "max_new_tokens": self.max_new_tokens,
                   "temperature": self.temperature, "seed": self.seed, "backend": self.backend}
        # what runs the LM changes its logits' last bits, so its tokens; the defaults stay out of the payload, so a
        # run made before these fields existed keeps its keys (and resumes)
        payload.update({key: value for key, value in (("engine", self.engine), ("dtype", self.dtype))
                        if value != type(self).model_fields[key].default})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def require_prompts(self) -> None:
        if not self.prompts:
            raise ConfigError("No prompts: pass --prompts PATH (a JSONL file; --field picks the text, default "
                              "prompt.text) or list them under `prompts:` in the config file.")

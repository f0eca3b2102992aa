"""Configuration (pydantic): what to steer, with which rewards and weights, and how to sample.

``SteeringConfig.from_file("steer.yaml")`` (or ``.toml``) validates a file; unknown keys and bad values
raise :class:`~steerkit.errors.ConfigError` naming the path of the offending field (``rewards.1.beta``).
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .devices import DeviceName
from .errors import ConfigError
from .models import DEFAULT_LM


class ValidatedConfig(BaseModel):
    """Base of every steerkit configuration: validation errors become one ConfigError naming each field path."""

    model_config = ConfigDict(extra="forbid")
    _source: ClassVar[str] = "config"

    @classmethod
    def from_dict(cls, data: dict, source: str | None = None):
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source or cls._source)) from None


class RewardSpec(BaseModel):
    """One reward: a registered name or reward-model directory, its signed β, and optional shaping."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="Registered reward name or reward-model directory")
    label: str | None = Field(default=None, min_length=1,
                              description="Name in traces and outputs (default: name); needed to use a reward twice")
    beta: float = Field(description="Signed weight; β < 0 steers away from the attribute")
    transform: Literal["none", "invert", "clamp"] = "none"
    clamp: tuple[float, float] = (0.0, 1.0)
    schedule: Literal["constant", "linear"] = "constant"
    beta_start: float = 0.0
    ramp_steps: int = Field(default=1, ge=1)
    context: Literal["continuation", "full"] = "continuation"

    @field_validator("beta", "beta_start")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _clamp_order(self):
        lo, hi = self.clamp
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"clamp must satisfy 0 <= low <= high <= 1, got {self.clamp}")
        return self

    def to_term(self, backend: str = "torch"):
        from .rewards.loading import load_reward
        from .steering import BetaSchedule, SteeringTerm, make_transform

        reward = load_reward(self.name, backend=backend, context=self.context)
        schedule = BetaSchedule(self.beta, self.schedule, self.beta_start, self.ramp_steps)
        return SteeringTerm(reward, schedule, make_transform(self.transform, self.clamp), name=self.label or self.name)


class SteeringConfig(ValidatedConfig):
    """Everything ``steerkit generate`` needs; CLI flags override file values."""

    lm: str = DEFAULT_LM
    rewards: list[RewardSpec] = []
    k: int = Field(default=20, ge=1)
    do_sample: bool = True
    temperature: float = Field(default=1.0, gt=0)
    max_new_tokens: int = Field(default=20, ge=1)
    num_return_sequences: int = Field(default=1, ge=1)
    seed: int | None = None
    chat_template: bool = False
    backend: Literal["torch", "onnx"] = "torch"
    device: DeviceName = None  # torch device for the LM and torch reward models: cpu (default), cuda, cuda:1, mps
    prompts: list[str] = []

    @classmethod
    def from_file(cls, path: str | Path) -> "SteeringConfig":
        return cls.from_dict(load_config_file(path), source=str(path))

    def with_overrides(self, values: dict) -> "SteeringConfig":
        return self.from_dict({**self.model_dump(), **values}, source="command-line options")

    def with_rewards(self, pairs: list[tuple[str, float]]) -> "SteeringConfig":
        rewards = [r.model_dump() for r in self.rewards] + [{"name": n, "beta": b} for n, b in pairs]
        return self.with_overrides({"rewards": rewards})

    def build_terms(self):
        return [spec.to_term(self.backend) for spec in self.rewards]

    def generate(self, prompts: list[str], **kwargs):
        from .decoding import RewardAugmentedGenerator
        from .devices import place
        from .models import load_causal_lm_cached

        model, tokenizer, _ = load_causal_lm_cached(self.lm)
        terms = self.build_terms()
        generator = RewardAugmentedGenerator(place(model, terms, self.device), tokenizer, terms, k=self.k)
        return generator.generate(
            prompts, max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, temperature=self.temperature,
            num_return_sequences=self.num_return_sequences, seed=self.seed, chat_template=self.chat_template, **kwargs)


def load_config_file(path: str | Path) -> dict:
    """Read a YAML, TOML or JSON file into a dict, with a ConfigError naming the file on failure."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {path} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in {".yaml", ".yml"}:
            import yaml

            data = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"{path}: unsupported config format {path.suffix!r}; use .yaml, .toml or .json.")
    except ConfigError:
        raise
    except Exception as exc:  # yaml/toml/json syntax errors
        raise ConfigError(f"{path} could not be parsed: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level, got {type(data).__name__}.")
    return data


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"Invalid {source}:"]
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}" + (f" (got {e['input']!r})" if e["type"] != "missing" else ""))
    return "\n".join(lines)

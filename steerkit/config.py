"""Configuration (pydantic): what to steer, with which rewards and weights, and how to sample.

``SteeringConfig.from_file("steer.yaml")`` (or ``.toml``) validates a file; unknown keys and bad values
raise :class:`~steerkit.errors.ConfigError` naming the path of the offending field (``rewards.1.beta``).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator,
)

from .devices import DeviceName
from .errors import ConfigError
from .models import DEFAULT_LM


def check_backend_name(name: str) -> str:
    """A registered reward backend (``torch``, ``onnx`` or a plugin's); the error lists the registered ones."""
    from .rewards.backends import check_backend

    return check_backend(name)


BackendName = Annotated[str, AfterValidator(check_backend_name)]
"""A config field naming a reward backend, validated against the table of registered backends."""


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
    _param: str | None = PrivateAttr(default=None)  # where a request wrote it (rewards.toxicity, rewards.0.name)

    @field_validator("beta", "beta_start")
    @classmethod
    def _beta(cls, v: float, info) -> float:
        from .steering import validate_beta

        return validate_beta(v, info.field_name)  # finite, and small enough for float32 scores

    @model_validator(mode="after")
    def _clamp_order(self):
        lo, hi = self.clamp
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"clamp must satisfy 0 <= low <= high <= 1, got {self.clamp}")
        return self


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
    backend: BackendName = "torch"
    device: DeviceName = None  # torch device for the LM and torch reward models: cpu (default), cuda, cuda:1, mps
    prompts: list[str] = []

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        from .steering import validate_temperature

        return validate_temperature(v)  # > 0 and finite in float32, the dtype scores are divided in

    @classmethod
    def from_file(cls, path: str | Path) -> "SteeringConfig":
        return cls.from_dict(load_config_file(path), source=str(path))

    def with_overrides(self, values: dict) -> "SteeringConfig":
        return self.from_dict({**self.model_dump(), **values}, source="command-line options")

    def with_rewards(self, pairs: list[tuple[str, float]]) -> "SteeringConfig":
        rewards = [r.model_dump() for r in self.rewards] + [{"name": n, "beta": b} for n, b in pairs]
        return self.with_overrides({"rewards": rewards})

    def build_terms(self):
        from .terms import terms_from_specs

        return terms_from_specs(self.rewards, backend=self.backend)

    def generate(self, prompts: list[str], **kwargs):
        from .decoding import RewardAugmentedGenerator
        from .devices import place, resolve_device
        from .models import load_causal_lm_cached

        resolve_device(self.device)  # a device this machine lacks fails now, not after seconds of loading
        model, tokenizer, _ = load_causal_lm_cached(self.lm)
        terms = self.build_terms()
        generator = RewardAugmentedGenerator(place(model, terms, self.device), tokenizer, terms, k=self.k)
        return generator.generate(
            prompts, max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, temperature=self.temperature,
            num_return_sequences=self.num_return_sequences, seed=self.seed, chat_template=self.chat_template, **kwargs)


#: A config expands to at most this many YAML nodes once aliases are followed (a billion-laughs file
#: has a handful of nodes that expand to billions); real steering, training and eval configs use hundreds.
MAX_CONFIG_NODES = 10_000


def load_config_file(path: str | Path) -> dict:
    """Read a YAML, TOML or JSON file into a dict, with a ConfigError naming the file on failure.

    Duplicate keys are errors (YAML and JSON would otherwise keep the last one silently), and a YAML file
    whose aliases expand beyond :data:`MAX_CONFIG_NODES` nodes is refused before anything is built.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {path} does not exist." if not path.exists() else
                          f"Config path {path} is not a file.")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}); "
                          "save it as UTF-8.") from None
    except OSError as exc:
        raise ConfigError(f"{path} could not be read: {exc.strerror or exc}.") from None
    try:
        if path.suffix in {".yaml", ".yml"}:
            data = _load_yaml(text, path)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_json_object_without_duplicates)
        else:
            raise ConfigError(f"{path}: unsupported config format {path.suffix!r}; use .yaml, .toml or .json.")
    except ConfigError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a configuration file.") from None
    except Exception as exc:  # yaml/toml/json syntax errors
        raise ConfigError(f"{path} could not be parsed: {_first_lines(str(exc))}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level, got {type(data).__name__}.")
    return data


def _load_yaml(text: str, path: Path):
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        loader.flatten_mapping(node)
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain value, "
                                  "not a list or mapping.") from None
            if key in seen:
                raise ConfigError(f"duplicate key {_key_path(loader, node, key)!r} at line "
                                  f"{key_node.start_mark.line + 1} (first at line {seen[key] + 1}); keep one.")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    loader = Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expansion(root, path)
        loader._paths = _node_paths(root)  # noqa: SLF001 - used to name duplicate keys by their path
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _check_expansion(root, path: Path) -> None:
    """Refuse documents whose aliases expand past MAX_CONFIG_NODES, or refer to themselves.

    Sizes are memoised per node (an alias is the same node object), so this takes time linear in the
    number of distinct nodes however far the aliases would expand.
    """
    sizes: dict[int, int] = {}
    ancestors: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            ancestors.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in _children(node)), MAX_CONFIG_NODES + 1)
            if sizes[key] > MAX_CONFIG_NODES:
                raise ConfigError(f"{path}: YAML aliases expand this document beyond {MAX_CONFIG_NODES:,} values; "
                                  "a configuration file never needs that many. Remove the repeated aliases.")
            continue
        if key in sizes:
            continue
        if key in ancestors:
            raise ConfigError(f"{path}: a YAML alias refers to a node that contains it; remove the cycle.")
        ancestors.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _node_paths(root) -> dict[int, str]:
    """Dotted path of every mapping node (first occurrence), for error messages."""
    import yaml

    paths: dict[int, str] = {}
    stack = [(root, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in paths:
            continue
        paths[id(node)] = where
        if isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                stack.append((value, f"{where}.{key}" if where else str(key)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((value, f"{where}.{i}" if where else str(i)) for i, value in enumerate(node.value))
    return paths


def _key_path(loader, node, key) -> str:
    parent = getattr(loader, "_paths", {}).get(id(node), "")
    return f"{parent}.{key}" if parent else str(key)


def _json_object_without_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"duplicate key {key!r} in a JSON object; keep one.")
        out[key] = value
    return out


def _first_lines(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _short_repr(value, limit: int = 80) -> str:
    """A bounded repr: never formats more than a few items of a structure, whatever its size."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxlevel = limit, limit, 6, 6, 3
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"Invalid {source}:"]
    for e in exc.errors(include_input=True, include_url=False)[:20]:
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {_short_repr(e['input'])})" if e["type"] != "missing" and "input" in e else ""
        message = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        lines.append(f"  {where}: {_first_lines(message, 200)}{got}")
    if exc.error_count() > 20:
        lines.append(f"  … and {exc.error_count() - 20} more")
    return "\n".join(lines)

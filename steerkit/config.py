"""Configuration (pydantic): what to steer, with which rewards and weights, and how to sample.

``SteeringConfig.from_file("steer.yaml")`` (or ``.toml``) validates a file; unknown keys and bad values
raise :class:`~steerkit.errors.ConfigError` naming the path of the offending field (``rewards.1.beta``).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .devices import DeviceName
from .errors import ConfigError, _first_lines, format_validation_error  # noqa: F401 (config's API)
from .models import DEFAULT_LM
from .params import RewardSpec  # noqa: F401 (the config's reward entries; steerkit.config.RewardSpec)
from .validators import ENGINES, LM_DTYPES


def check_backend_name(name: str) -> str:
    """A registered reward backend (``torch``, ``onnx`` or a plugin's) or ``auto``; the error lists them."""
    from .rewards.backends import check_backend

    return check_backend(name)


BackendName = Annotated[str, AfterValidator(check_backend_name)]
"""A config field naming a reward backend, validated against the table of registered backends."""

EngineName = Literal[ENGINES]
"""Which engine runs the LM (:data:`steerkit.validators.ENGINES`)."""

LMDtype = Literal[LM_DTYPES]
"""The LM's weights in steerkit's engine (:data:`steerkit.validators.LM_DTYPES`)."""


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
    backend: BackendName = "auto"  # each reward picks: an ONNX export runs on onnx, anything else on torch
    device: DeviceName = None  # torch device for the LM and torch reward models: cpu (default), cuda, cuda:1, mps
    #: which engine runs the LM: steerkit's own (transformers), or llama.cpp on a GGUF file (docs/llama_cpp.md)
    engine: EngineName = "steerkit"
    #: steerkit's engine on the static-shape step compiled by torch.compile (docs/performance.md, "CPU decoding")
    compile: bool = False
    #: the LM's weights in steerkit's engine: float32 as loaded, bfloat16 (bf16 weights and matmuls), weight-only int8
    dtype: LMDtype = "float32"
    prompts: list[str] = []

    @model_validator(mode="after")
    def _lm_options(self):
        from .validators import validate_lm_options

        validate_lm_options(self.engine, self.compile, self.dtype)
        return self

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        from .validators import validate_temperature

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
        """The steering terms of :attr:`rewards` (loaded for :attr:`backend`); the whole set-up (LM, device) is
        :func:`steerkit.assembly.assemble_config`."""
        from .terms import terms_from_specs

        return terms_from_specs(self.rewards, backend=self.backend)


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

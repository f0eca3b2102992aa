"""What the user asks for, parsed and validated once: the rewards input and :class:`SteerParams`.

Every surface only *translates* into these: ``generate``'s keyword arguments, a config file
(:class:`~steerkit.config.SteeringConfig`), the CLI's flags, an HTTP body (``steerkit serve``) and a batch
file. Like vLLM's ``SamplingParams``: a request becomes typed engine parameters once, and the engine never
re-checks them.

**Rewards input** (:func:`parse_rewards`, the one parser): ``{"toxicity": -10, "path/to/rm": 5}`` (reference
or reward object -> β), a list of reward specs (``{"name": ..., "beta": ..., "label": ..., "transform": ...,
"schedule": ...}`` or :class:`~steerkit.config.RewardSpec`), ``(reference, β)`` pairs, ready
:class:`~steerkit.steering.SteeringTerm` objects, and (where a surface allows it: the CLI) ``"name=β"``
strings. :func:`resolve_terms` turns the parsed entries into steering terms with a surface's loader: the
reward registry and reward-model directories (Python, CLI, config files), or the rewards a server serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .errors import InvalidArgumentError, SteerkitError, format_validation_error
from .steering import BetaSchedule, SteeringTerm, check_terms, make_transform
from .validators import (
    validate_beta, validate_int, validate_k, validate_sampling_temperature, validate_seed, validate_stop_strings,
    validate_temperature, validate_timeout,
)

FORMS = ("rewards must be a mapping of reward references to beta (in JSON: an object mapping reward names to beta, "
         "{'toxicity': -10, 'path/to/rm': 5}), or a list of reward specs ({'name': 'toxicity', 'beta': -10, 'label': "
         "..., 'transform': ..., 'schedule': ...}), SteeringTerm objects or (reference, beta) pairs "
         "([('toxicity', -10)])")

#: ``load(reference, context) -> Reward``: ``context`` is None where the entry did not state one.
Loader = Callable[[str, "str | None"], object]


def tag_param(exc: SteerkitError, param: str) -> SteerkitError:
    """Tag ``exc`` with the field to blame (the HTTP error body's ``param``)."""
    exc.param = param
    return exc


def _at(exc: SteerkitError, path: str) -> SteerkitError:
    """Tag ``exc`` with where in the rewards input it is (``rewards.toxicity``, ``rewards.0.name``)."""
    exc.path = path
    return exc


def parse_reward_string(text: str) -> tuple[str, float]:
    """``NAME=BETA`` or ``PATH=BETA`` (the last '=' splits, so paths may contain '=')."""
    ref, sep, beta = text.rpartition("=")
    if not sep or not ref:
        raise InvalidArgumentError(f"--reward expects REF=BETA (e.g. toxicity=-10), got {text!r}.")
    try:
        value = float(beta)
    except ValueError:
        raise InvalidArgumentError(f"--reward {text!r}: beta {beta!r} is not a number.") from None
    if not math.isfinite(value):
        raise InvalidArgumentError(f"--reward {text!r}: beta must be finite.")
    return ref, value


def _beta(beta, name) -> float | BetaSchedule:
    if isinstance(beta, BetaSchedule):
        return beta
    what = f"beta for reward {name!r}"
    if isinstance(beta, int) and not isinstance(beta, bool):
        try:
            float(beta)
        except OverflowError:
            raise InvalidArgumentError(f"{what} must be a finite number, got an integer of {len(str(beta))} "
                                       "digits.") from None
    return validate_beta(beta, what)


def _reference(ref, i: int, param: str):
    """A reward reference (non-empty, valid Unicode) or a reward object (anything with ``start``)."""
    if isinstance(ref, str):
        if not ref:
            raise _at(InvalidArgumentError(f"Reward {i} has an empty reference; name a registered reward, a "
                                           "reward-model directory or a served reward."), param)
        return ref
    if not callable(getattr(ref, "start", None)):
        raise _at(InvalidArgumentError(
            f"Reward {i} ({ref!r:.80}) is neither a reward reference (a registered name or a reward-model "
            "directory) nor a Reward object with a start() method."), param)
    return ref


def _spec_from_dict(data: Mapping, i: int):

    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _at(InvalidArgumentError(f"Reward {i} needs a non-empty name (a registered or served reward), "
                                       f"got {name!r:.80}."), f"rewards.{i}.name")
    if "beta" not in data:
        raise _at(InvalidArgumentError(f"Reward {name!r} needs a beta (a number; < 0 steers away)."),
                     f"rewards.{i}.beta")
    _beta(data["beta"], name)
    try:
        return RewardSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidArgumentError(format_validation_error(exc, f"reward spec {i} ({name!r})")) from None


def _entry(item, i: int, strings: bool):
    """One list item as a RewardSpec, a SteeringTerm or a ``(reward object, β)`` pair."""
    if isinstance(item, (SteeringTerm, RewardSpec)):
        return item
    if isinstance(item, Mapping):
        return _spec_from_dict(item, i)
    if strings and isinstance(item, str):
        ref, beta = parse_reward_string(item)
        return _pair(ref, beta, i, f"rewards.{i}")
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return _pair(item[0], item[1], i, f"rewards.{i}")
    raise InvalidArgumentError(f"{FORMS}; item {i} is {item!r:.80}.")


def _pair(ref, beta, i: int, param: str):
    ref = _reference(ref, i, param)
    name = ref if isinstance(ref, str) else getattr(ref, "name", "?")
    beta = _beta(beta, name)
    if isinstance(ref, str) and not isinstance(beta, BetaSchedule):
        spec = RewardSpec.model_construct(name=ref, beta=beta)  # checked above; any text (a lookup refuses it)
        spec._param = param
        return spec
    return (ref, beta)


def parse_rewards(value, *, strings: bool = False) -> list | None:
    """The rewards input as a list of entries (RewardSpec, SteeringTerm or ``(reward, β)``), or None (the
    surface's default). Every β is checked before anything is loaded; ``strings`` allows ``"name=β"`` items.
    Errors are :class:`~steerkit.errors.InvalidArgumentError` whose ``param`` names the entry."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return [_pair(ref, beta, i, f"rewards.{ref}" if isinstance(ref, str) else f"rewards.{i}")
                for i, (ref, beta) in enumerate(value.items())]
    if strings and isinstance(value, str):
        value = [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{FORMS}; got {type(value).__name__} {value!r:.80}.")
    entries = []
    for i, item in enumerate(value):
        entry = _entry(item, i, strings)
        if isinstance(entry, RewardSpec) and entry._param is None:
            entry = entry.model_copy()
            entry._param = f"rewards.{i}.name"
        entries.append(entry)
    return entries


def make_term(reward, beta, name: str = "", transform: str = "none",
              clamp: tuple[float, float] = (0.0, 1.0)) -> SteeringTerm:
    """A steering term of a loaded reward: β (a number or a schedule), the named transform, the term's name
    (empty: the reward's own)."""
    return SteeringTerm(reward, beta, make_transform(transform, clamp), name=name)


def resolve_terms(entries, load: Loader) -> list[SteeringTerm]:
    """The steering terms of parsed ``entries`` (see :func:`parse_rewards`), rewards found by ``load``;
    checked like any steerkit terms: distinct names, Σ|β| within float32."""
    if not entries:
        return []
    terms = []
    for entry in entries:
        if isinstance(entry, SteeringTerm):
            terms.append(entry)
        elif isinstance(entry, tuple):
            reward = entry[0] if not isinstance(entry[0], str) else load(entry[0], None)
            terms.append(make_term(reward, entry[1], entry[0] if isinstance(entry[0], str) else ""))
        else:
            context = entry.context if "context" in entry.model_fields_set else None
            try:
                reward = load(entry.name, context)
            except SteerkitError as exc:
                if getattr(exc, "path", None) is None and getattr(entry, "_param", None):
                    exc.path = entry._param
                raise
            schedule = BetaSchedule(entry.beta, entry.schedule, entry.beta_start, entry.ramp_steps)
            terms.append(make_term(reward, schedule, entry.label or entry.name, entry.transform, entry.clamp))
    return check_terms(terms)


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
        return validate_beta(v, info.field_name)  # finite, and small enough for float32 scores

    @model_validator(mode="after")
    def _clamp_order(self):
        lo, hi = self.clamp
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"clamp must satisfy 0 <= low <= high <= 1, got {self.clamp}")
        return self


@dataclass(frozen=True)
class SteerParams:
    """How to steer and sample one row, validated (build it with :meth:`create`).

    ``k`` None: the engine's default; ``rewards`` None: the surface's default steering (parsed entries
    otherwise, see :func:`parse_rewards`); ``temperature`` 0 is greedy; ``stop`` ends a row at the first
    completed stop string, kept in the text when ``include_stop``; ``timeout_s`` counts from submission.
    """

    max_new_tokens: int = 20
    k: int | None = None
    rewards: tuple | None = None
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    include_stop: bool = True
    trace: bool = False
    timeout_s: float | None = None

    @classmethod
    def create(cls, *, max_new_tokens=20, k=None, rewards=None, temperature=1.0, do_sample: bool = True,
               seed=None, stop=None, include_stop: bool = True, trace: bool = False, timeout_s=None,
               vocab_size: int | None = None, names: Mapping[str, str] | None = None,
               strings: bool = False, zero_temperature: bool = True) -> "SteerParams":
        """Validate every field with steerkit's validators; an error carries ``.param``, the field to blame
        (``names`` maps a field to the surface's name for it, e.g. ``max_new_tokens`` -> ``max_tokens``).
        ``vocab_size`` (the LM's) bounds ``k``. ``zero_temperature``: temperature 0 means greedy (OpenAI's
        convention); otherwise greedy is ``do_sample=False`` (transformers') and 0 is refused."""
        names = names or {}
        checks = {
            "max_new_tokens": lambda: validate_int(names.get("max_new_tokens", "max_new_tokens"), max_new_tokens),
            "temperature": lambda: 0.0 if not do_sample else (
                validate_sampling_temperature(temperature) if zero_temperature else validate_temperature(temperature)),
            "k": lambda: None if k is None else (validate_int("k", k) if vocab_size is None
                                                 else validate_k(k, vocab_size)),
            "seed": lambda: validate_seed(seed),
            "stop": lambda: tuple(validate_stop_strings(stop)),
            "timeout_s": lambda: validate_timeout(timeout_s),
            "rewards": lambda: None if rewards is None else tuple(parse_rewards(rewards, strings=strings)),
        }
        values = {}
        for field, check in checks.items():
            try:
                values[field] = check()
            except SteerkitError as exc:
                raise tag_param(exc, names.get(field, field)) from None
        return cls(include_stop=bool(include_stop), trace=bool(trace), **values)

    def with_seed(self, seed: int | None) -> "SteerParams":
        return replace(self, seed=seed)

"""The validators every entry point shares (Python API, config files, the CLI, the HTTP server, the
``LogitsProcessor``): one message per mistake, whichever surface it came through."""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np
import torch

from .errors import InvalidArgumentError
from .seeds import SEED_RANGE

#: Largest |β| of one term, and of the sum of |β| over all terms. Scores are float32 (max ≈ 3.4e38) and
#: ``z + Σ β ρ`` with ρ in [0, 1] must stay finite: 1e30 leaves eight orders of magnitude of headroom for the
#: logits and for rewards somewhat outside [0, 1], while already being far past the point (|β| ≈ 1e3–1e6)
#: where the reward alone decides the token.
MAX_ABS_BETA = 1e30


_FLOAT32 = torch.finfo(torch.float32)


def validate_int(name: str, value, minimum: int | None = 1, maximum: int | None = None, *,
                 hint: str = "") -> int:
    """``value`` as a Python int: any integral (int, numpy integer, ...) but not a bool, within the bounds."""
    try:
        if isinstance(value, (bool, np.bool_)):  # numpy's too: operator.index of it warns, then fails (numpy 2)
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        if minimum == 1 and maximum is None:
            expected = "a positive integer"
        elif maximum is None:
            expected = f"an integer >= {minimum}"
        else:
            expected = f"an integer in [{minimum}, {maximum}]"
        raise InvalidArgumentError(f"{name} must be {expected}{hint}, got {value!r}.")
    return number


def validate_k(k, vocab_size: int) -> int:
    return validate_int("k", k, 1, vocab_size, hint=" (the LM's vocabulary size)")


def validate_seed(seed) -> int | None:
    if seed is None:
        return None
    lo, hi = SEED_RANGE
    return validate_int("seed", seed, lo, hi, hint=" (what torch.manual_seed accepts: -2**63 to 2**64 - 1) or None")


def validate_beta(value, what: str = "beta") -> float:
    """A real number with |β| <= :data:`MAX_ABS_BETA` (finite in float32 with headroom), as a float."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)) or (
            isinstance(value, torch.Tensor) and value.numel() != 1):
        raise InvalidArgumentError(f"{what} must be a number, got {value!r} ({type(value).__name__}).")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{what} must be a finite number, got {value!r}.")
    if abs(number) > MAX_ABS_BETA:
        raise InvalidArgumentError(
            f"{what} = {value!r} is too large: |beta| must be at most {MAX_ABS_BETA:g} (scores are float32, "
            f"max {_FLOAT32.max:.3g}); any |beta| above about 1e6 already lets the reward alone pick the token.")
    return number


def validate_temperature(temperature) -> float:
    """A real number that is finite and > 0 as a float32 (the dtype the scores are divided in)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise InvalidArgumentError(f"temperature must be a number > 0, got {temperature!r}.")
    value = float(temperature)
    as_f32 = torch.tensor(value, dtype=torch.float32).item() if math.isfinite(value) else value
    if not (math.isfinite(as_f32) and as_f32 > 0):
        raise InvalidArgumentError(
            f"temperature must be a number > 0 that stays finite and non-zero in float32 (about {2.0 ** -149:.2g} "
            f"to {_FLOAT32.max:.3g}), got {temperature!r}; use do_sample=False for greedy decoding.")
    return value


def validate_stop_strings(stop_strings) -> list[str]:
    """``None``, one string, or a list of non-empty strings that are valid Unicode."""
    if stop_strings is None:
        return []
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    try:
        items = list(stop_strings)
    except TypeError:
        raise InvalidArgumentError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}.") from None
    for i, s in enumerate(items):
        if not isinstance(s, str) or not s:
            raise InvalidArgumentError(
                f"stop_strings[{i}] is {s!r}: stop strings must be non-empty strings (an empty one would match "
                "before any text is generated).")
        check_unicode(s, f"stop_strings[{i}]")
    return items


def check_unicode(text: str, what: str) -> None:
    """A typed error naming the position of a lone surrogate (not encodable, tokenizers reject it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} has an invalid character {text[exc.start]!r} (a lone surrogate) at position {exc.start}; "
            "it is not valid Unicode text. Remove it, or decode the source bytes with errors='replace'."
        ) from None


def validate_prompts(prompts) -> list[str]:
    """A string or a list of non-empty, valid-Unicode strings, as a list (what ``generate`` and ``steerkit
    calibrate`` take)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if prompts is None or isinstance(prompts, (bytes, dict)) or not hasattr(prompts, "__iter__"):
        raise InvalidArgumentError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}.")
    prompts = list(prompts)
    if not prompts:
        raise InvalidArgumentError("No prompts given: pass at least one non-empty prompt string.")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise InvalidArgumentError(f"Prompt {i} is empty or not a string ({p!r}); every prompt needs some text.")
        check_unicode(p, f"Prompt {i}")
    return prompts


def validate_timeout(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"timeout_s must be a number of seconds > 0 or None, got {value!r}.")
    return float(value)


def validate_sampling_temperature(value) -> float:
    """0 (greedy, OpenAI's convention) or what :func:`validate_temperature` accepts."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == 0:
            return 0.0
        if value < 0:
            raise InvalidArgumentError(f"temperature must be >= 0 (0 is greedy decoding), got {value!r}.")
    return validate_temperature(value)


#: The engines that can run the LM: steerkit's own (transformers) and llama.cpp (a GGUF file, ``[llama-cpp]``).
ENGINES = ("steerkit", "llama.cpp")


def validate_engine(engine) -> str:
    if engine not in ENGINES:
        raise InvalidArgumentError(f"engine={engine!r}: choose one of {', '.join(map(repr, ENGINES))} "
                                   "('llama.cpp' runs a GGUF file through llama-cpp-python; docs/llama_cpp.md).")
    return engine


def validate_engine_device(engine: str, device: str | None) -> None:
    """llama.cpp runs the LM on the CPU here: another (resolved) torch device needs steerkit's engine."""
    if engine == "llama.cpp" and device not in (None, "cpu"):
        raise InvalidArgumentError(f"engine='llama.cpp' runs on the CPU here; device={device!r} needs the default "
                                   "engine (engine='steerkit').")


#: The weights steerkit's engine runs the LM in: as loaded, bf16 with bf16 matmuls, or weight-only int8
#: (:mod:`steerkit.engine.lm_int8`).
LM_DTYPES = ("float32", "bfloat16", "int8")


def validate_lm_options(engine, compile, dtype) -> tuple[str, bool, str]:
    """``engine``, ``compile`` and ``dtype`` of the LM, checked together: compile and int8 are steerkit's engine's
    (llama.cpp runs a GGUF file at the precision it was written in)."""
    engine = validate_engine(engine)
    if not isinstance(compile, bool):
        raise InvalidArgumentError(f"compile must be True or False, got {compile!r}.")
    if dtype not in LM_DTYPES:
        raise InvalidArgumentError(f"dtype={dtype!r}: choose one of {', '.join(map(repr, LM_DTYPES))} (the LM's "
                                   "weights: as loaded, bf16 weights and matmuls, or weight-only int8).")
    if engine == "llama.cpp" and (compile or dtype != "float32"):
        raise InvalidArgumentError(
            "compile and dtype apply to engine='steerkit'; llama.cpp runs a GGUF file at the precision it was "
            "written in (write a Q8_0 file with steerkit.integrations.gguf_files.convert_gguf; docs/llama_cpp.md).")
    return engine, compile, dtype

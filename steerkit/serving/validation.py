"""Checking a :class:`~steerkit.serving.requests.RowSpec` before it is queued: steerkit's own validators (so the
messages match ``steerkit.generate`` and config files), each error tagged with ``.param``, the field to blame."""

from __future__ import annotations

import math

from ..errors import InvalidArgumentError, PromptTooLongError, SteerkitError
from ..steering import (
    check_unicode, validate_int, validate_k, validate_seed, validate_stop_strings, validate_temperature,
)
from .requests import RowHandle, RowSpec
from .row_terms import row_terms
from .rows import Row


def _param(exc: SteerkitError, param: str) -> SteerkitError:
    exc.param = param  # the RowSpec field to blame (the HTTP layer's error body names it)
    return exc


def prepare_row(engine, spec: RowSpec, handle: RowHandle | None) -> Row | None:
    """Check ``spec`` against ``engine`` (its vocabulary, context, rewards and defaults) with steerkit's
    validators; a typed error carries ``.param``, the RowSpec field to blame. With a handle: the Row to queue."""
    if not isinstance(spec, RowSpec):
        raise InvalidArgumentError(f"expected a RowSpec, got {type(spec).__name__}")
    prompt = spec.prompt
    if not isinstance(prompt, str) or not prompt:
        raise _param(InvalidArgumentError(f"The prompt is empty or not a string ({prompt!r:.40}); give some "
                                          "text."), "prompt")
    try:
        check_unicode(prompt, "The prompt")
    except SteerkitError as exc:
        raise _param(exc, "prompt") from None
    checks = {
        "max_tokens": lambda: validate_int("max_tokens", spec.max_tokens),
        "temperature": lambda: _temperature(spec.temperature),
        "k": lambda: engine.default_k if spec.k is None else validate_k(spec.k, engine.vocab_size),
        "seed": lambda: validate_seed(spec.seed),
        "stop": lambda: validate_stop_strings(spec.stop),
        "timeout_s": lambda: _timeout(spec.timeout_s),
        "rewards": lambda: row_terms(engine.default_rewards if spec.rewards is None else spec.rewards,
                                     engine.lookup),
    }
    values = {}
    for name, check in checks.items():
        try:
            values[name] = check()
        except SteerkitError as exc:
            raise _param(exc, name) from None
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise _param(InvalidArgumentError("The prompt encodes to no tokens; give some text."), "prompt")
    if engine.context is not None and len(ids) + values["max_tokens"] > engine.context:
        raise _param(PromptTooLongError(
            f"The prompt has {len(ids)} tokens; with max_tokens={values['max_tokens']} that exceeds the "
            f"model's context of {engine.context} tokens. Shorten the prompt or lower max_tokens."), "prompt")
    if handle is None:
        return None
    timeout = values["timeout_s"]
    return Row(spec, handle, ids, values["rewards"], values["k"], values["temperature"], values["stop"],
               values["seed"], None if timeout is None else handle.submitted + timeout)


def _temperature(value) -> float:
    """0 (greedy, OpenAI's convention) or what :func:`~steerkit.steering.validate_temperature` accepts."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == 0:
            return 0.0
        if value < 0:
            raise InvalidArgumentError(f"temperature must be >= 0 (0 is greedy decoding), got {value!r}.")
    return validate_temperature(value)


def _timeout(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"timeout_s must be a number of seconds > 0 or None, got {value!r}.")
    return float(value)

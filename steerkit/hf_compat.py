"""The one place that knows how the supported transformers releases name a model's KV cache.

transformers renamed the ``past_key_values`` argument of every model's ``forward`` (and the output field of
the same name) to ``cache``; the old name warns (a ``FutureWarning``) and stops working in 5.40. Every model
call in steerkit that passes a cache goes through :func:`cache_kwargs`, and every read of the returned cache
through :func:`output_cache`, so the supported range (``pyproject.toml``) is handled here and nowhere else.

>>> from steerkit.testing import make_tokenizer, tiny_lm
>>> model = tiny_lm(make_tokenizer())
>>> list(cache_kwargs(model, None)) == [cache_argument(model)]
True
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

__all__ = ["cache_kwargs", "cache_argument", "output_cache"]


@functools.lru_cache(maxsize=None)
def _library_default() -> str:
    """The name this transformers release uses, read off a model class every release has."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


@functools.lru_cache(maxsize=None)
def _argument_of(cls: type) -> str | None:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return None
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    return None


def cache_argument(model) -> str:
    """``"cache"`` or ``"past_key_values"``: the keyword ``model.forward`` takes its KV cache by.

    A wrapper whose ``forward`` takes ``**kwargs`` only (a peft model) is looked through to the model it wraps.
    """
    m = model
    for _ in range(4):
        name = _argument_of(type(m))
        if name is not None:
            return name
        inner = getattr(m, "get_base_model", None)
        if not callable(inner):
            break
        m = inner()
    return _library_default()


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(**..., **cache_kwargs(model, cache))``."""
    return {cache_argument(model): cache}


def output_cache(output):
    """The cache a model's output holds (``output.cache``, or ``output.past_key_values`` before the rename),
    read without touching the deprecated alias."""
    names = {f.name for f in dataclasses.fields(output)} if dataclasses.is_dataclass(output) else set()
    if "cache" in names:
        return output.cache
    return output.past_key_values

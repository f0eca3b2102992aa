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

import copy
import dataclasses
import functools
import inspect

__all__ = ["cache_kwargs", "cache_argument", "output_cache", "static_cache", "set_static_write_column", "take_cache_rows",
           "takes_cache"]


@functools.lru_cache(maxsize=None)
def _library_default() -> str:
    """The name this transformers release uses, read off a model class every release has."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


#: ``_argument_of``'s answers per class: a plain dictionary, which torch.compile reads inside a compiled forward (the
#: reward model's, :mod:`steerkit.rewards.sequence.static_cache`) without tracing into a cache wrapper
_ARGUMENTS: dict[type, str | None] = {}


def _argument_of(cls: type) -> str | None:
    if cls not in _ARGUMENTS:
        try:
            params = inspect.signature(cls.forward).parameters
        except (TypeError, ValueError, AttributeError):
            params = {}
        _ARGUMENTS[cls] = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
    return _ARGUMENTS[cls]


def _named_argument(model) -> str | None:
    """The KV-cache keyword ``model.forward`` names, looking through a wrapper whose ``forward`` takes ``**kwargs``
    only (a peft model) to the model it wraps; None when none names one."""
    m = model
    for _ in range(4):
        name = _argument_of(type(m))
        if name is not None:
            return name
        inner = getattr(m, "get_base_model", None)
        if not callable(inner):
            break
        m = inner()
    return None


def cache_argument(model) -> str:
    """``"cache"`` or ``"past_key_values"``: the keyword ``model.forward`` takes its KV cache by (the installed
    transformers' name where the model names neither)."""
    return _named_argument(model) or _library_default()


def takes_cache(model) -> bool:
    """Whether ``model.forward`` (or the model a wrapper wraps) names a KV-cache argument."""
    return _named_argument(model) is not None


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


def static_cache(model, slots: int, width: int, heads: int, head_dim: int, dtype, device, *,
                 static_addresses: bool = True):
    """A transformers ``StaticCache`` of ``slots`` rows × ``width`` tokens per layer, its tensors allocated now
    (zeros), for the static-shape step (:mod:`steerkit.engine.static_lm`).

    transformers marks the tensors as static addresses (for CUDA graphs). ``static_addresses=False`` takes the mark
    off: a step compiled with frozen weights treats marked inputs like weights, folding the first cache's tensors
    into the graph, so that a later cache of the same shape would be read and written through the old one's."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=width)
    cache.early_initialization(slots, heads, head_dim, dtype, device)
    if not static_addresses:
        for layer in cache.layers:
            for tensor in vars(layer).values():
                if hasattr(tensor, "_dynamo_static_input_type"):
                    del tensor._dynamo_static_input_type
    return cache


def take_cache_rows(cache, index, start: int = 0) -> None:
    """Make every layer of a ``DynamicCache`` hold rows ``index`` (a repeated row is a copy), from column ``start`` on:
    the one place that reaches into its layers' ``keys`` and ``values`` to select rows."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None:  # a layer nothing has been written to yet (an empty prefix)
            continue
        layer.keys = layer.keys.index_select(0, index)[:, :, start:]
        layer.values = layer.values.index_select(0, index)[:, :, start:]


def cache_of_rows(cache, index):
    """A new ``DynamicCache`` holding rows ``index`` of ``cache`` (a repeated row is a copy); ``cache`` itself is left
    as it is, and a forward that extends the new one does not extend it."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    take_cache_rows(out, index)
    return out


def set_static_write_column(cache, column: int) -> None:
    """Make ``column`` the next one a step writes in every layer of a ``StaticCache``.

    transformers before 5.2x wrote where the forward's ``cache_position`` said (which the static step passes); later
    releases keep the write position in each layer's ``cumulative_length`` tensor, set here in place (its address is
    what a compiled step reads)."""
    import torch

    for layer in cache.layers:
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.fill_(column)

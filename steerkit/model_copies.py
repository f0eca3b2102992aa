"""Converted copies of a model, made once per model object: the bf16 reward backbone
(:func:`steerkit.rewards.precision.as_reduced`), the llama.cpp copy of a torch reward model
(:func:`steerkit.rewards.llama_cpp.model.as_llama_cpp`) and the int8 LM (:func:`steerkit.engine.lm_int8.as_int8`).

The copy lives as long as the model it was made from (a weak key) and is made under a lock, so two threads that ask
at once share one copy. Changes to the model's weights after the copy was made are not seen by it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

_lock = threading.Lock()
_COPIES: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def converted_copy(model, kind: str, convert: Callable):
    """``convert(model)``, computed once per (model object, ``kind``) and process."""
    with _lock:
        by_kind = _COPIES.setdefault(model, {})
        if kind not in by_kind:
            by_kind[kind] = convert(model)
        return by_kind[kind]

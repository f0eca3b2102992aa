"""llama-cpp-python's C API, loaded once for every part of steerkit that drives llama.cpp: the LM engine
(``engine="llama.cpp"``, :mod:`steerkit.engine.llama_cpp_lm`) and the reward backends ``llama.cpp`` and
``llama.cpp-q8`` (:mod:`steerkit.rewards.llama_cpp`).

:func:`load` imports it (a missing build is the caller's typed error, with :data:`INSTALL`) and, once per process,
sends llama.cpp's log to stderr only for errors: llama.cpp logs every model load and context line by default.
:func:`model_params` are the parameters of every model steerkit loads (:func:`load_llama` for ``llama_cpp.Llama``).
"""

from __future__ import annotations

import ctypes
import os
import threading

#: how to install llama-cpp-python for this CPU (a source build; docs/llama_cpp.md)
INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install "steerkit-rad[llama-cpp]"'

_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5  # the continuation of the previous line
_lock = threading.Lock()
_callback = None  # the installed log callback (kept alive: llama.cpp holds a pointer to it)


def load(error: type[Exception], what: str):
    """The ``llama_cpp`` module, with llama.cpp's logging quieted; ``error(...)`` naming ``what`` and the install
    command when llama-cpp-python is not installed."""
    global _callback
    try:
        import llama_cpp
    except ImportError:
        raise error(f"{what} needs llama-cpp-python, which is not installed: {INSTALL} (a source build, about 5 "
                    "minutes once; docs/llama_cpp.md).") from None
    with _lock:
        if _callback is None:
            @llama_cpp.llama_log_callback
            def _log(level, text, _user):
                if level >= _GGML_LOG_LEVEL_ERROR and level != _GGML_LOG_LEVEL_CONT:
                    os.write(2, text)

            llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
            _callback = _log
            llama_cpp.llama_backend_init()
    return llama_cpp


def uses_amx(lib) -> bool:
    """Whether this llama.cpp build multiplies on AMX on this CPU: its system info reads ``AMX_INT8 = 1`` (built
    with AMX, as ``-DGGML_NATIVE=ON`` builds on a CPU that has it, and running on one)."""
    return b"AMX_INT8 = 1" in (lib.llama_print_system_info() or b"")


def model_params(lib):
    """llama.cpp's model parameters for every model steerkit loads: on the CPU (no GPU layers) and, where the build
    uses AMX (:func:`uses_amx`), without llama.cpp's extra buffer types, the AMX weight repacking. With it, the first
    decode of the packaged SmolLM2 Q4_1 model segfaulted in llama-cpp-python 0.3.36 on a Xeon with AMX, in
    llama.cpp's own generate as in steerkit's; without it the model runs there (the crash is llama.cpp's: see
    ggml-org/llama.cpp#20824; docs/llama_cpp.md, "CPUs with AMX")."""
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    if uses_amx(lib):
        params.use_extra_bufts = False
    return params


_default_params_lock = threading.Lock()


def load_llama(model_path, **kwargs):
    """``llama_cpp.Llama(model_path=model_path, **kwargs)``, loaded with :func:`model_params`'s guard where the build
    uses AMX: for callers of llama-cpp-python's own loop (:class:`~steerkit.integrations.llama_cpp.LlamaCppRAD`).
    ``Llama`` takes no option for llama.cpp's extra buffer types, so for the load its module's default model
    parameters are :func:`model_params`'s (under a lock; restored after). Elsewhere exactly ``llama_cpp.Llama``."""
    from .errors import ModelFormatError

    lib = load(ModelFormatError, "load_llama")
    if not uses_amx(lib):
        return lib.Llama(model_path=str(model_path), **kwargs)
    import llama_cpp.llama_cpp as low  # the module whose default parameters Llama.__init__ reads

    with _default_params_lock:
        default = low.llama_model_default_params
        low.llama_model_default_params = lambda: model_params(lib)  # lib's own binding is the original
        try:
            return lib.Llama(model_path=str(model_path), **kwargs)
        finally:
            low.llama_model_default_params = default


class Batch:
    """One ``llama_batch`` of room for ``capacity`` tokens (token ids, or input embeddings of width ``embd``), one
    sequence per token, filled from arrays: positions, token ids and output flags through numpy views of its
    buffers; a token's sequence id is written only where it changed since the last fill (a decode step's rows
    keep theirs), so a steady decode loop writes no per-row Python values."""

    def __init__(self, lib, capacity: int, embd: int = 0):
        import ctypes
        import weakref

        import numpy as np

        self.batch = batch = lib.llama_batch_init(capacity, embd, 1)
        weakref.finalize(self, lib.llama_batch_free, batch)
        self.capacity = capacity
        self.pos = np.ctypeslib.as_array(batch.pos, shape=(capacity,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(capacity,))[:] = 1
        self.logits = np.ctypeslib.as_array(batch.logits, shape=(capacity,))
        self.token = None if embd else np.ctypeslib.as_array(batch.token, shape=(capacity,))
        self.embd = np.ctypeslib.as_array(ctypes.cast(batch.embd, ctypes.POINTER(ctypes.c_float)),
                                          shape=(capacity, embd)) if embd else None
        self._seqs: list[int] = []  # what seq_id[i][0] holds for i < len(_seqs)

    def fill(self, positions, seqs, outputs, *, tokens=None, embeddings=None) -> int:
        """Write the first ``n = len(positions)`` tokens (n ≤ capacity); returns n."""
        n = len(positions)
        self.batch.n_tokens = n
        self.pos[:n] = positions
        self.logits[:n] = outputs
        if tokens is not None:
            self.token[:n] = tokens
        else:
            self.embd[:n] = embeddings
        seqs = list(seqs)
        if seqs != self._seqs[:n]:
            seq_id = self.batch.seq_id
            known = self._seqs
            for i, s in enumerate(seqs):
                if i >= len(known) or known[i] != s:
                    seq_id[i][0] = s
            self._seqs = seqs + known[n:]
        return n

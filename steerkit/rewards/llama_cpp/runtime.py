"""One llama.cpp context over a reward backbone's GGUF, shared by every scoring cache of one model.

The context has a *unified* KV cache (``kv_unified``): a cell belongs to a set of sequences, so copying a sequence
(``llama_memory_seq_cp``) only adds a sequence id to its cells. Each cache row owns a sequence; the k candidate
blocks of a step each get a sequence that shares the row's prefix cells (a metadata copy), so one ``llama_decode``
scores them all, each candidate seeing its prefix and itself only (llama.cpp masks by sequence and position).

Sequences come from a pool (``n_seq_max``); released ones are cleared by the next thread that decodes, never
concurrently with a decode (a finalizer may release them from any thread). The context grows when its cells run
out: a bigger one is made and every live sequence is moved into it (``llama_state_seq_get_data`` /
``set_data``).

Inputs are embeddings, not token ids (see :mod:`.export`); outputs are llama.cpp's ``embeddings``: the final-norm
hidden state of each token marked as output.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref

import numpy as np
import torch

from ...errors import SteerkitError
from ...llama_cpp_lib import Batch, load as load_lib, model_params

#: tokens per llama_decode call at most (longer batches are split, in order)
BATCH_TOKENS = 2048
#: sequences per context: rows plus pending candidates of every cache of the model (llama.cpp allows up to 256)
DEFAULT_SEQUENCES = 256
#: KV cells of a new context (grown by doubling when full; ``$STEERKIT_LLAMA_CPP_CELLS`` overrides)
DEFAULT_CELLS = 4096
GGML_TYPE = {"f32": 0, "f16": 1}


class LlamaCppRewardError(SteerkitError):
    """llama.cpp refused a reward-model step (a failed decode, no sequences left, no memory for the KV cache)."""


def import_llama_cpp():
    """llama-cpp-python (:func:`steerkit.llama_cpp_lib.load`); its absence is an ExportError with the fix."""
    from ...errors import ExportError

    return load_lib(ExportError, "backend 'llama.cpp'")


class LlamaCppRuntime:
    """A GGUF backbone in llama.cpp: ``decode`` embeddings into sequences, read hidden states; sequence bookkeeping."""

    def __init__(self, path, *, hidden: int, kv_type: str = "f32", threads: int | None = None,
                 sequences: int = DEFAULT_SEQUENCES, cells: int | None = None):
        self.lib = lib = import_llama_cpp()
        lib.llama_backend_init()
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params(lib))
        if not self.model:
            raise LlamaCppRewardError(f"llama.cpp could not load the reward backbone {path}.")
        weakref.finalize(self, lib.llama_model_free, self.model)
        self.path = str(path)
        self.hidden = int(hidden)
        self.kv_type = kv_type
        self.threads = int(threads or torch.get_num_threads())
        self.sequences = int(sequences)
        self.cells = 0
        self.ctx = None
        self._free_ctx = None
        self._lock = threading.RLock()
        self._free: list[int] = []
        self._released: list[int] = []
        self._live: set[int] = set()
        self._make_context(int(cells or os.environ.get("STEERKIT_LLAMA_CPP_CELLS", 0) or DEFAULT_CELLS))
        self._batch = Batch(lib, BATCH_TOKENS, self.hidden)

    def __repr__(self) -> str:
        return f"LlamaCppRuntime({self.path!r}, cells={self.cells}, sequences={self.sequences})"

    def _make_context(self, cells: int):
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = cells
        params.n_batch = params.n_ubatch = BATCH_TOKENS
        params.n_seq_max = self.sequences
        params.n_outputs_max_per_seq = BATCH_TOKENS
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = 0  # LLAMA_POOLING_TYPE_NONE: one hidden state per output token
        params.flash_attn_type = 0
        params.type_k = params.type_v = GGML_TYPE[self.kv_type]
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise LlamaCppRewardError(f"llama.cpp could not make a reward context of {cells} cells and "
                                      f"{self.sequences} sequences (out of memory?).")
        old = self._free_ctx
        self.ctx, self.cells = ctx, cells
        self.memory = lib.llama_get_memory(ctx)
        self._free_ctx = weakref.finalize(self, lib.llama_free, ctx)
        if not self._free and not self._live:
            self._free = list(range(self.sequences))[::-1]
        return old

    # -- sequences ----------------------------------------------------------------------------------------
    def take(self, count: int) -> list[int] | None:
        """``count`` free sequence ids, or None when fewer are free."""
        with self._lock:
            self._flush()
            if len(self._free) < count:
                return None
            seqs = [self._free.pop() for _ in range(count)]
            self._live.update(seqs)
            return seqs

    def take_or_raise(self, count: int, what: str, advice: str) -> list[int]:
        """``count`` free sequence ids for ``what``; :class:`LlamaCppRewardError` (ending with ``advice``) when fewer
        are free."""
        seqs = self.take(count)
        if seqs is None:
            raise LlamaCppRewardError(f"no {count} free llama.cpp sequences for {what} (the reward context has "
                                      f"{self.sequences}, for rows and pending candidates together): {advice}.")
        return seqs

    def release(self, seqs) -> None:
        """Give sequences back (any thread): cleared by the next call that holds the lock."""
        with self._lock:
            self._released.extend(seqs)

    def drop(self, seqs) -> None:
        """Clear sequences now and give them back (caller's thread, between decodes)."""
        with self._lock:
            for s in seqs:
                self.lib.llama_memory_seq_rm(self.memory, s, -1, -1)
                if s in self._live:
                    self._live.discard(s)
                    self._free.append(s)

    def _flush(self) -> None:
        if self._released:
            released, self._released = self._released, []
            self.drop(released)

    def copy(self, src: int, dst: int, start: int = -1) -> None:
        """Let ``dst`` share ``src``'s cells from position ``start`` on (all with -1): metadata only."""
        self.lib.llama_memory_seq_cp(self.memory, src, dst, start, -1)

    def cut(self, seq: int, start: int) -> None:
        """Forget ``seq``'s cells from position ``start`` on."""
        self.lib.llama_memory_seq_rm(self.memory, seq, max(0, int(start)), -1)

    # -- decoding -----------------------------------------------------------------------------------------
    def decode(self, embeddings: np.ndarray, positions, seqs, outputs) -> np.ndarray:
        """Run tokens given as input embeddings [n, d] float32 (each with its position and sequence); returns the
        hidden states [n_out, d] of the tokens marked in ``outputs``, in order. Grows the context when full."""
        n = len(positions)
        results = []
        with self._lock:
            self._flush()
            for lo in range(0, n, BATCH_TOKENS):
                hi = min(n, lo + BATCH_TOKENS)
                out = self._decode_chunk(embeddings[lo:hi], positions[lo:hi], seqs[lo:hi], outputs[lo:hi])
                if out is not None:
                    results.append(out)
        if not results:
            return np.zeros((0, self.hidden), dtype=np.float32)
        return results[0] if len(results) == 1 else np.concatenate(results)

    def _decode_chunk(self, embeddings, positions, seqs, outputs):
        lib, batch = self.lib, self._batch.batch
        n = self._batch.fill(positions, seqs, outputs, embeddings=embeddings)
        code = lib.llama_decode(self.ctx, batch)
        if code == 1:  # no room in the KV cache: grow and run again
            self._grow(self.cells + n)
            self._batch.fill(positions, seqs, outputs, embeddings=embeddings)  # llama_decode may have used the buffers
            code = lib.llama_decode(self.ctx, batch)
        if code != 0:
            raise LlamaCppRewardError(f"llama_decode of the reward backbone failed with code {code} for {n} tokens.")
        marked = [i for i in range(n) if outputs[i]]
        if not marked:
            return None
        out = np.empty((len(marked), self.hidden), dtype=np.float32)
        for row, i in enumerate(marked):  # by batch index: llama.cpp may store outputs in another order
            pointer = lib.llama_get_embeddings_ith(self.ctx, i)
            if not pointer:
                raise LlamaCppRewardError(f"llama.cpp returned no hidden state for token {i} of the batch.")
            ctypes.memmove(out[row].ctypes.data, pointer, 4 * self.hidden)
        return out

    def _grow(self, needed: int) -> None:
        """A context of at least twice the cells (and ``needed``), with every live sequence moved into it."""
        lib = self.lib
        cells = max(2 * self.cells, 256 * math.ceil(needed / 256))
        states = {}
        for s in sorted(self._live):
            size = lib.llama_state_seq_get_size(self.ctx, s)
            buf = (ctypes.c_uint8 * size)()
            written = lib.llama_state_seq_get_data(self.ctx, buf, size, s)
            states[s] = (buf, written)
        old_ctx, old_free = self.ctx, self._make_context(cells)
        try:
            for s, (buf, written) in states.items():
                if written and lib.llama_state_seq_set_data(self.ctx, buf, written, s) == 0:
                    raise LlamaCppRewardError(f"could not move reward sequence {s} into a context of {cells} cells.")
        finally:
            if old_free is not None:
                old_free()
        del old_ctx

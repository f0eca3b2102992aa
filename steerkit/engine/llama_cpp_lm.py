"""A GGUF language model run by llama.cpp as the engine core's LM (``engine="llama.cpp"``).

:class:`LlamaCppLM` loads the GGUF once through llama-cpp-python's C API and runs its decodes;
:class:`~.llama_cpp_batch.LlamaCppBatch` (:meth:`LlamaCppLM.make_batch`) is the engine core's LM state over one
llama.cpp context whose KV cache holds one *sequence* per running row. Every step is one ``llama_decode`` of one
token per row (a real batch inside llama.cpp); everything else (top-k, the rewards, Σ β·ρ, sampling, stop strings)
is the engine core's, so ``generate``, the CLI and ``steerkit serve`` steer llama.cpp through the one step they
share with the transformers engine, and a seed draws from the same random stream.

Rows hold sequence ids ("slots"). A prompt prefilled alone takes a free slot; a prefill that never joins the batch
(a failed or cancelled row) gives its slot back when it is dropped. The context is sized for the rows and tokens
asked of it (:meth:`LlamaCppLM.ensure`): ``slots`` sequences of ``tokens_per_slot`` cells each, in separate KV
streams, so that one row can never run another out of cache and a row's logits do not depend on the others.

The LM's final hidden state (the input of its output layer, [B, d] in ``hidden``), which a reward that reads the
LM's own state needs (``token_head.lm_state``, :mod:`steerkit.rewards.token.lm_state`), is read from llama.cpp's
embeddings output once :meth:`LlamaCppBatch.keep_lm_state` has been called (the engine core calls it when such a
reward comes). llama.cpp outputs every token of a call while embeddings are on, so a prompt's tokens then run in two
calls: all but each sequence's last with embeddings off, then the last tokens with them on.
"""

from __future__ import annotations

import math
import threading
import weakref
from types import SimpleNamespace

import numpy as np
import torch

from ..errors import InvalidArgumentError, ModelFormatError, SteerkitError
from ..llama_cpp_lib import Batch, load as _load_lib, model_params
from .llama_cpp_batch import LlamaCppBatch

#: A context is sized in multiples of this many cells per sequence (fewer re-creations as lengths vary).
CELL_QUANTUM = 256

#: llama.cpp's flash attention: off (0), as llama-cpp-python's ``Llama`` has it, so that ``engine="llama.cpp"`` and
#: that loop with :class:`~steerkit.integrations.llama_cpp.LlamaCppRAD` compute the same logits (tested)
FLASH_ATTENTION = 0


class LlamaCppError(SteerkitError):
    """llama.cpp refused a step (its KV cache is full, or a decode failed)."""


def import_llama_cpp():
    """llama-cpp-python (:func:`steerkit.llama_cpp_lib.load`); its absence is a ModelFormatError with the fix."""
    return _load_lib(ModelFormatError, "engine='llama.cpp'")


class LlamaCppLM:
    """A GGUF model loaded by llama.cpp, with the few attributes the engine reads from a transformers model
    (``config.vocab_size``, ``config.max_position_embeddings``, ``generation_config.eos_token_id``).

    ``max_context``: the most tokens (prompt + generated) one row may hold (default: the model's training
    context); ``threads``: llama.cpp's threads (default: torch's, i.e. ``--threads``/``STEERKIT_THREADS``)."""

    is_llama_cpp = True
    cell_quantum = CELL_QUANTUM

    def __init__(self, path: str, *, max_context: int | None = None, threads: int | None = None,
                 name: str | None = None, fingerprint: str | None = None):
        self.lib = lib = import_llama_cpp()
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params(lib))
        if not self.model:
            raise ModelFormatError(f"llama.cpp could not load {path} (not a GGUF model it supports).")
        self._free_model = weakref.finalize(self, lib.llama_model_free, self.model)
        vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        trained = int(lib.llama_model_n_ctx_train(self.model))
        limit = trained if max_context is None else min(int(max_context), trained)
        if limit < 2:
            raise InvalidArgumentError(f"max_context={max_context}: a row needs at least 2 tokens of context.")
        # the GGUF's end-of-sequence token, as transformers reads it into the dequantized model's generation config
        # (llama.cpp's wider end-of-generation set would stop rows where steerkit's own engine does not)
        eos = [int(lib.llama_vocab_eos(vocab))]
        self.path = str(path)
        self.threads = int(threads or torch.get_num_threads())
        self.config = SimpleNamespace(vocab_size=self.vocab_size, max_position_embeddings=limit,
                                      hidden_size=int(lib.llama_model_n_embd(self.model)),
                                      _name_or_path=name or self.path, model_type="gguf")
        #: the GGUF file's SHA-256 where the caller knows it (:func:`steerkit.assembly.load_llama_cpp_lm`): what a
        #: reward tied to this LM's state checks, as on the transformers engine's LM
        self.steerkit_fingerprint = fingerprint
        self.states = False  # read the final hidden state beside the logits (LlamaCppBatch.keep_lm_state)
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.device = torch.device("cpu")
        self.ctx = None
        self.slots = 0
        self.tokens_per_slot = 0
        self._free: list[int] = []
        self._released: list[int] = []  # slots given back, cleared by the next thread that decodes or takes one
        self._lock = threading.Lock()
        self._free_ctx = None

    # the bits of the torch-module protocol the engine touches
    def eval(self) -> "LlamaCppLM":
        return self

    def to(self, device) -> "LlamaCppLM":
        if torch.device(device).type != "cpu":
            raise InvalidArgumentError(f"engine='llama.cpp' runs on the CPU here; device={device!r} is not "
                                       "supported (use the default engine for a GPU).")
        return self

    def __repr__(self) -> str:
        return f"LlamaCppLM({self.path!r}, vocab={self.vocab_size}, context={self.config.max_position_embeddings})"

    # -- the context --------------------------------------------------------------------------------------
    def ensure(self, slots: int, tokens: int) -> None:
        """Have a context of at least ``slots`` sequences of ``tokens`` cells each; re-created (empty) only when
        it is smaller and no slot is in use, at the shape asked now: not at the larger of the old and new shapes,
        which after a few long rows (a server's reservation) and many short ones (a wide ``generate``) would hold
        their product (4 × 8,192 then 128 × 256 tokens would have been 128 × 8,192: 24 GB of KV for SmolLM2)."""
        tokens = min(self.config.max_position_embeddings, CELL_QUANTUM * math.ceil(max(1, tokens) / CELL_QUANTUM))
        if self.ctx is not None and slots <= self.slots and tokens <= self.tokens_per_slot:
            return
        with self._lock:
            self._flush()
            if self.ctx is not None and len(self._free) != self.slots:
                raise LlamaCppError(f"the llama.cpp context holds {self.slots - len(self._free)} running rows and "
                                    f"cannot grow to {slots} rows of {tokens} tokens now.")
            if self._free_ctx is not None:
                self._free_ctx()
            lib = self.lib
            params = lib.llama_context_default_params()
            params.n_ctx = slots * tokens
            params.n_seq_max = slots
            params.n_batch = params.n_ubatch = 512
            params.n_threads = params.n_threads_batch = self.threads
            # one KV stream per row: a row's logits do not depend on the other rows (a batch equals each row alone, tested).
            # A unified cache was 17% faster at batch 8 (8.1 -> 6.7 ms a token) but changed rows' logits slightly
            # with the batch (other rows' masked cells in the attention), and greedy texts parted at near ties.
            params.kv_unified = False
            params.flash_attn_type = FLASH_ATTENTION
            params.pooling_type = 0  # LLAMA_POOLING_TYPE_NONE: embeddings are each output token's final state
            params.no_perf = True
            ctx = lib.llama_init_from_model(self.model, params)
            if not ctx:
                raise LlamaCppError(f"llama.cpp could not make a context of {slots} rows x {tokens} tokens "
                                    "(out of memory?); lower the batch size or max_context.")
            self.ctx, self.slots, self.tokens_per_slot = ctx, slots, tokens
            self._free_ctx = weakref.finalize(self, lib.llama_free, ctx)
            self._free = list(range(slots))
            self.memory = lib.llama_get_memory(ctx)
            self._batch = Batch(lib, params.n_batch)

    def take_slot(self) -> int:
        if self.ctx is None:  # nobody reserved: one row of the model's whole context
            self.ensure(1, self.config.max_position_embeddings)
        with self._lock:
            self._flush()
            if not self._free:
                raise LlamaCppError(f"all {self.slots} llama.cpp sequences are in use.")
            # the lowest free sequence: a batch's rows then hold consecutive sequences, which llama.cpp runs as one
            # micro-batch (see _decode); a gap left by a finished row is the next one filled
            slot = min(self._free)
            self._free.remove(slot)
            return slot

    def copy_sequence(self, source: int, target: int) -> None:
        """Make sequence ``target`` (a free one just taken) hold what ``source`` holds: llama.cpp copies the KV
        stream's buffer before its next decode, so both rows' next logits are computed from the same cache."""
        with self._lock:
            self.lib.llama_memory_seq_cp(self.memory, source, target, -1, -1)

    def give_slot(self, slot: int) -> None:
        """Give a sequence back (any thread, e.g. a finalizer): its cells are cleared by the next thread that
        decodes or takes a slot, never concurrently with a decode."""
        with self._lock:
            self._released.append(slot)

    def _flush(self) -> None:  # under self._lock
        for slot in self._released:
            if self.ctx is not None and 0 <= slot < self.slots and slot not in self._free:
                self.lib.llama_memory_seq_rm(self.memory, slot, -1, -1)
                self._free.append(slot)
        self._released.clear()

    # -- one llama_decode ---------------------------------------------------------------------------------
    def decode(self, tokens, positions, slots, outputs) -> tuple[np.ndarray, np.ndarray | None]:
        """Run one batch of tokens (each with its position and sequence); returns the logits [n_out, V] of the
        tokens marked in ``outputs``, in order, and their final hidden states [n_out, d] once ``states`` is on
        (else None). Longer batches than llama.cpp's are split (outputs kept in order)."""
        with self._lock:
            self._flush()
        if not self.states:
            return self._decode(tokens, positions, slots, outputs, False)[0], None
        marked = np.asarray(outputs, dtype=bool)
        if not marked.all():
            # embeddings on make llama.cpp output every token of a call: the unmarked tokens run first without
            # them. A marked token must be its sequence's last here (a prompt's last token, a step's one token).
            last = {slot: i for i, slot in enumerate(slots)}
            if any(marked[i] and last[slot] != i for i, slot in enumerate(slots)):
                raise ValueError("decode: with states kept, a token marked for output must be its sequence's last")
            tokens, positions, slots = np.asarray(tokens), np.asarray(positions), np.asarray(slots)
            self._decode(tokens[~marked], positions[~marked], slots[~marked].tolist(), marked[~marked], False)
            tokens, positions, outputs = tokens[marked], positions[marked], marked[marked]
            slots = slots[marked].tolist()
        return self._decode(tokens, positions, slots, outputs, True)

    def _decode(self, tokens, positions, slots, outputs, states: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """One decode, its tokens ordered by sequence. With a KV stream per sequence, llama.cpp puts into one
        micro-batch (one pass over the weights) only tokens whose sequences rise by one from token to token
        (``llama_batch_allocr::split_equal(..., sequential=true)``); a batch whose rows hold sequences 3, 4, 0, 1
        ran as two passes, and one whose rows came back in another order as up to one pass per row (25 rows of one
        step: 300 ms instead of 190 here). The rows come back in the caller's order."""
        seqs = np.asarray(slots)
        if (seqs[1:] >= seqs[:-1]).all():  # in sequence order already (a generate's batch, a prompt)
            return self._decode_sorted(tokens, positions, slots, outputs, states)
        order = np.argsort(seqs, kind="stable")  # stable: a sequence's tokens stay in position order
        marked = np.asarray(outputs, dtype=bool)[order]
        logits, hidden = self._decode_sorted(np.asarray(tokens)[order], np.asarray(positions)[order],
                                             seqs[order].tolist(), marked, states)
        back = np.argsort(order[marked])  # the output rows, from sequence order back to the caller's
        return logits[back], None if hidden is None else hidden[back]

    def _decode_sorted(self, tokens, positions, slots, outputs, states: bool) -> tuple[np.ndarray, np.ndarray | None]:
        lib, width = self.lib, self.config.hidden_size
        if self.states and len(tokens):
            lib.llama_set_embeddings(self.ctx, states)
        logits, hidden = [], []
        for lo in range(0, len(tokens), self._batch.capacity):
            hi = min(len(tokens), lo + self._batch.capacity)
            n = self._batch.fill(positions[lo:hi], slots[lo:hi], outputs[lo:hi], tokens=tokens[lo:hi])
            code = lib.llama_decode(self.ctx, self._batch.batch)
            if code != 0:
                raise LlamaCppError(f"llama_decode failed with code {code} (1: no room in the KV cache) for {n} "
                                    f"tokens; a row may hold at most {self.tokens_per_slot} tokens here.")
            count = int(self._batch.logits[:n].sum())
            if count:
                pointer = lib.llama_get_logits(self.ctx)
                logits.append(np.ctypeslib.as_array(pointer, shape=(count, self.vocab_size)).copy())
                if states:
                    pointer = lib.llama_get_embeddings(self.ctx)
                    hidden.append(np.ctypeslib.as_array(pointer, shape=(count, width)).copy())
        return _rows(logits, self.vocab_size), _rows(hidden, width) if states else None

    def make_batch(self) -> LlamaCppBatch:
        return LlamaCppBatch(self)


def _rows(parts: list[np.ndarray], width: int) -> np.ndarray:
    """The row blocks of one decode's llama_decode calls, as one [n, width] array."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros((0, width), np.float32)

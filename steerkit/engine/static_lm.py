"""The language model's side of the engine with a static-shape decode step (``compile=True``, issue 25).

:class:`LMBatch` grows its transformers ``DynamicCache`` by one column a step (``torch.cat``) and runs the model
eagerly, op by op. :class:`StaticLMBatch` keeps the same contract (prefill, join, keep, advance, ``logits``) on
preallocated KV tensors of a fixed shape, ``slots`` rows × ``width`` tokens, so that one decode step is a fixed
graph per shape that ``torch.compile`` captures once:

* **Layout:** as in :class:`LMBatch`, a row's tokens are the right-aligned columns ``[t - length, t)`` of the
  cache, and a step writes column ``t`` of every row (the transformers ``StaticCache`` writes there in place).
  The mask marks each row's columns; position ids count a row's own tokens, so padding never changes a row's
  positions or logits.
* **Buckets:** ``slots`` is the running rows rounded up to a power of two, ``width`` the longest row plus one,
  rounded up to a power of two (at least :data:`MIN_WIDTH`); a bucket's padded rows read token 0 and are dropped.
  When column ``t`` reaches the width, the columns no row uses are cropped, or the width doubles. ``generate``
  reserves its whole length up front (:meth:`StaticLMBatch.reserve`), so its shape does not change while it runs.
* **The step:** ``model.forward`` compiled with inductor, weights frozen as constants and every matrix product
  autotuned between inductor's own C++ GEMM and the ATen kernel (on this AMD CPU, MKL's single-row product runs at
  half the memory bandwidth; inductor's is near it: docs/performance.md). Compiled once per shape and process; the
  compiled kernels, autotuning results and lowered graph are cached on disk (``$TORCHINDUCTOR_CACHE_DIR``, by default
  ``<steerkit cache>/inductor``; the graph keyed by the weights, :mod:`steerkit.graph_cache`), and a line on stderr
  says when a shape compiles and how long it took.
* **Prefill** runs eagerly, as :class:`LMBatch`'s does (a prompt's length varies; the step's does not), and its
  cache is copied into the static tensors.

The prefix state is exactly the eager engine's: the same model code, the same positions, masked columns
contributing nothing. The compiled graph reorders floating-point sums, so logits differ in the last bits; greedy
texts are compared with the eager engine's in tests/unit/test_static_lm.py and tests/integration.
"""

from __future__ import annotations

import torch

from ..compiling import bucket, buckets_up_to, compiled_step
from ..errors import InvalidArgumentError
from ..hf_compat import cache_kwargs, set_static_write_column, static_cache
from .lm_cache import LMBatch, Prefilled, first_used_column

#: The narrowest width a static batch allocates (tokens a row may hold before the width doubles).
MIN_WIDTH = 128


class StaticLM:
    """A transformers causal LM that the engine runs with the static-shape step (``compile=True`` on
    :func:`steerkit.generate`, ``steerkit generate/serve --compile``). Everything but the engine's batch (a
    perplexity, a ``LogitsProcessor``) reads the wrapped ``model``, to which attribute reads are forwarded.

    ``compiled=False`` runs the same static layout eagerly (what the unit tests check the layout with)."""

    def __init__(self, model, *, compiled: bool = True):
        self.__dict__["model"] = model
        self.__dict__["compiled"] = bool(compiled)

    def make_batch(self) -> "StaticLMBatch":
        return StaticLMBatch(self)

    def __getattr__(self, name):
        return getattr(self.__dict__["model"], name)

    # nn.Module's methods that return the module return this wrapper, so the engine still compiles
    def to(self, *args, **kwargs) -> "StaticLM":
        self.model.to(*args, **kwargs)
        return self

    def eval(self) -> "StaticLM":
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> "StaticLM":
        self.model.train(mode)
        return self

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __repr__(self) -> str:
        return f"StaticLM({type(self.model).__name__}, compiled={self.compiled})"


class StaticLMBatch(LMBatch):
    """The running rows' LM state in static tensors: ``static`` (a transformers ``StaticCache``, ``slots`` ×
    ``width`` per layer), ``mask`` [slots, width], positions ``pos`` [slots], the next write column ``t`` and the
    rows' next-token ``logits`` [rows, V] (float32). It keeps no hidden state: a reward that reads the LM's own state
    (``token_head.lm_state``) runs only on the eager :class:`LMBatch`."""

    supports_lm_state = False

    def __init__(self, lm: StaticLM):
        self.lm = lm
        self.reserved = 0
        super().__init__(lm.model)
        self.compiled = compiled_step(lm.model) if lm.compiled else None

    def reset(self) -> None:
        super().reset()
        self.static = None
        self.rows = self.slots = self.width = self.t = 0
        self._kv_shape = None  # (heads, head_dim, dtype) of the model's KV, read off the first prefill

    @property
    def size(self) -> int:
        return self.rows

    def reserve(self, rows: int, tokens: int, budget: int | None = None) -> int:
        """Size the width for rows of ``tokens`` tokens (``generate``: prompt plus new tokens), so that it does not
        change while the batch runs. With a ``budget`` (the server) nothing is sized ahead: the width follows the
        longest running row, since every step reads the whole width. Returns the tokens a row may hold."""
        if budget is None:
            self.reserved = int(tokens)
        return tokens

    @torch.no_grad()
    def warm_up(self, max_rows: int, token_id: int = 0, tokens: int = MIN_WIDTH - 1) -> None:
        """Compile (or load from the disk cache) the step of every row bucket up to ``max_rows`` at every width a row
        of up to ``tokens`` tokens uses (the narrowest, 128, by default), now: the server calls this before it accepts
        requests, and its loop compiles nothing (:func:`~steerkit.compiling.new_shapes_run_eagerly`)."""
        if self.compiled is None or self.rows:
            return
        self._read_kv_shape(self.prefill([token_id]).cache)
        for width in buckets_up_to(tokens + 1, MIN_WIDTH):
            for slots in buckets_up_to(max_rows):
                self._allocate(slots, width)
                self.rows, self.t = 0, 0
                self.advance(torch.full((0,), token_id, dtype=torch.long))
        self.reset()

    # -- layout --------------------------------------------------------------------------------------------
    def _layers(self):
        return self.static.layers

    def _allocate(self, slots: int, width: int) -> None:
        heads, head_dim, dtype = self._kv_shape
        self.static = static_cache(self.model, slots, width, heads, head_dim, dtype, self.device,
                                   static_addresses=self.device.type == "cuda")
        self.slots, self.width = slots, width
        self.mask = torch.ones((slots, width), dtype=torch.long, device=self.device)  # padded rows: all columns
        self.pos = torch.zeros(slots, dtype=torch.long, device=self.device)

    def _shape(self, rows: int, t: int) -> tuple[int, int]:
        """The (slots, width) bucket of ``rows`` rows whose next write is column ``t`` (or the reserved length)."""
        return bucket(rows), bucket(max(t, self.reserved) + 1, MIN_WIDTH)

    def _relayout(self, rows: int, t: int, index: torch.Tensor | None = None, shift: int = 0) -> None:
        """Move to the layout :meth:`_shape` gives, keeping the rows ``index`` (all: None) with their columns moved
        right by ``shift`` (left if negative)."""
        shape = self._shape(rows, t)
        old, old_mask, old_pos, old_t = self.static, self.mask, self.pos, self.t
        keep = torch.arange(self.rows, device=self.device) if index is None else index.to(self.device)
        if shape != (self.slots, self.width) or old is None:
            self._allocate(*shape)
        else:
            self.mask, self.pos = self.mask.clone(), self.pos.clone()
        n = len(keep)
        if old is not None and n:
            lo = max(0, -shift)
            span = old_t - lo  # columns [lo, old_t) of the kept rows move to [lo + shift, old_t + shift)
            for new_layer, old_layer in zip(self._layers(), old.layers):
                for name in ("keys", "values"):
                    src = getattr(old_layer, name).index_select(0, keep)[:, :, lo:old_t]
                    dst = getattr(new_layer, name)
                    dst[:n, :, lo + shift:lo + shift + span] = src
            mask = torch.zeros((n, self.width), dtype=old_mask.dtype, device=self.device)
            mask[:, lo + shift:lo + shift + span] = old_mask.index_select(0, keep)[:, lo:old_t]
            self.mask[:n] = mask
            self.mask[n:] = 1
            self.pos[:n] = old_pos.index_select(0, keep)
            self.pos[n:] = 0
        self.rows, self.t = n, t
        set_static_write_column(self.static, t)

    def _room(self) -> None:
        """Make column ``t`` writable: crop the columns no row uses, else double the width."""
        if self.t < self.width:
            return
        start = first_used_column(self.mask[:self.rows], default=self.t)
        self._relayout(self.rows, self.t - start, shift=-start)

    def _load_rows(self, first: int, caches: list, lengths: list[int]) -> None:
        """Copy prefilled rows (each a ``DynamicCache`` [1, heads, length, d]) into slots ``first...``, right-aligned
        at column ``t``."""
        for j, (cache, length) in enumerate(zip(caches, lengths)):
            slot, lo = first + j, self.t - length
            for layer, src in zip(self._layers(), cache.layers):
                layer.keys[slot, :, lo:self.t] = src.keys[0, :, -length:]
                layer.values[slot, :, lo:self.t] = src.values[0, :, -length:]
            self.mask[slot] = 0
            self.mask[slot, lo:self.t] = 1
            self.pos[slot] = length

    def _read_kv_shape(self, cache) -> None:
        if self._kv_shape is None:
            for layer in cache.layers:
                if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
                    raise InvalidArgumentError(
                        f"{type(self.model).__name__} uses a sliding-window KV cache ({type(layer).__name__}); the "
                        "static-shape step holds full-attention caches only. Run it without compile.")
            keys = cache.layers[0].keys
            self._kv_shape = (keys.shape[1], keys.shape[3], keys.dtype)

    # -- the LMBatch contract ------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill_padded(self, rows_ids: list[list[int]], tokenizer) -> None:
        """Start the batch with these prompts in one eager forward (as :class:`LMBatch` does), then copy the cache
        into a static layout."""
        super().prefill_padded(rows_ids, tokenizer)
        dynamic, mask, pos, logits = self.cache, self.mask, self.pos, self.logits
        self._read_kv_shape(dynamic)
        rows, width = mask.shape
        self._allocate(*self._shape(rows, width))
        self.rows, self.t = rows, width
        set_static_write_column(self.static, width)
        for layer, src in zip(self._layers(), dynamic.layers):
            layer.keys[:rows, :, :width] = src.keys
            layer.values[:rows, :, :width] = src.values
        self.mask[:rows] = 0
        self.mask[:rows, :width] = mask
        self.pos[:rows] = pos
        self.cache, self.logits = None, logits

    def join(self, newcomers: list[Prefilled]) -> None:
        """Append prefilled rows after the running ones, right-aligned at the write column (moving the running
        rows right when a newcomer is longer than the columns written so far)."""
        if not newcomers:
            return
        self._read_kv_shape(newcomers[0].cache)
        t = max([self.t] + [p.length for p in newcomers])
        first = self.rows
        self._relayout(first + len(newcomers), t, shift=t - self.t)
        self.rows = first + len(newcomers)
        self._load_rows(first, [p.cache for p in newcomers], [p.length for p in newcomers])
        logits = [p.logits for p in newcomers]
        self.logits = torch.cat(([self.logits] if first else []) + logits)

    def keep(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order, in the smallest bucket that holds them, cropping columns no kept
        row uses."""
        if len(index) == 0:
            self.reset()
            return
        index = index.to(self.device)
        start = first_used_column(self.mask.index_select(0, index))
        self._relayout(len(index), self.t - start, index=index, shift=-start)
        self.logits = self.logits.index_select(0, index)

    @torch.no_grad()
    def advance(self, tokens: torch.Tensor) -> None:
        """Write each row's chosen token [B] at column ``t`` and compute the next logits: one call of the step."""
        self._room()
        rows, t = self.rows, self.t
        ids = torch.zeros((self.slots, 1), dtype=torch.long, device=self.device)
        ids[:rows, 0] = tokens.to(self.device)
        self.mask[:rows, t] = 1
        # the cache writes at column t: each layer's write position is t already (set when the layout last moved,
        # then advanced by every step's write); transformers releases that read cache_position instead get it here
        kwargs = dict(input_ids=ids, attention_mask=self.mask, position_ids=self.pos[:, None],
                      cache_position=torch.full((1,), t, device=self.device), use_cache=True,
                      **cache_kwargs(self.model, self.static))
        out = self.model(**kwargs) if self.compiled is None else self._compiled_call(kwargs)
        self.t = t + 1
        self.pos[:rows] += 1
        self.logits = out.logits[:rows, -1, :].float()

    def _compiled_call(self, kwargs):
        return self.compiled((f"{self.slots} row(s)", f"{self.width} tokens"), kwargs)

"""The language model's side of the engine: one KV cache over the running rows. A batch starts prefilled
together (:meth:`LMBatch.prefill_padded`, ``generate``), or newcomers join it (prefilled apart from the running
rows, those that arrive together in padded forwards of similar lengths, then left-padded and concatenated: the
server's continuous batching) and finished rows leave (``index_select``).

Every row's real tokens are the right-aligned columns of the cache (each step appends one column to every
row), so the width is the longest row; columns no remaining row uses are cropped when rows leave. Position
ids are per row (real tokens counted), so a row's positions do not depend on its padding.
"""

from __future__ import annotations

import threading

import torch
from transformers import DynamicCache

from ..errors import InvalidArgumentError
from ..hf_compat import cache_kwargs, take_cache_rows
from .rows import distinct_prompts


class Prefilled:
    """A newcomer's prompt run through the LM alone: its cache, length, next-token logits [1, V] and the LM's final
    hidden state [1, d] at its last position (None where the LM has no output layer to read it from)."""

    def __init__(self, cache: DynamicCache, length: int, logits: torch.Tensor, hidden: torch.Tensor | None = None):
        self.cache, self.length, self.logits, self.hidden = cache, length, logits, hidden


def lm_forward(model, **kwargs):
    """``model(**kwargs)`` and the input of its output layer (the LM's final hidden state, after its last norm) at
    the last position, [B, d]: what a reward that reads the LM's own state (``token_head.lm_state``,
    :mod:`steerkit.rewards.token.lm_state`) scores from. Read by a pre-hook on ``get_output_embeddings()`` for this
    call and this thread only (another thread's forward of the same model is not seen), and copied ([B, d]: a prefill's
    output-layer input is a view of all its positions' states, which the copy does not keep alive).
    Returns ``(output, hidden or None)``; None where the model has no output layer module."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return model(**kwargs), None
    box: list = []
    owner = threading.get_ident()

    def keep(module, args):
        if threading.get_ident() == owner:
            box.append(args[0][:, -1].clone())

    handle = head.register_forward_pre_hook(keep)
    try:
        out = model(**kwargs)
    finally:
        handle.remove()
    return out, (box[-1] if box else None)


def first_used_column(mask: torch.Tensor, default: int = 0) -> int:
    """The first column of ``mask`` [B, T] that some row uses (``default`` when none does): one host read."""
    used = mask.bool().any(0).nonzero()
    return int(used[0].item()) if len(used) else default


def _pad_left(t: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, columns, 0)) if columns else t


class PrefillJob:
    """A prompt run through the LM alone, ``chunk`` tokens per forward: each :meth:`run_chunk` call extends its
    cache by the next chunk, and the last returns the :class:`Prefilled` row. With ``chunk`` = the prompt's
    length it is one forward, the same as ``steerkit.generate``'s prefill of a batch of one."""

    def __init__(self, model, ids: list[int], chunk: int):
        self.model, self.ids, self.chunk, self.done = model, ids, max(1, int(chunk)), 0
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)

    @property
    def next_size(self) -> int:
        """Tokens the next :meth:`run_chunk` runs."""
        return min(self.chunk, len(self.ids) - self.done)

    @torch.no_grad()
    def run_chunk(self) -> Prefilled | None:
        """Run the next chunk; the finished row after the last one, else None."""
        start, end = self.done, self.done + self.next_size
        input_ids = torch.tensor([self.ids[start:end]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        positions = torch.arange(start, end, device=self.device)[None, :]
        out, hidden = lm_forward(self.model, input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                 use_cache=True, logits_to_keep=1, **cache_kwargs(self.model, self.cache))
        self.done = end
        if end < len(self.ids):
            return None
        _check_full_attention(self.model, self.cache)
        return Prefilled(self.cache, len(self.ids), out.logits[:, -1, :].float(), hidden)


def _check_full_attention(model, cache: DynamicCache) -> None:
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise InvalidArgumentError(
                f"{type(model).__name__} uses a sliding-window KV cache ({type(layer).__name__}); the "
                "serving engine batches full-attention caches only. Serve another LM.")


def _length_groups(rows_ids: list[list[int]]) -> list[list[int]]:
    """Indices of ``rows_ids`` in groups of similar lengths, longest first: a group's padded size (rows × its longest
    prompt) is at most twice its real tokens, so padding never costs more than the prompts themselves."""
    groups: list[list[int]] = []
    real = 0  # the real tokens of the last group
    for i in sorted(range(len(rows_ids)), key=lambda i: -len(rows_ids[i])):
        if groups and (len(groups[-1]) + 1) * len(rows_ids[groups[-1][0]]) <= 2 * (real + len(rows_ids[i])):
            groups[-1].append(i)
            real += len(rows_ids[i])
        else:
            groups.append([i])
            real = len(rows_ids[i])
    return groups


class LMBatch:
    """The running rows' LM state: ``cache`` (a transformers ``DynamicCache`` [B, heads, T, d] per layer),
    ``mask`` [B, T], next position ``pos`` [B], the next-token ``logits`` [B, V] (float32) and the LM's final
    hidden state at each row's last position, ``hidden`` [B, d] (:func:`lm_forward`)."""

    #: the batch keeps ``hidden`` for rewards that read the LM's own state (the static-shape step does not)
    supports_lm_state = True

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.reset()

    def reset(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    def reserve(self, rows: int, tokens: int, budget: int | None = None) -> int:
        """Room for ``rows`` rows of ``tokens`` tokens (``budget``: tokens over all rows at most); returns the tokens a
        row may hold. A transformers cache grows as it goes, so this is ``tokens`` (llama.cpp's context is sized up
        front: :class:`~steerkit.engine.llama_cpp_batch.LlamaCppBatch`)."""
        return tokens

    def prefill(self, ids: list[int]) -> Prefilled:
        """Run one prompt alone, in one forward (as ``steerkit.generate`` runs a batch of one): the same logits
        whatever else is running."""
        return PrefillJob(self.model, ids, len(ids)).run_chunk()

    @torch.no_grad()
    def prefill_many(self, rows_ids: list[list[int]]) -> list[Prefilled]:
        """Several prompts that arrive together, each a :class:`Prefilled` row as :meth:`prefill` makes it, run in
        left-padded forwards of similar lengths (at most as many padding tokens as real ones in each) instead of one
        forward per prompt. A row's cache and logits equal its own prefill's up to the order of floating-point sums
        (as a row's decode step in a batch does); its tokens are the same but where two candidates all but tie."""
        out: list[Prefilled | None] = [None] * len(rows_ids)
        for group in _length_groups(rows_ids):
            if len(group) == 1:
                out[group[0]] = self.prefill(rows_ids[group[0]])
                continue
            for i, row in zip(group, self._prefill_group([rows_ids[i] for i in group])):
                out[i] = row
        return out

    def copy_prefilled(self, prefilled: Prefilled) -> Prefilled:
        """Another row of the same prompt (a request's ``n``): ``prefilled`` itself, since :meth:`join` only reads
        it (the rows' caches are copies from then on)."""
        return prefilled

    def _prefill_group(self, rows_ids: list[list[int]]) -> list[Prefilled]:
        width = max(len(ids) for ids in rows_ids)
        input_ids = torch.tensor([[ids[0]] * (width - len(ids)) + list(ids) for ids in rows_ids], dtype=torch.long,
                                 device=self.device)  # the padding (masked) repeats a real token: any id would do
        lengths = torch.tensor([len(ids) for ids in rows_ids], device=self.device)
        mask = (torch.arange(width, device=self.device)[None, :] >= (width - lengths)[:, None]).long()
        cache, _, logits, hidden = self._padded_forward(input_ids, mask)
        _check_full_attention(self.model, cache)
        rows = []
        for b, ids in enumerate(rows_ids):
            own = DynamicCache(config=self.model.config)
            for i, layer in enumerate(cache.layers):
                own.update(layer.keys[b:b + 1, :, width - len(ids):], layer.values[b:b + 1, :, width - len(ids):], i)
            rows.append(Prefilled(own, len(ids), logits[b:b + 1], None if hidden is None else hidden[b:b + 1]))
        return rows

    def prefill_job(self, ids: list[int], chunk: int) -> "PrefillJob":
        """One prompt to run alone, ``chunk`` tokens per :meth:`PrefillJob.run_chunk` (the server's chunked prefill)."""
        return PrefillJob(self.model, ids, chunk)

    @torch.no_grad()
    def prefill_padded(self, rows_ids: list[list[int]], tokenizer) -> None:
        """Start the batch with these prompts in one forward, padded by ``tokenizer`` (left padding), as
        ``steerkit.generate`` and transformers prefill a batch; the batch must be empty. A prompt that several rows
        share (``num_return_sequences``) runs once, and its rows start from copies of its cache and logits, which
        equal a forward of every row's up to the order of floating-point sums (the forward has fewer rows)."""
        if self.size:
            raise RuntimeError("prefill_padded starts a batch: this one is running")
        runs, pick = distinct_prompts(rows_ids)
        enc = tokenizer.pad({"input_ids": [rows_ids[row] for row in runs]}, return_tensors="pt")
        mask = enc["attention_mask"].to(self.device)
        cache, positions, logits, hidden = self._padded_forward(enc["input_ids"].to(self.device), mask)
        if len(runs) < len(rows_ids):  # every prompt is among the runs, so the padded width is the same
            index = torch.tensor(pick, device=self.device)
            take_cache_rows(cache, index)
            mask, positions, logits = mask[index], positions[index], logits[index]
            hidden = None if hidden is None else hidden[index]
        self.cache, self.logits, self.hidden = cache, logits, hidden
        self.mask, self.pos = mask, positions[:, -1] + 1

    def _padded_forward(self, input_ids: torch.Tensor, mask: torch.Tensor):
        """One forward of left-padded prompts (``mask`` [B, T]: 0 on padding) into a fresh cache, positions counting
        each row's real tokens: ``(cache, positions, last-position logits [B, V] float32, hidden [B, d] or None)``."""
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = DynamicCache(config=self.model.config)
        out, hidden = lm_forward(self.model, input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                 use_cache=True, logits_to_keep=1, **cache_kwargs(self.model, cache))
        return cache, positions, out.logits[:, -1, :].float(), hidden

    def join(self, newcomers: list[Prefilled]) -> None:
        """Append prefilled rows after the running ones (left-padding every cache to the widest)."""
        if not newcomers:
            return
        parts = ([] if self.cache is None else [(self.cache, self.mask)]) + [
            (p.cache, torch.ones((1, p.length), dtype=torch.long, device=self.device)) for p in newcomers]
        width = max(mask.shape[1] for _, mask in parts)
        base = parts[0][0]
        for i, layer in enumerate(base.layers):
            for name in ("keys", "values"):
                tensors = [_pad_left(getattr(c.layers[i], name), width - m.shape[1]) for c, m in parts]
                setattr(layer, name, torch.cat(tensors))
        self.mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m in parts])
        self.pos = torch.cat([self.pos, torch.tensor([p.length for p in newcomers], device=self.device)])
        logits = [p.logits for p in newcomers]
        hidden = ([self.hidden] if self.cache is not None else []) + [p.hidden for p in newcomers]
        self.hidden = None if any(h is None for h in hidden) else torch.cat(hidden)  # None: the LM has no output layer
        self.logits = torch.cat(([self.logits] if self.cache is not None else []) + logits)
        self.cache = base

    def keep(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order; crop columns no kept row uses."""
        if len(index) == 0:
            self.reset()
            return
        index = index.to(self.device)
        mask = self.mask.index_select(0, index)
        start = first_used_column(mask)
        take_cache_rows(self.cache, index, start)
        self.mask = mask[:, start:]
        self.pos = self.pos.index_select(0, index)
        self.logits = self.logits.index_select(0, index)
        self.hidden = None if self.hidden is None else self.hidden.index_select(0, index)

    @torch.no_grad()
    def advance(self, tokens: torch.Tensor) -> None:
        """Append each row's chosen token [B] and compute the next logits."""
        tokens = tokens.to(self.device)
        self.mask = torch.cat([self.mask, torch.ones((self.size, 1), dtype=self.mask.dtype, device=self.device)], 1)
        out, self.hidden = lm_forward(self.model, input_ids=tokens[:, None], attention_mask=self.mask,
                                      position_ids=self.pos[:, None], use_cache=True,
                                      **cache_kwargs(self.model, self.cache))
        self.pos = self.pos + 1
        self.logits = out.logits[:, -1, :].float()


def lm_batch(lm):
    """The engine core's LM state for ``lm``: its own (``lm.make_batch()``: llama.cpp's
    :class:`~steerkit.engine.llama_cpp_batch.LlamaCppBatch`), else a transformers :class:`LMBatch`."""
    make = getattr(lm, "make_batch", None)
    return make() if callable(make) else LMBatch(lm)

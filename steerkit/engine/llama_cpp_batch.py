"""The engine core's LM state on a llama.cpp model (``engine="llama.cpp"``): :class:`LlamaCppBatch`, the same contract
as :class:`~steerkit.engine.lm_cache.LMBatch` (``prefill``, ``prefill_job``, ``prefill_padded``, ``join``, ``keep``,
``advance``, ``logits`` [B, V] float32), over the sequences ("slots") of one :class:`~.llama_cpp_lm.LlamaCppLM`
context, and the prefills of newcomers (:class:`LlamaPrefilled`, :class:`LlamaPrefillJob`) that join it. The LM is
an argument, never imported here: its module makes the batches (``LlamaCppLM.make_batch``).

A row holds a slot from when its prompt is prefilled until it leaves the batch; a prefill that never joins (a failed
or cancelled row) gives its slot back when it is dropped, and so does a batch that is dropped with rows in it.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from .rows import distinct_prompts


class LlamaPrefilled:
    """A newcomer's prompt run in its own llama.cpp sequence: the slot, length, next-token logits [1, V] and final
    hidden state [1, d] (None unless the LM keeps states). Its slot goes back to the model if it is dropped without
    joining a batch."""

    def __init__(self, lm: LlamaCppLM, slot: int, length: int, logits: torch.Tensor,
                 hidden: torch.Tensor | None = None):
        self.slot, self.length, self.logits, self.hidden = slot, length, logits, hidden
        self._release = weakref.finalize(self, lm.give_slot, slot)

    def adopt(self) -> int:
        self._release.detach()
        return self.slot


class LlamaPrefillJob:
    """A prompt prefilled ``chunk`` tokens per :meth:`run_chunk` into its own sequence (the server's chunked prefill)."""

    def __init__(self, lm: LlamaCppLM, ids: list[int], chunk: int):
        self.lm, self.ids, self.chunk, self.done = lm, list(ids), max(1, int(chunk)), 0
        self.slot = lm.take_slot()
        self._release = weakref.finalize(self, lm.give_slot, self.slot)

    @property
    def next_size(self) -> int:
        return min(self.chunk, len(self.ids) - self.done)

    def run_chunk(self) -> LlamaPrefilled | None:
        start, end = self.done, self.done + self.next_size
        last = end == len(self.ids)
        logits, hidden = self.lm.decode(self.ids[start:end], list(range(start, end)), [self.slot] * (end - start),
                                        [False] * (end - start - 1) + [last])
        self.done = end
        if not last:
            return None
        self._release.detach()
        return LlamaPrefilled(self.lm, self.slot, len(self.ids), torch.from_numpy(logits), _tensor(hidden))


class LlamaCppBatch:
    """The engine core's LM state on llama.cpp (see the module docstring): row b is sequence ``slots[b]`` at
    position ``pos[b]``; ``logits`` [B, V] float32 are the rows' next-token logits and ``hidden`` [B, d] their final
    hidden states once the LM keeps them (:meth:`keep_lm_state`; zeros for rows that ran before)."""

    def __init__(self, lm: LlamaCppLM):
        self.lm = lm
        self.device = lm.device
        self.slots: list[int] = []  # changed in place only: the finalizer gives back what it holds
        self.pos = np.zeros(0, dtype=np.int32)  # each row's next position
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        weakref.finalize(self, _give_all, lm, self.slots)

    @property
    def supports_lm_state(self) -> bool:
        """Whether ``hidden`` is kept: rewards that read the LM's state can join (the engine core asks)."""
        return self.lm.states

    def keep_lm_state(self) -> None:
        """Keep the rows' final hidden states from the next prefill or step on (the engine core calls this before
        it prefills a row with a reward that reads them)."""
        self.lm.states = True

    def reserve(self, rows: int, tokens: int, budget: int | None = None) -> int:
        """Room for ``rows`` rows of up to ``tokens`` tokens each (prompt + generated), within ``budget`` tokens in
        all when one is given (the server's); returns the tokens a row may hold."""
        if budget is not None:
            tokens = min(tokens, max(self.lm.cell_quantum, budget // max(1, rows)))
        self.lm.ensure(rows, tokens)
        return min(tokens, self.lm.tokens_per_slot)

    @property
    def size(self) -> int:
        return len(self.slots)

    def reset(self) -> None:
        _give_all(self.lm, self.slots)
        self.pos, self.logits, self.hidden = self.pos[:0], None, None

    def prefill(self, ids: list[int]) -> LlamaPrefilled:
        return self.prefill_job(ids, len(ids)).run_chunk()

    def prefill_job(self, ids: list[int], chunk: int) -> LlamaPrefillJob:
        return LlamaPrefillJob(self.lm, ids, chunk)

    def copy_prefilled(self, prefilled: LlamaPrefilled) -> LlamaPrefilled:
        """Another row of the same prompt (a request's ``n``): a free sequence that copies ``prefilled``'s."""
        slot = self.lm.take_slot()
        try:
            self.lm.copy_sequence(prefilled.slot, slot)
        except Exception:
            self.lm.give_slot(slot)
            raise
        return LlamaPrefilled(self.lm, slot, prefilled.length, prefilled.logits, prefilled.hidden)

    def prefill_padded(self, rows_ids: list[list[int]], tokenizer=None) -> None:
        """Start the batch with these prompts, each row in its own sequence: one ``llama_decode`` of each distinct
        prompt, whose sequence the rows with the same prompt (``num_return_sequences``) then copy."""
        if self.size:
            raise RuntimeError("prefill_padded starts a batch: this one is running")
        slots = [self.lm.take_slot() for _ in rows_ids]
        runs, pick = distinct_prompts(rows_ids)
        tokens, positions, seqs, outputs = [], [], [], []
        for row in runs:
            ids = rows_ids[row]
            tokens += ids
            positions += range(len(ids))
            seqs += [slots[row]] * len(ids)
            outputs += [False] * (len(ids) - 1) + [True]
        try:
            logits, hidden = self.lm.decode(tokens, positions, seqs, outputs)
            for row, run in enumerate(pick):
                if runs[run] != row:
                    self.lm.copy_sequence(slots[runs[run]], slots[row])
        except Exception:
            for slot in slots:
                self.lm.give_slot(slot)
            raise
        if len(runs) < len(rows_ids):  # each row's output: its prompt's
            logits, hidden = logits[pick], None if hidden is None else hidden[pick]
        self.slots[:] = slots
        self.pos = np.array([len(ids) for ids in rows_ids], dtype=np.int32)
        self.logits, self.hidden = torch.from_numpy(logits), _tensor(hidden)

    def join(self, newcomers: list[LlamaPrefilled]) -> None:
        if not newcomers:
            return
        self.slots.extend(p.adopt() for p in newcomers)
        self.pos = np.concatenate([self.pos, np.array([p.length for p in newcomers], dtype=np.int32)])
        if self.lm.states:  # a row that ran before the LM kept states has zeros (no reward reads them)
            width = self.lm.config.hidden_size
            before = self.hidden if self.hidden is not None else torch.zeros(self.pos.shape[0] - len(newcomers), width)
            self.hidden = torch.cat([before] + [p.hidden if p.hidden is not None else torch.zeros(1, width)
                                                for p in newcomers])
        logits = [p.logits for p in newcomers]
        self.logits = torch.cat(([self.logits] if self.logits is not None else []) + logits)

    def keep(self, index: torch.Tensor) -> None:
        keep = [int(i) for i in index]
        for b in set(range(self.size)) - set(keep):
            self.lm.give_slot(self.slots[b])
        if not keep:
            self.slots.clear()
            self.pos, self.logits, self.hidden = self.pos[:0], None, None
            return
        self.slots[:] = [self.slots[i] for i in keep]
        self.pos = self.pos[keep]
        self.logits = self.logits.index_select(0, index.to(self.logits.device))
        self.hidden = None if self.hidden is None else self.hidden.index_select(0, index)

    def advance(self, tokens: torch.Tensor) -> None:
        """One ``llama_decode`` of each row's new token; every row's logits are read."""
        logits, hidden = self.lm.decode(tokens.numpy(), self.pos, self.slots, np.ones(len(self.slots), dtype=np.int8))
        self.pos = self.pos + 1
        self.logits, self.hidden = torch.from_numpy(logits), _tensor(hidden)


def _tensor(array: np.ndarray | None) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(array)


def _give_all(lm: LlamaCppLM, slots: list[int]) -> None:
    for slot in slots:
        lm.give_slot(slot)
    slots.clear()

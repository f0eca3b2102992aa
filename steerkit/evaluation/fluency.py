"""Fluency: perplexity of each continuation conditioned on its prompt, under a separate evaluation LM.

As in DExperts/RAD: tokenize ``prompt + continuation`` and ``prompt``; the continuation's tokens are
those after the longest common prefix of the two token sequences (so a token that merges across the
boundary counts as continuation); ``ppl = exp(mean NLL of those tokens given everything before)``.
The evaluation LM's BOS token is prepended when its tokenizer adds one (Gemma needs it).
The default evaluation LM is the packaged ``gemma3-270m`` (larger than the 135M generator).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import InvalidArgumentError
from ..hf_compat import cache_kwargs, takes_cache
from ..models import DEFAULT_EVAL_LM, text_config


class PerplexityScorer:
    """Batched conditional perplexity under one causal LM (loaded once)."""

    def __init__(self, lm: str | tuple = DEFAULT_EVAL_LM, *, batch_size: int = 25, max_length: int | None = None,
                 device: str | None = None):
        if isinstance(lm, tuple):
            self.model, self.tokenizer = lm[0], lm[1]
            self.reference = getattr(self.model.config, "_name_or_path", "") or "<in-memory>"
        else:
            from ..models import load_causal_lm_cached

            self.model, self.tokenizer, _ = load_causal_lm_cached(str(lm))
            self.reference = str(lm)
        if device:
            self.model.to(device)
        self.model.eval()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"fluency batch_size must be a positive integer, got {batch_size!r}.")
        self.batch_size = batch_size
        from ..models import context_length

        self.max_length = max_length or context_length(self.model) or 2048
        self.bos = self._bos_prefix()
        self.shares_prompts = _attention_only(self.model)

    def _bos_prefix(self) -> list[int]:
        tok = self.tokenizer
        with_special = tok("a", add_special_tokens=True)["input_ids"]
        without = tok("a", add_special_tokens=False)["input_ids"]
        n = len(with_special) - len(without)
        return list(with_special[:n]) if n > 0 and with_special[n:] == without else []

    def split(self, prompt: str, continuation: str) -> tuple[list[int], int]:
        """Token ids of BOS + prompt + continuation, and the index where the continuation starts."""
        tok = self.tokenizer
        full = tok(prompt + continuation, add_special_tokens=False)["input_ids"]
        head = tok(prompt, add_special_tokens=False)["input_ids"]
        common = 0
        for a, b in zip(full, head):
            if a != b:
                break
            common += 1
        ids = self.bos + full
        return ids, len(self.bos) + common

    @torch.no_grad()
    def perplexities(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[float]:
        """One perplexity per (prompt, continuation); NaN for a continuation with no tokens."""
        if len(prompts) != len(continuations):
            raise InvalidArgumentError(f"{len(prompts)} prompts but {len(continuations)} continuations.")
        rows = [self.split(p, c) for p, c in zip(prompts, continuations)]
        out: list[float] = [float("nan")] * len(rows)
        todo = [i for i, (ids, start) in enumerate(rows) if len(ids) > start and start > 0]
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for lo in range(0, len(todo), self.batch_size):
            chunk = todo[lo:lo + self.batch_size]
            seqs = []
            for i in chunk:
                ids, start = rows[i]
                cut = max(0, len(ids) - self.max_length)  # keep the continuation, trim the prompt's head
                seqs.append((ids[cut:], start - cut))
            width = max(len(s) for s, _ in seqs)
            input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            target = torch.zeros((len(seqs), width), dtype=torch.bool)
            for r, (ids, start) in enumerate(seqs):  # right padding: positions are plain aranges
                input_ids[r, :len(ids)] = torch.tensor(ids)
                mask[r, :len(ids)] = 1
                target[r, max(start, 1):len(ids)] = True
            input_ids, mask, target = input_ids.to(device), mask.to(device), target.to(device)
            # the LM head only where a continuation token is predicted: with a large vocabulary
            # (Gemma: 262k) the head costs more than the transformer, and prompt positions need none
            shared = _shared_prefix(seqs) if self.shares_prompts else 0
            hidden = self._hidden(input_ids, mask, shared)
            sel = target[:, 1 + shared:]
            logits = self.model.get_output_embeddings()(hidden[:, :-1][sel]).float()
            cap = getattr(text_config(self.model), "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            nll = -torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1 + shared:][sel][:, None]).squeeze(-1)
            rows_of = torch.arange(len(seqs), device=device)[:, None].expand_as(sel)[sel]
            totals = torch.zeros(len(seqs), device=device).index_add_(0, rows_of, nll)
            per_row = totals / sel.sum(-1).clamp(min=1)
            for r, i in enumerate(chunk):
                out[i] = math.exp(per_row[r].item())
        return out

    def _hidden(self, input_ids: torch.Tensor, mask: torch.Tensor, shared: int) -> torch.Tensor:
        """The decoder's final hidden states [B, W - shared] of right-padded rows from position ``shared`` on. The
        first ``shared`` tokens, which every row has (a prompt's continuations), run once, as one row, whose cache the
        rows then extend: the same states up to the order of floating-point sums."""
        decoder = self.model.get_decoder()
        if not shared:
            return decoder(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        decoder(input_ids=input_ids[:1, :shared], use_cache=True, **cache_kwargs(decoder, cache))
        cache.batch_repeat_interleave(input_ids.shape[0])
        return decoder(input_ids=input_ids[:, shared:], attention_mask=mask, use_cache=True,
                       **cache_kwargs(decoder, cache)).last_hidden_state


def _shared_prefix(seqs: list[tuple[list[int], int]]) -> int:
    """How many leading tokens every row of ``seqs`` (``(ids, continuation start)``) has in common and can share: none
    of a single row, and never a position whose prediction is scored (before ``start - 1``)."""
    if len(seqs) < 2:
        return 0
    first = seqs[0][0]
    limit = min(max(start, 1) - 1 for _, start in seqs)
    n = 0
    while n < limit and all(len(ids) > n and ids[n] == first[n] for ids, _ in seqs):
        n += 1
    return n


#: the layers whose KV a transformers ``DynamicCache`` holds (``config.layer_types``; a model without the list has
#: full attention throughout)
_ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


def _attention_only(model) -> bool:
    """Whether ``model``'s rows can extend a shared prompt's cache: its decoder takes a KV cache and every layer is an
    attention layer (a state-space or linear-attention layer keeps another kind of state; such a model runs every
    row whole)."""
    layer_types = getattr(text_config(model), "layer_types", None) or []
    return takes_cache(model.get_decoder()) and set(layer_types) <= _ATTENTION_LAYERS

"""Token-level reward model (``kind: token``): one forward over the prefix scores every next token.

After the committed prefix ``x_{<t}`` with last hidden state ``h_t`` (of the truncated backbone), the reward of
any candidate token ``v`` of the vocabulary is::

    ρ(x_{<t}, v) = f(⟨W h_t, e_v⟩ + b·h_t + c)

with ``e_v`` the backbone's frozen output embedding of ``v``, ``W`` d×d (or ``U·V`` of rank r), ``b·h_t + c``
the prefix baseline and ``f`` the output function (``sigmoid``). This is the ``linear_with_baseline`` head of
Troshin, Niculae & Fokkens (TMLR 2025, serjtroshin/rad-q). Why d×d and a baseline (docs/training.md):

* decoding cost: ``W h_t`` is one d×d product per row and step, whatever k is, next to a transformer forward
  over one token; a low rank saves parameters, not time. The matrix of rewards over (prefix, token) already has
  rank ≤ d + 1 (the paper's point: low rank relative to |V|), so restricting W further only removes capacity;
  ``token_head.rank`` is there for wide backbones where d² parameters matter;
* the baseline carries what the prefix itself is worth (the cumulative loss asks every prefix of a toxic text
  to score high, whatever token comes next), so W only has to model how each candidate moves it.

``forward`` returns the same thing as :class:`~steerkit.rewards.model.RewardModel`'s: ``rewards[:, t]`` is the
reward of the text ending with token ``t``, i.e. of the *realized* token ``x_t`` after the prefix before it.
Training (the paper's cumulative loss at the realized next token of every prefix), metrics and ``score_texts``
therefore work unchanged. A position with no real token before it (the start token) gets ``f(b·h_t + c)``.
Decoding uses :meth:`TokenRewardModel.run` (query and baseline of the last position, KV as a flat list) and
:func:`candidate_logits` (the k candidates' rewards from the query: a gather and k dot products, or one
``[B, V]`` product when k is a large part of the vocabulary).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ...errors import VocabularyMismatchError
from ...hf_compat import cache_kwargs, output_cache
from ..model import OUTPUT_FUNCTIONS, RewardModel, RewardOutput, TokenHeadSettings
from ..vocab import same_vocabulary

#: from this share of the vocabulary in distinct candidates on, they are scored with one [B, V] product and a gather
FULL_PRODUCT_FRACTION = 0.25


def textless_ids(tokenizer) -> torch.Tensor | None:
    """Ids [n] of the tokens that add no text (the tokenizer's special tokens: end of text, padding, start), or
    None without a tokenizer. A candidate among them leaves the text as it is, so it gets the reward of the
    committed text, not the head's reward of an embedding that no training text contains."""
    if tokenizer is None:
        return None
    return torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)


def keep_text_reward(logits: torch.Tensor, candidates: torch.Tensor, current: torch.Tensor | None,
                     textless: torch.Tensor | None) -> torch.Tensor:
    """``logits`` [..., k] with the textless candidates' entries replaced by ``current`` [...] (the logit of
    the committed text)."""
    if textless is None or current is None or not textless.numel():
        return logits
    is_textless = torch.isin(candidates, textless.to(candidates.device))
    return torch.where(is_textless, current[..., None].to(logits.dtype), logits)


def candidate_logits(query: torch.Tensor, offset: torch.Tensor, embeddings: torch.Tensor,
                     candidates: torch.Tensor, current: torch.Tensor | None = None,
                     textless: torch.Tensor | None = None) -> torch.Tensor:
    """``⟨query_b, e_v⟩ + offset_b`` for candidates [B, k]; query [B, d], offset [B], embeddings [V, d].

    Rows' candidate sets overlap (the LM's top-k of similar prefixes share most tokens), so on the CPU each distinct
    candidate's embedding is gathered once and matched against every row's query in one [U, d]×[d, B] product
    (half the memory traffic of a per-row gather at batch 8, k = 1000). On an accelerator the per-row gather is
    kept: ``torch.unique``'s data-dependent size would stall the decoding loop on a host sync every step. From a
    quarter of the vocabulary on, one [B, V] product is cheaper. With ``textless`` (see :func:`textless_ids`),
    those candidates get ``current`` [B], the logit of the committed text.
    """
    full = FULL_PRODUCT_FRACTION * embeddings.shape[0]
    if candidates.shape[1] >= full:
        logits = None
    elif candidates.device.type != "cpu":
        logits = torch.bmm(embeddings[candidates], query[:, :, None]).squeeze(-1) + offset[:, None]
    else:
        ids, inverse = torch.unique(candidates, return_inverse=True)
        rows = torch.arange(candidates.shape[0], device=candidates.device)[:, None]
        logits = (embeddings[ids] @ query.T)[inverse, rows] + offset[:, None] if ids.numel() < full else None
    if logits is None:  # one [B, V] product and a gather
        logits = (query @ embeddings.T).gather(1, candidates) + offset[:, None]
    return keep_text_reward(logits, candidates, current, textless)


def realized_logits(query: torch.Tensor, offset: torch.Tensor, embeddings: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None, textless: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, T] of each realized token ``x_t`` from the query and baseline at ``t - 1``; positions with no
    real token before them (the start token, padding) get the baseline ``offset[:, t]``. With ``textless`` (see
    :func:`textless_ids`), a realized textless token keeps the logit of the text before it, as
    :func:`candidate_logits` scores it."""
    nxt = (query[:, :-1] * embeddings[input_ids[:, 1:]]).sum(-1) + offset[:, :-1]
    logits = torch.cat([offset[:, :1], nxt], dim=1)
    if attention_mask is not None and attention_mask.dim() == 2:
        prev = torch.cat([torch.zeros_like(attention_mask[:, :1]), attention_mask[:, :-1]], dim=1).bool()
        logits = torch.where(prev, logits, offset)
    else:
        prev = torch.ones_like(input_ids, dtype=torch.bool)
        prev[:, 0] = False
    if textless is not None and textless.numel():
        keeps = ~torch.isin(input_ids, textless.to(input_ids.device)) | ~prev
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        source = torch.where(keeps, positions, torch.zeros_like(positions)).cummax(dim=1).values
        logits = logits.gather(1, source)
    return logits


def check_vocabulary(name: str, model, lm_tokenizer) -> None:
    """Raise :class:`VocabularyMismatchError` unless the LM's tokenizer is the reward model's vocabulary."""
    if same_vocabulary(lm_tokenizer, model.tokenizer):
        return
    config = model.config
    raise VocabularyMismatchError(
        f"Reward {name!r} is a token-level reward model: it scores the language model's next-token ids with the "
        f"output embeddings of its backbone {config.backbone!r} ({len(model.tokenizer)} tokens), but the LM's "
        f"tokenizer is another vocabulary ({len(lm_tokenizer)} tokens). Use a sequence reward model for this LM "
        "(e.g. `toxicity` instead of `toxicity-token`: it re-tokenizes candidate text for any tokenizer family), "
        f"or an LM of the {config.backbone!r} family.")


def is_token_directory(directory) -> bool:
    """True for a reward-model directory or an ONNX export of the ``token`` kind (:mod:`steerkit.rewards.kinds`,
    where loading looks a directory's kind up)."""
    from ..kinds import get_kind

    return get_kind("token").detects(directory)


class TokenHead(nn.Module):
    """``h -> (W h, b·h + c)``: the query a candidate's output embedding is matched against, and the baseline."""

    def __init__(self, hidden: int, settings: TokenHeadSettings):
        super().__init__()
        self.rank = settings.rank
        if settings.rank is None:
            self.proj = nn.Linear(hidden, hidden, bias=False)
        else:
            self.down = nn.Linear(hidden, settings.rank, bias=False)
            self.up = nn.Linear(settings.rank, hidden, bias=False)
        self.baseline = nn.Linear(hidden, 1, bias=False) if settings.baseline else None
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        query = self.proj(hidden) if self.rank is None else self.up(self.down(hidden))
        offset = self.bias.expand(hidden.shape[:-1])
        if self.baseline is not None:
            offset = offset + self.baseline(hidden).squeeze(-1)
        return query, offset

    def reset(self) -> None:
        """W = 0 (so training starts from the baseline alone, a prefix-level head), small random b, c = 0."""
        if self.rank is None:
            nn.init.zeros_(self.proj.weight)
        else:
            nn.init.normal_(self.down.weight, std=0.02)
            nn.init.zeros_(self.up.weight)
        if self.baseline is not None:
            nn.init.normal_(self.baseline.weight, std=0.02)
        nn.init.zeros_(self.bias)


class TokenVocabulary:
    """What the token session reads of any token-level runner (torch, ONNX, llama.cpp) that has
    ``output_embeddings`` [V, d] and ``tokenizer``: the rows it can score and the ids that add no text."""

    @property
    def vocab_rows(self) -> int:
        return int(self.output_embeddings.shape[0])

    @functools.cached_property
    def textless_ids(self) -> torch.Tensor | None:
        """The ids of the tokens that add no text (:func:`textless_ids`)."""
        return textless_ids(self.tokenizer)


class TokenRewardModel(TokenVocabulary, RewardModel):
    r"""A token-level reward model: (the first blocks of) a causal LM plus a :class:`TokenHead` over its frozen
    output embeddings. Saved and loaded like any reward-model directory (``kind: "token"`` in its config).

    Examples:

    ```python
    >>> import torch
    >>> from steerkit.rewards.token.model import TokenRewardModel, candidate_logits
    >>> from steerkit.testing import make_tokenizer, tiny_lm
    >>> tok = make_tokenizer()
    >>> rm = TokenRewardModel.from_causal_lm(tiny_lm(tok), tok, num_layers=1, name="tiny")
    >>> rm.config.kind
    'token'
    >>> enc = rm.encode(["I hate it"])
    >>> rewards = rm(enc["input_ids"], attention_mask=enc["attention_mask"]).rewards  # realized tokens
    >>> rewards.shape == enc["input_ids"].shape
    True

    ```
    """

    kind = "token"

    def __init__(self, backbone: nn.Module, config, tokenizer=None, output_embeddings: torch.Tensor | None = None):
        super().__init__(backbone, config, tokenizer)
        self.head = TokenHead(config.hidden_size, config.token_head or TokenHeadSettings())
        if output_embeddings is None:
            output_embeddings = backbone.get_input_embeddings().weight
        # frozen and not saved: resolved from the backbone reference (checked by fingerprint) on every load
        self.register_buffer("output_embeddings", output_embeddings.detach(), persistent=False)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, reference: str, num_layers: int | None = None, *, name: str = "reward",
                      attribute: str = "", max_length: int = 512,
                      head: TokenHeadSettings | None = None) -> "TokenRewardModel":
        from ...models import load_causal_lm

        lm, tokenizer, source = load_causal_lm(reference)
        return cls._wrap(lm, tokenizer, source.reference, source.fingerprint, num_layers, name=name,
                         attribute=attribute, max_length=max_length, kind="token",
                         token_head=head or TokenHeadSettings())

    @classmethod
    def from_causal_lm(cls, lm, tokenizer, num_layers: int | None = None, *, reference: str = "<in-memory>",
                       fingerprint: str = "in-memory", name: str = "reward", attribute: str = "",
                       max_length: int = 512, head: TokenHeadSettings | None = None) -> "TokenRewardModel":
        return cls._wrap(lm, tokenizer, reference, fingerprint, num_layers, name=name, attribute=attribute,
                         max_length=max_length, kind="token", token_head=head or TokenHeadSettings())

    @classmethod
    def _from_parts(cls, backbone, config, tokenizer, lm) -> "TokenRewardModel":
        out = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
        weight = getattr(out, "weight", None)
        return cls(backbone, config, tokenizer, weight)

    def _init_head(self) -> None:
        self.head.reset()

    # -- forward ------------------------------------------------------------------------------
    def project(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool = False, cache_position=None):
        """(query [B, n, d], offset [B, n], past_key_values or None) for every position."""
        extra = {} if cache_position is None else {"cache_position": cache_position}  # a static cache's columns
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=use_cache, **cache_kwargs(self.backbone, past_key_values), **extra)
        query, offset = self.head(out.last_hidden_state)
        return query, offset, (output_cache(out) if use_cache else None)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool = False) -> RewardOutput:
        """Rewards [B, T] of the realized tokens: position t scores ``x_t`` from the hidden state at t - 1."""
        query, offset, past = self.project(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        logits = realized_logits(query, offset, self.output_embeddings, input_ids, attention_mask, self.textless_ids)
        return RewardOutput(self.output(logits), past)

    def output(self, logits: torch.Tensor) -> torch.Tensor:
        return OUTPUT_FUNCTIONS[self.config.output_function](logits)

    # -- decoding (the runner interface shared with the ONNX model) ------------------------------------
    @property
    def device(self) -> torch.device:
        return self.output_embeddings.device

    def empty_past(self, batch: int) -> list[torch.Tensor]:
        cfg = self.backbone.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype = next(self.parameters()).dtype
        return [torch.zeros((batch, heads, 0, head_dim), dtype=dtype, device=self.device)
                for _ in range(2 * self.config.num_layers)]

    @torch.no_grad()
    def run(self, input_ids, position_ids, mask, past: list[torch.Tensor]):
        """One cached forward: ids/positions [B, n], additive mask [B, 1, n, T + n], past KV (2·L tensors
        [B, H, T, d]). Returns (query [B, n, d], offset [B, n], present KV [B, H, T + n, d])."""
        from transformers import DynamicCache

        L = self.config.num_layers
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(L)])
        query, offset, cache = self.project(input_ids, attention_mask=mask.to(self.device),
                                            position_ids=position_ids, past_key_values=cache, use_cache=True)
        return query, offset, [t for layer in cache.layers for t in (layer.keys, layer.values)]

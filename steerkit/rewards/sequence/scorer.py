"""A reward model as a decoding-time reward: its backend's cache (from the backend table) and the tokenizer
strategy (same vocabulary as the LM, or bridged)."""

from __future__ import annotations

from typing import Literal

import torch

from ..backends import DEFAULT_BACKEND, check_backend, get_backend, resolve_backend
from ..model import RewardModel
from .sessions import SameTokenizerSession
from ..vocab import same_vocabulary

Context = Literal["continuation", "full"]


class RewardModelScorer:
    """Scores candidates with a :class:`RewardModel` through a shared-prefix cache.

    ``backend`` names a registered backend (:mod:`steerkit.rewards.backends`) that runs ``model``: what that
    backend's ``load`` returned, or a torch :class:`RewardModel` (the ``onnx`` backend exports it on first use);
    ``"auto"`` (the default) is ``torch`` here, where there is a model and no directory to look at.
    ``context="continuation"`` scores only the generated text (what toxicity and sentiment evaluations
    score); ``"full"`` scores prompt + generated text.
    """

    def __init__(self, model: RewardModel, name: str | None = None, *, backend: str = DEFAULT_BACKEND,
                 context: Context = "continuation"):
        self.model = model
        self.name = name or model.config.name
        self.backend = resolve_backend(check_backend(backend))
        self.context = context
        self._vocab_match: dict[int, bool] = {}

    def new_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return get_backend(self.backend).new_cache(self.model, input_ids, attention_mask)

    def start(self, prefixes: list[str], lm_tokenizer):
        texts = prefixes if self.context == "full" else [""] * len(prefixes)
        key = id(lm_tokenizer)
        if key not in self._vocab_match:
            self._vocab_match[key] = same_vocabulary(lm_tokenizer, self.model.tokenizer)
        if self._vocab_match[key]:
            enc = self.model.encode(texts)
            return SameTokenizerSession(self.new_cache(enc["input_ids"], enc["attention_mask"]),
                                        lm_tokenizer.pad_token_id)
        from .bridge import BridgedSession

        return BridgedSession(self, texts, lm_tokenizer)

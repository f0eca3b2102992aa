"""A reward model as a decoding-time reward: picks the backend cache and the tokenizer strategy."""

from __future__ import annotations

from typing import Literal

import torch

from .model import RewardModel
from .sessions import SameTokenizerSession

Context = Literal["continuation", "full"]


def same_vocabulary(a, b) -> bool:
    """True when two tokenizers map every token string to the same id (candidate ids can be shared)."""
    if a is b:
        return True
    return len(a) == len(b) and a.get_vocab() == b.get_vocab()


class RewardModelScorer:
    """Scores candidates with a :class:`RewardModel` through a shared-prefix cache.

    ``context="continuation"`` scores only the generated text (what toxicity and sentiment evaluations
    score); ``"full"`` scores prompt + generated text.
    """

    def __init__(self, model: RewardModel, name: str | None = None, *, backend: str = "torch",
                 context: Context = "continuation"):
        self.model = model
        self.name = name or model.config.name
        self.backend = backend
        self.context = context
        self._vocab_match: dict[int, bool] = {}

    def new_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        if self.backend == "torch":
            from .torch_cache import TorchScoringCache

            return TorchScoringCache(self.model, input_ids, attention_mask)
        if self.backend == "onnx":
            from .onnx_backend import OnnxScoringCache

            return OnnxScoringCache.for_model(self.model, input_ids, attention_mask)
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(f"Unknown reward backend {self.backend!r}; use 'torch' or 'onnx'.")

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

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

    #: Score on a preallocated cache (:mod:`.static_cache`): ``"compiled"``, with the candidate scoring compiled, on
    #: the copy that ``assemble(compile=True)`` makes (:meth:`compiled_form`); ``"eager"``, the same layout run
    #: eagerly; None: the backend's own cache.
    static: str | None = None

    @property
    def candidate_bounds(self) -> tuple[float, float] | None:
        """ρ lies in [0, 1] (the output function is a sigmoid or a clamp) and each candidate costs a block of the
        forward, so the engine may leave out candidates that cannot be chosen (:mod:`steerkit.engine.pruning`); not
        on the static scoring cache, whose compiled forward is made per block count."""
        return None if self.static else (0.0, 1.0)

    def compiled_form(self, *, compiled: bool | None = None) -> "RewardModelScorer":
        """This reward as ``compile=True`` runs it (:func:`~steerkit.rewards.static_kv.static_form`): a torch model
        on the static scoring cache, its candidate scoring compiled, on a CUDA device, and on a CPU with the
        ``torch-int8`` backend where the CPU multiplies int8 (VNNI, AMX: there the compiled scoring of all k candidates
        beat the eager pruned one, docs/performance.md, "A compiled step's attention"); otherwise this reward
        itself."""
        from ..static_kv import static_form

        return static_form(self, compiled)

    def new_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        if self.static:
            from .static_cache import StaticScoringCache

            return StaticScoringCache(self.model, input_ids, attention_mask, compiled=self.static == "compiled")
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

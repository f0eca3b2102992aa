"""A token-level head on the language model's *own* final hidden state (``token_head.lm_state``): steering for the
cost of one small product per step.

A token-level reward model scores every next token of the vocabulary from the last hidden state ``h_t`` of its
backbone (:mod:`steerkit.rewards.token.model`). When that backbone is the whole LM, frozen and read as the LM reads
a prompt (no start token), ``h_t`` is the state the LM has just computed for its own next-token logits: the input
of its output layer at the last position. steerkit's engine keeps it (:func:`steerkit.engine.lm_cache.lm_forward`)
and hands it to :class:`LMStateSession`, so a step costs the head's ``U·V h_t`` and ``b·h_t`` (rank r: 2·r·d
multiply-adds per row) plus the k candidates' dot products, and no reward-model forward at all.

What follows from reading the LM's state:

* **Only its LM.** The head was fitted to one LM's hidden states: :func:`check_lm` refuses another LM (the model
  directory's ``backbone_fingerprint`` against the LM's, or the output embeddings where an LM built in code has no
  fingerprint) with :class:`~steerkit.errors.LMStateUnavailableError`.
* **Only steerkit's engine core.** Its transformers LM and its llama.cpp LM (``engine="llama.cpp"``, which reads the
  state from llama.cpp's embeddings output, :mod:`steerkit.engine.llama_cpp_lm`) hand rewards the LM's hidden state.
  transformers' ``generate`` (the ``LogitsProcessor``), vLLM, llama-cpp-python's own loop (``LlamaCppRAD``) and the
  compiled static-shape step do not; there the reward raises the same error, naming the token-level reward that
  runs its own backbone (``toxicity-token``) as the one to use.
* **The prompt is read.** The LM's state includes the prompt (and a chat template, where one is applied), so the
  reward scores prompt + continuation, as a token reward with ``context="full"`` does; it has no ``continuation``
  mode.
* **No state of its own.** The LM's cache is the reward's cache: the session keeps nothing between steps (``commit``
  does nothing), so rows join and leave for free. A candidate that adds no text (end of text, padding) gets the
  prefix's own worth, the baseline ``f(b·h_t + c)``, since the state says what the text is worth whatever comes
  next; the stand-alone model (``score_texts``, training's metrics) keeps the last text token's reward for a realized
  special token instead, which no training text has.
"""

from __future__ import annotations

import torch

from ...errors import LMStateUnavailableError
from .model import candidate_logits, check_vocabulary

#: what to use instead, in the errors below
_ELSEWHERE = ("Use it through steerkit's own engine core (steerkit.generate, `steerkit generate`, `steerkit serve`, "
              "`steerkit eval`, without --compile; --engine llama.cpp included), or use a token-level reward that "
              "runs its own backbone there (e.g. `toxicity-token`).")


def no_state_error(name: str) -> LMStateUnavailableError:
    """The error for a reward that reads the LM's state where the engine hands it none."""
    return LMStateUnavailableError(
        f"Reward {name!r} reads the language model's own final hidden state (token_head.lm_state), and this "
        f"engine does not hand it to rewards. {_ELSEWHERE}")


def check_lm(name: str, model, lm) -> None:
    """Raise :class:`LMStateUnavailableError` unless ``lm`` is the LM the head of ``model`` was trained on."""
    if lm is None:
        raise no_state_error(name)
    config = model.config
    hidden = getattr(getattr(lm, "config", None), "hidden_size", None)
    if hidden is not None and hidden != config.hidden_size:
        raise LMStateUnavailableError(
            f"Reward {name!r} reads the hidden state of {config.backbone!r} (width {config.hidden_size}), but the "
            f"language model's is {hidden} wide: it steers {config.backbone!r} only.")
    theirs, ours = getattr(lm, "steerkit_fingerprint", None), config.backbone_fingerprint
    if theirs is not None and ours != "in-memory":
        if theirs != ours:
            raise LMStateUnavailableError(
                f"Reward {name!r} was trained on the hidden states of {config.backbone!r} (weights "
                f"{ours[:16]}…), but the language model's weights are {theirs[:16]}…: a head on one LM's own state "
                f"means nothing for another. Generate with {config.backbone!r}, or use a reward that runs its own "
                "backbone (e.g. `toxicity-token`).")
        return
    out = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    embeddings = model.output_embeddings
    if weight is None or weight.shape != embeddings.shape or not torch.equal(
            weight.detach().to(embeddings.device, embeddings.dtype), embeddings):
        raise LMStateUnavailableError(
            f"Reward {name!r} reads the hidden state of {config.backbone!r}; the language model has no fingerprint "
            "to check and its output embeddings are not that model's, so it is another LM. Generate with "
            f"{config.backbone!r}.")


class LMStateSession:
    """Rows of a reward that reads the LM's state: :meth:`score` takes the candidates [B, k] and the LM's final
    hidden state at each row's last position [B, d]; nothing is kept between steps, so rows join and leave freely.
    The candidates are the LM's own token ids and :func:`check_lm` made sure the LM is the head's, so they index its
    output embeddings without a per-step check (which would read the largest id back to the host every step)."""

    reads_lm_state = True

    def __init__(self, reward):
        self.reward, self.model = reward, reward.model
        textless = self.model.textless_ids
        self.textless = None if textless is None else textless.to(self.model.device)

    def score(self, candidates: torch.Tensor, lm_state: torch.Tensor | None = None) -> torch.Tensor:
        """Rewards [B, k] of each row's text extended by each candidate LM token [B, k], from ``lm_state`` [B, d]."""
        if lm_state is None:
            raise LMStateUnavailableError(
                f"Reward {self.reward.name!r} reads the language model's own final hidden state, and none was "
                f"handed to its session. {_ELSEWHERE}")
        model, device = self.model, candidates.device
        candidates = candidates.to(model.device).long()
        state = lm_state.to(model.device, model.output_embeddings.dtype)
        with torch.no_grad():
            query, offset = model.head(state)
        logits = candidate_logits(query, offset, model.output_embeddings, candidates, offset, self.textless)
        return model.output(logits).to(device)

    def commit(self, tokens: torch.Tensor) -> None:
        """Nothing to do: the LM reads the chosen token, and its next state is the next step's."""

    def keep_rows(self, index: torch.Tensor) -> None:
        """Nothing to do: the rows' states come with each step."""

    def add_rows(self, other: "LMStateSession") -> None:
        if not isinstance(other, LMStateSession) or other.model is not self.model:
            raise TypeError("add_rows() needs an LMStateSession started by the same reward, got "
                            f"{type(other).__name__}.")


def start_lm_state(reward, prefixes: list[str], lm_tokenizer, lm) -> LMStateSession:
    """The session of a reward that reads the LM's state (the prompts ``prefixes`` are read by the LM, not here),
    after checking the LM and its vocabulary."""
    if not hasattr(reward.model, "head"):
        raise LMStateUnavailableError(
            f"Reward {reward.name!r} reads the LM's own state with its head in torch; its {reward.backend!r} backend "
            "has no head to run. Load it with the default backend.")
    check_lm(reward.name, reward.model, lm)
    check_vocabulary(reward.name, reward.model, lm_tokenizer)
    return LMStateSession(reward)

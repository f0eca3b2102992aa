"""RAD inside vLLM: a v1 logits processor, offline (``LLM(..., logits_processors=[RADLogitsProcessor])``) and
behind vLLM's OpenAI server (``--logits-processors steerkit.integrations.vllm:RADLogitsProcessor``).

A request asks for steering through its extra arguments: ``SamplingParams(extra_args={"rewards": {"toxicity":
-20}, "k": 20})`` offline, ``extra_body={"vllm_xargs": {"rewards": ["toxicity=-20"], "k": 20}}`` with the
``openai`` client (:mod:`steerkit.integrations.requests` reads them). :meth:`RADLogitsProcessor.validate_params`
checks them with steerkit's one parser before the request is scheduled (a ``VLLMValidationError`` naming the
field: an exception offline, a 400 over HTTP); requests without them are not touched.

``k`` is bounded by the model's vocabulary, which vLLM does not pass to ``validate_params`` (a classmethod given
only the ``SamplingParams``): every processor vLLM builds records its model's vocabulary size in this process
(:func:`known_vocab_size`), and an engine in the validating process (offline ``LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) builds them before it takes a request. A frontend whose engine runs in
another process (vLLM's API server, always) never sees one: there ``$STEERKIT_VLLM_VOCAB_SIZE`` says it. A
request that still gets past validation with a k above the vocabulary is refused where it is steered: an ERROR
log naming ``vllm_xargs.k``, and the request ends at its first step (EOS: vLLM gives a logits processor no other
way to end a request).

The processor is a thin adapter: vLLM's ``BatchUpdate`` (removed, then added, then moved) drives
:class:`~steerkit.integrations.batch.HostedBatch`, which keeps the rows, their reward sessions and the step;
``apply`` runs the RAD step on the steered rows and vLLM's sampler samples (temperature, seed, top-p). docs/vllm.md
says what is supported.
"""

from __future__ import annotations

import os

import torch
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..errors import SteerkitError
from .batch import HostedBatch
from .requests import REWARDS, asks_for_steering, error_field, parse_steering

__all__ = ["RADLogitsProcessor", "VOCAB_ENV", "known_vocab_size", "preload"]

#: The explicit setting, for a frontend whose engine runs in another process: the served model's vocabulary size.
VOCAB_ENV = "STEERKIT_VLLM_VOCAB_SIZE"
_LEARNED: set[int] = set()  # the vocabulary sizes of the models this process's processors were built for


def known_vocab_size() -> int | None:
    """The vocabulary ``validate_params`` bounds k by: the largest of the models whose processors vLLM built in this
    process (two engines of different models in one process: a k only the larger allows passes validation and is
    refused where it is steered), else ``$STEERKIT_VLLM_VOCAB_SIZE``, else None (k is only checked to be ≥ 1)."""
    if _LEARNED:
        return max(_LEARNED)
    value = os.environ.get(VOCAB_ENV, "").strip()
    if not value:
        return None
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"${VOCAB_ENV} must be the served model's vocabulary size (a positive integer), "
                         f"not {value!r}")
    return size


def _steering(params, vocab_size: int | None = None):
    try:
        return parse_steering(params.extra_args, vocab_size=vocab_size)
    except SteerkitError as exc:
        field = error_field(exc)
        raise VLLMValidationError(f"vllm_xargs.{field}: {exc}", parameter=f"vllm_xargs.{field}") from None


class RADLogitsProcessor(LogitsProcessor):
    """Reward-Augmented Decoding as a vLLM v1 logits processor (not argmax-invariant: it changes greedy picks)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        if asks_for_steering(sampling_params.extra_args):
            _steering(sampling_params, known_vocab_size())

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        from ..models import load_tokenizer

        model_config = vllm_config.model_config
        self.tokenizer = load_tokenizer(model_config.tokenizer)
        self.vocab_size = model_config.get_vocab_size()
        _LEARNED.add(int(self.vocab_size))
        self.device = torch.device(device)
        eos = self.tokenizer.eos_token_id
        self.batch = HostedBatch(self.tokenizer, [eos] if eos is not None else [])

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.batch.remove(index)
        for index, params, prompt_ids, output_ids in batch_update.added:
            steering, error = None, None
            try:
                steering = self._request_steering(params)
            except VLLMValidationError as exc:  # got past validate_params: it did not know the vocabulary
                error = self._admitted_by_mistake(exc)
            except Exception as exc:  # noqa: BLE001 - validated before: only a setup failure (a load) here
                error = exc
            prompt = self.tokenizer.decode(prompt_ids or [], skip_special_tokens=True) if steering else ""
            self.batch.add(index, prompt, prompt_ids, output_ids, steering, error)
        for a, b, direction in batch_update.moved:
            self.batch.move(a, b, swap=direction == MoveDirectionality.SWAP)

    def _admitted_by_mistake(self, exc: VLLMValidationError) -> VLLMValidationError:
        why = (f"validate_params did not know the model's vocabulary of {self.vocab_size}: set ${VOCAB_ENV} in the "
               "API server's process" if exc.parameter == "vllm_xargs.k" else "validate_params accepted it")
        return VLLMValidationError(f"{exc.args[0]} (refused after vLLM admitted the request; {why})",
                                   parameter=exc.parameter)

    def _request_steering(self, params):
        if params is None or not asks_for_steering(params.extra_args):
            return None
        steering = _steering(params, self.vocab_size)  # validated before, so this holds (and is cached)
        if steering is not None and self.device.type != "cpu":
            from ..devices import move_reward

            for term in steering.terms:
                move_reward(term.reward, str(self.device))
        return steering

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.batch.active:
            return logits
        return self.batch.apply(logits)


def preload(*references: str) -> None:
    """Load rewards now (by reference), so that the first request that names one does not wait for its load."""
    for reference in references:
        REWARDS(reference)

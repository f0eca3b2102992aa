"""RAD inside vLLM: a v1 logits processor, offline (``LLM(..., logits_processors=[RADLogitsProcessor])``) and
behind vLLM's OpenAI server (``--logits-processors steerkit.integrations.vllm:RADLogitsProcessor``).

A request asks for steering through its extra arguments: ``SamplingParams(extra_args={"rewards": {"toxicity":
-20}, "k": 20})`` offline, ``extra_body={"vllm_xargs": {"rewards": ["toxicity=-20"], "k": 20}}`` with the
``openai`` client (:mod:`steerkit.integrations.requests` reads them). :meth:`RADLogitsProcessor.validate_params`
checks them with steerkit's one parser before the request is scheduled (a ``VLLMValidationError`` naming the
field: an exception offline, a 400 over HTTP); requests without them are not touched.

The processor is a thin adapter: vLLM's ``BatchUpdate`` (removed, then added, then moved) drives
:class:`~steerkit.integrations.batch.HostedBatch`, which keeps the rows, their reward sessions and the step;
``apply`` runs the RAD step on the steered rows and vLLM's sampler samples (temperature, seed, top-p). docs/vllm.md
says what is supported.
"""

from __future__ import annotations

import torch
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..errors import SteerkitError
from .batch import HostedBatch
from .requests import REWARDS, asks_for_steering, error_field, parse_steering

__all__ = ["RADLogitsProcessor", "preload"]


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
            _steering(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        from ..models import load_tokenizer

        model_config = vllm_config.model_config
        self.tokenizer = load_tokenizer(model_config.tokenizer)
        self.vocab_size = model_config.get_vocab_size()
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
            except Exception as exc:  # noqa: BLE001 - validated before: only a setup failure (a load) here
                error = exc
            prompt = self.tokenizer.decode(prompt_ids or [], skip_special_tokens=True) if steering else ""
            self.batch.add(index, prompt, prompt_ids, output_ids, steering, error)
        for a, b, direction in batch_update.moved:
            self.batch.move(a, b, swap=direction == MoveDirectionality.SWAP)

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

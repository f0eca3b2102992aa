"""The one set-up path: from what a user names (an LM reference, rewards, k, backend, device) or a
:class:`~steerkit.config.SteeringConfig` to a ready generator.

Every surface sets up through here: :func:`steerkit.generate`, the CLI's ``generate`` and ``setup``, batch
files and Ray actors, evaluation runs (with their own reward cache), and the HTTP server's
:func:`~steerkit.serving.loading.engine_parts`. The order is fixed and cheap checks come first: the device
is resolved (a device this machine lacks fails before seconds of loading), every β is checked and the
rewards are loaded, the LM is loaded, and the LM and the torch reward models are placed on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .decoding import GenerationOutput


@dataclass
class Assembled:
    """An LM, its tokenizer and steering terms, placed on ``device`` (None: where they were loaded)."""

    model: object
    tokenizer: object
    terms: list
    k: int
    device: str | None = None
    defaults: dict = field(default_factory=dict)  # a config's sampling settings (generate's keyword arguments)

    def generator(self):
        from .decoding import RewardAugmentedGenerator

        return RewardAugmentedGenerator(self.model, self.tokenizer, self.terms, k=self.k)

    def generate(self, prompts, **kwargs):
        """``generate`` with the config's sampling settings, overridden by ``kwargs``."""
        return self.generator().generate(prompts, **{**self.defaults, **kwargs})


def assemble(lm="smollm2-135m-instruct", rewards=None, *, k: int = 20, backend: str = "auto",
             device: str | None = None, load: Callable | None = None, defaults: dict | None = None) -> Assembled:
    """Set up steering: ``lm`` is a model reference (packaged name, directory, .gguf file, hub id) or a
    ``(model, tokenizer)`` pair; ``rewards`` any form :func:`steerkit.params.parse_rewards` reads; ``load``
    (``load(reference, context)``) finds rewards by reference (default: the registry and reward-model
    directories, for ``backend``; ``"auto"``: an ONNX export runs on ``onnx``, anything else on ``torch``)."""
    from .devices import place, resolve_device
    from .models import load_causal_lm_cached
    from .params import parse_rewards, resolve_terms
    from .terms import reference_loader

    if device is not None:
        device = resolve_device(device)  # a bad or absent device fails before the slow loads
    terms = resolve_terms(parse_rewards(rewards), load or reference_loader(backend))
    model, tokenizer = lm if isinstance(lm, tuple) else load_causal_lm_cached(str(lm))[:2]
    if device is not None:
        model = place(model, terms, device)
    return Assembled(model, tokenizer, terms, k, device, dict(defaults or {}))


def assemble_config(config, *, load: Callable | None = None) -> Assembled:
    """Set up a :class:`~steerkit.config.SteeringConfig` (its LM, rewards, k, backend and device); its sampling
    settings become the defaults of :meth:`Assembled.generate`."""
    return assemble(config.lm, list(config.rewards), k=config.k, backend=config.backend, device=config.device,
                    load=load, defaults=generation_settings(config))


def generation_settings(config) -> dict:
    """A config's sampling settings as ``generate`` keyword arguments."""
    return {"max_new_tokens": config.max_new_tokens, "do_sample": config.do_sample,
            "temperature": config.temperature, "num_return_sequences": config.num_return_sequences,
            "seed": config.seed, "chat_template": config.chat_template}


def generate(prompts: Sequence[str] | str, *, lm="smollm2-135m-instruct", rewards=None, k: int = 20,
             backend: str = "auto", device: str | None = None, **kwargs) -> GenerationOutput:
    """Steered generation in one call.

    ``lm`` is a model reference (packaged name, directory, .gguf file, hub id) or a ``(model, tokenizer)``
    pair; ``rewards`` maps reward references (registered names or reward-model directories) or
    :class:`~steerkit.rewards.base.Reward` objects to β; ``backend`` runs them (``"auto"``, the default: an ONNX
    export directory on ``onnx``, anything else on ``torch``). Other keyword arguments follow
    ``transformers``' ``generate``: ``max_new_tokens``, ``do_sample``, ``temperature``,
    ``num_return_sequences``, ``eos_token_id``, ``stop_strings``, plus ``seed``, ``chat_template``,
    ``return_traces``, ``batch_size`` and ``progress``. ``device`` (cpu, cuda, …) moves the LM and the
    torch reward models there; without it everything stays where it is (loaded models: on the CPU).
    """
    return assemble(lm, rewards, k=k, backend=backend, device=device).generate(prompts, **kwargs)

"""The one set-up path: from what a user names (an LM reference, rewards, k, backend, device) or a
:class:`~steerkit.config.SteeringConfig` to a ready generator.

Every surface sets up through here: :func:`steerkit.generate`, the CLI's ``generate`` and ``setup``, batch
files and Ray actors, evaluation runs (with their own reward cache), and the HTTP server's
:func:`~steerkit.serving.loading.engine_parts`. The order is fixed and cheap checks come first: the device
is resolved (a device this machine lacks fails before seconds of loading), every β is checked and the
rewards are loaded, the LM is loaded, and the LM and the torch reward models are placed on the device.
"""

from __future__ import annotations

import functools
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
             device: str | None = None, load: Callable | None = None, defaults: dict | None = None,
             engine: str = "steerkit", compile: bool = False, dtype: str = "float32") -> Assembled:
    """Set up steering: ``lm`` is a model reference (packaged name, directory, .gguf file, hub id) or a
    ``(model, tokenizer)`` pair; ``rewards`` any form :func:`steerkit.params.parse_rewards` reads; ``load``
    (``load(reference, context)``) finds rewards by reference (default: the registry and reward-model
    directories, for ``backend``; ``"auto"``: an ONNX export runs on ``onnx``, anything else on ``torch``).
    ``engine="llama.cpp"`` runs the LM (a packaged model or a .gguf file) in llama.cpp, on the CPU; the step,
    the rewards and sampling are the same engine core's. ``compile=True`` runs steerkit's engine with the
    static-shape step compiled by ``torch.compile`` (:mod:`steerkit.engine.static_lm`); ``dtype="int8"`` stores the
    LM's linear weights in int8, ``dtype="bfloat16"`` in bf16 with bf16 matmuls (:mod:`steerkit.engine.lm_int8`)."""
    from .devices import place, resolve_device
    from .params import parse_rewards, resolve_terms
    from .terms import reference_loader
    from .validators import validate_engine_device, validate_lm_options

    validate_lm_options(engine, compile, dtype)
    if device is not None:
        device = resolve_device(device)  # a bad or absent device fails before the slow loads
        validate_engine_device(engine, device)
    terms = resolve_terms(parse_rewards(rewards), load or reference_loader(backend))
    model, tokenizer = lm if isinstance(lm, tuple) else load_lm(str(lm), engine)
    if device is not None:
        model = place(model, terms, device)
    if compile:
        terms = compiled_terms(terms)
    return Assembled(lm_runner(model, compile=compile, dtype=dtype), tokenizer, terms, k, device, dict(defaults or {}))


def compiled_terms(terms: list) -> list:
    """The terms with each reward in its :func:`compiled_reward` form."""
    import dataclasses

    out = []
    for term in terms:
        reward = compiled_reward(term.reward)
        out.append(term if reward is term.reward else dataclasses.replace(term, reward=reward))
    return out


def compiled_reward(reward):
    """A reward as the compiled engine runs it (``compile=True``): a torch reward model on a static session, its KV
    preallocated and its step compiled (:mod:`steerkit.rewards.static_kv`), where that pays: a token-level one
    anywhere, a sequence one on a CUDA device or with ``torch-int8`` on a CPU that multiplies int8; any other reward
    (ONNX, llama.cpp, a plugin's own) as it is."""
    compiled_form = getattr(reward, "compiled_form", None)
    return compiled_form() if callable(compiled_form) else reward


def lm_runner(model, *, compile: bool = False, dtype: str = "float32"):
    """The LM as steerkit's engine runs it: ``model``; its int8 copy (``dtype="int8"``); wrapped for the compiled
    static-shape step (``compile=True``)."""
    if dtype == "int8":
        from .engine.lm_int8 import as_int8

        model = as_int8(model)
    elif dtype == "bfloat16":
        from .engine.lm_int8 import as_bf16_lm

        model = as_bf16_lm(model)
    if compile:
        from .engine.static_lm import StaticLM

        model = StaticLM(model)
    return model


def load_lm(reference: str, engine: str = "steerkit"):
    """``(model, tokenizer)`` for an LM reference, loaded once per process for the engine that runs it."""
    if engine == "llama.cpp":
        return load_llama_cpp_lm_cached(reference)[:2]
    from .models import load_causal_lm_cached

    return load_causal_lm_cached(reference)[:2]


def load_llama_cpp_lm(reference: str, *, max_context: int | None = None, threads: int | None = None):
    """``(LlamaCppLM, tokenizer, source)`` for a packaged model or a ``.gguf`` file (llama.cpp runs GGUF only)."""
    from .engine.llama_cpp_lm import LlamaCppLM, import_llama_cpp
    from .errors import ModelFormatError
    from .models import load_tokenizer, resolve

    source = resolve(reference)
    if source.kind not in {"packaged", "gguf"} or not source.location.endswith(".gguf"):
        raise ModelFormatError(
            f"engine='llama.cpp' runs GGUF files; {reference!r} is a {source.kind} model. Pass a packaged model "
            "(e.g. smollm2-135m-instruct) or a .gguf file, or use engine='steerkit'.")
    import_llama_cpp()
    lm = LlamaCppLM(source.location, max_context=max_context, threads=threads, name=str(reference),
                    fingerprint=source.fingerprint)
    tokenizer = load_tokenizer(reference, source)
    if len(tokenizer) != lm.vocab_size:
        raise ModelFormatError(f"{reference!r}: the tokenizer has {len(tokenizer)} tokens but the GGUF's vocabulary "
                               f"has {lm.vocab_size}.")
    return lm, tokenizer, source


@functools.lru_cache(maxsize=2)
def load_llama_cpp_lm_cached(reference: str):
    """:func:`load_llama_cpp_lm`, memoised per process (the CLI and :func:`steerkit.generate` reuse models)."""
    return load_llama_cpp_lm(reference)


def assemble_config(config, *, load: Callable | None = None) -> Assembled:
    """Set up a :class:`~steerkit.config.SteeringConfig` (its LM, rewards, k, backend and device); its sampling
    settings become the defaults of :meth:`Assembled.generate`."""
    return assemble(config.lm, list(config.rewards), k=config.k, backend=config.backend, device=config.device,
                    load=load, defaults=generation_settings(config), engine=config.engine, compile=config.compile,
                    dtype=config.dtype)


def generation_settings(config) -> dict:
    """A config's sampling settings as ``generate`` keyword arguments."""
    return {"max_new_tokens": config.max_new_tokens, "do_sample": config.do_sample,
            "temperature": config.temperature, "num_return_sequences": config.num_return_sequences,
            "seed": config.seed, "chat_template": config.chat_template}


def generate(prompts: Sequence[str] | str, *, lm="smollm2-135m-instruct", rewards=None, k: int = 20,
             backend: str = "auto", device: str | None = None, engine: str = "steerkit", compile: bool = False,
             dtype: str = "float32", **kwargs) -> GenerationOutput:
    """Steered generation in one call.

    ``lm`` is a model reference (packaged name, directory, .gguf file, hub id) or a ``(model, tokenizer)``
    pair; ``rewards`` maps reward references (registered names or reward-model directories) or
    :class:`~steerkit.rewards.base.Reward` objects to β; ``backend`` runs them (``"auto"``, the default: an ONNX
    export directory on ``onnx``, anything else on ``torch``). Other keyword arguments follow
    ``transformers``' ``generate``: ``max_new_tokens``, ``do_sample``, ``temperature``,
    ``num_return_sequences``, ``eos_token_id``, ``stop_strings``, plus ``seed``, ``chat_template``,
    ``return_traces``, ``batch_size`` and ``progress``. ``device`` (cpu, cuda, …) moves the LM and the
    torch reward models there; without it everything stays where it is (loaded models: on the CPU).
    ``engine="llama.cpp"`` runs a packaged or .gguf LM in llama.cpp (the ``llama-cpp`` extra; docs/llama_cpp.md)
    with the same step, rewards and random stream. ``compile=True`` runs steerkit's engine on the static-shape step
    compiled once per shape (the first call of a shape compiles for up to a few minutes; docs/performance.md);
    ``dtype="int8"`` runs the LM with int8 weights, ``dtype="bfloat16"`` with bf16 weights and matmuls.
    """
    return assemble(lm, rewards, k=k, backend=backend, device=device, engine=engine, compile=compile,
                    dtype=dtype).generate(prompts, **kwargs)

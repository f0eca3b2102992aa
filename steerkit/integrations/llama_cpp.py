"""RAD inside llama.cpp: a ``logits_processor`` for llama-cpp-python's generation loop.

llama-cpp-python calls each processor with the ids so far (prompt + generated, ``numpy.intc`` [T]) and the next
token's logits (``numpy.float32`` [V]) and uses the array it returns. :class:`LlamaCppRAD` is a thin adapter over
:class:`steerkit.hf.RewardAugmentedLogitsProcessor` (the transformers processor): the same step
(:func:`steerkit.steering.reweight`, the engine's step maths), the same reward sessions, the same state keyed by
the prefix, so one instance serves any number of calls. The top-k logits get Σ β·ρ, every other token −inf, and
llama.cpp's own sampler then draws (``temperature=0`` is greedy; leave llama.cpp's ``top_k``/``top_p`` at values
that keep the k candidates, e.g. ``top_k=0, top_p=1``)::

    from llama_cpp import LogitsProcessorList
    from steerkit.integrations.llama_cpp import LlamaCppRAD, load_llama

    llm = load_llama("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=2048, verbose=False)  # or llama_cpp.Llama(...)
    rad = LlamaCppRAD.from_rewards(tokenizer, {"toxicity-token": -20}, k=20)   # tokenizer: the LM's (HF)
    out = llm("You are such a", max_tokens=20, temperature=0, top_k=0, top_p=1,
              logits_processor=LogitsProcessorList([rad]))

:func:`load_llama` is ``llama_cpp.Llama`` with llama.cpp's AMX weight repacking off where the build uses it: with
it, llama-cpp-python 0.3.36 built for a Xeon with AMX segfaulted in its first decode (docs/llama_cpp.md).

The tokenizer is the LM's Hugging Face tokenizer (``steerkit.load_tokenizer`` reads one from a ``.gguf`` file):
it decodes the prompt for the rewards, and its vocabulary must be the GGUF's (checked on the first call).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..errors import InvalidArgumentError
from ..hf import RewardAugmentedLogitsProcessor
from ..llama_cpp_lib import load_llama
from ..steering import SteeringTerm
from ..terms import build_terms

__all__ = ["LlamaCppRAD", "load_llama"]


class LlamaCppRAD:
    """RAD for llama-cpp-python's ``logits_processor`` (see the module docstring). ``last_step`` is the latest
    step's :class:`~steerkit.steering.StepResult` (top-k ids, logits and each term's rewards)."""

    def __init__(self, tokenizer, terms: Sequence[SteeringTerm], k: int = 20):
        self.processor = RewardAugmentedLogitsProcessor(tokenizer, terms, k)
        self.vocab_size = len(tokenizer)

    @classmethod
    def from_rewards(cls, tokenizer, rewards, *, k: int = 20, backend: str = "auto") -> "LlamaCppRAD":
        """From any form ``steerkit.generate(rewards=...)`` takes (``{"toxicity": -20}``, specs, terms)."""
        return cls(tokenizer, build_terms(rewards, backend=backend), k)

    @property
    def last_step(self):
        return self.processor.last_step

    def __call__(self, input_ids, scores):
        scores = np.asarray(scores)
        if scores.ndim != 1 or scores.shape[0] != self.vocab_size:
            raise InvalidArgumentError(
                f"llama.cpp gave {scores.shape[-1]} logits but the tokenizer has {self.vocab_size} tokens: pass the "
                "GGUF model's own tokenizer (steerkit.load_tokenizer('model.gguf')).")
        ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64).copy())[None, :]
        logits = torch.from_numpy(scores.astype(np.float32, copy=True))[None, :]
        out = self.processor(ids, logits)[0]
        return out.numpy().astype(scores.dtype, copy=False)

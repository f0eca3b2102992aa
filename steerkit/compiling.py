"""Compiling a static-shape forward with ``torch.compile``, once per shape and process: what the engine's LM step
(:mod:`steerkit.engine.static_lm`) and a reward model's candidate scoring
(:mod:`steerkit.rewards.sequence.static_cache`) both run through.

On a CPU inductor freezes the weights as constants and autotunes every matrix product between its C++ GEMM template
and ATen's (MKL) kernel; on CUDA the same graph is captured as CUDA graphs (``mode="reduce-overhead"``). Compiled
kernels and autotuning results are cached on disk (``$TORCHINDUCTOR_CACHE_DIR``, by default
``<steerkit cache>/inductor``), and a line on stderr says when a shape compiles and how long it took.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import torch
import torch._inductor.config

from .model_copies import converted_copy

#: inductor settings of the compiled step: weights folded in as constants, every matrix product autotuned
#: between inductor's C++ GEMM template and ATen's (MKL) kernel.
#: (The autotuner's table of timings per product is not printed: steerkit prints one line per shape.)
COMPILE_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def bucket(n: int, smallest: int = 1) -> int:
    """``n`` rounded up to ``smallest`` times a power of two."""
    b = max(1, int(smallest))
    while b < n:
        b *= 2
    return b


def inductor_cache_dir() -> str:
    """Where inductor caches compiled kernels: ``$TORCHINDUCTOR_CACHE_DIR`` when the user set it, else
    ``<steerkit cache>/inductor`` (torch writes its own default into the variable once it has read it, so that
    default counts as unset)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not current or current == default_cache_dir():
        from .files import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = current = str(cache_dir() / "inductor")
    return current


def _raise_recompile_limit(limit: int = 64) -> None:
    """One compiled graph per (slots, width) shape: allow more than dynamo's default of 8 per function."""
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), limit))


class CompiledStep:
    """A forward compiled for a static step (``fn``: ``model.forward`` unless ``forward`` is given), and the shapes
    this process has compiled it for. :meth:`__call__` runs it with its inductor options in force and announces
    each new shape on stderr. The LM's step (:class:`StaticLMBatch`) and the reward models' block scoring
    (:class:`~steerkit.rewards.sequence.static_cache.StaticScoringCache`) both run through it."""

    def __init__(self, model, forward=None, *, what: str = "the decode step"):
        with warnings.catch_warnings():  # torch 2.13's inductor imports its own deprecated torch.jit.script_method
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                    category=DeprecationWarning)
            import torch._inductor.compile_fx  # noqa: F401
        inductor_cache_dir()
        _raise_recompile_limit()
        forward = forward or model.forward
        self.what = what
        self.cuda = next(model.parameters()).device.type == "cuda"
        if self.cuda:  # CUDA graphs of the same static step
            self.fn = torch.compile(forward, dynamic=False, mode="reduce-overhead")
        else:  # the options are read when a shape compiles, which is inside a call: __call__
            self.fn = torch.compile(forward, dynamic=False)
        self.options = {} if self.cuda else COMPILE_OPTIONS
        self.shapes: set[tuple] = set()

    def __call__(self, shape: tuple, kwargs: dict):
        """Call the compiled forward with its inductor options in force (inductor reads its global configuration
        when a shape compiles; passed as ``torch.compile(options=...)`` they did not freeze the weights). A shape
        this process has not run yet compiles here, between two lines on stderr."""
        if shape in self.shapes:
            if not self.options:  # CUDA: nothing to patch (entering an empty patch costs 8 µs a step)
                return self.fn(**kwargs)
            with torch._inductor.config.patch(self.options):
                return self.fn(**kwargs)
        print(f"steerkit: compiling {self.what} for {' x '.join(map(str, shape))} (once per shape; cached in "
              f"{inductor_cache_dir()})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with warnings.catch_warnings():
            # inductor's autotuner reads a tensor's TypedStorage, which torch itself deprecates
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
            with torch._inductor.config.patch(self.options):
                out = self.fn(**kwargs)
        self.shapes.add(shape)
        print(f"steerkit: compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        return out


def compiled_step(model) -> CompiledStep:
    """The :class:`CompiledStep` of ``model``, made once per model object and process."""
    return converted_copy(model, "compiled static step", CompiledStep)

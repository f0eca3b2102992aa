"""Inductor's FX graph cache for a CPU's compiled step, keyed by the weights frozen into it.

On a CPU steerkit compiles with ``freezing`` (:data:`steerkit.compiling.COMPILE_OPTIONS`): the weights become
constants, and oneDNN's prepacking pass turns a linear layer's weight into an ``mkldnn`` tensor. Inductor's FX graph
cache then refuses the graph ("mkldnn tensors unpickleable"), so every process lowered every shape again and only the
C++ kernels came from disk. Two things stand in the way, and :func:`install_frozen_graph_cache` deals with both:

* **The refusal.** A frozen ``mkldnn`` constant need not be pickled: on a cache hit inductor takes every frozen
  parameter from the graph module it is compiling (``CompiledFxGraph.frozen_param_names``), which this process froze
  and packed itself. So for a compilation that carries steerkit's weights key (below), a *frozen* ``mkldnn`` tensor
  is keyed by its shape and dtype, as inductor keys every other frozen parameter. Any other ``mkldnn`` tensor, and
  every compilation without the key, is refused as before.
* **Stale weights.** Inductor keys frozen parameters by their metadata only, yet stores by value the constants
  its C++ GEMM template derives from them while lowering (the weight repacked into the template's blocks). So two
  models of one architecture with different weights (two LoRA rewards of one backbone, a fine-tuned LM) would share
  a cache entry, and the second would run with the first one's weights. Checked before this module keyed them: a
  tiny LM of another seed, compiled from the first one's entry, gave logits 0.71 away from its own eager ones. The
  key of each compilation therefore carries a digest of every tensor that freezing turns into a constant, as they
  were before freezing packed them (the packed bytes include uninitialised padding, so they differ between
  processes): :class:`WeightsKey`, inductor's ``post_grad_custom_post_pass`` (a pass that changes nothing; its
  ``uuid`` is part of every FX graph cache key), with the CPU's instruction sets, which choose the packed layout.
  A compilation whose weights cannot be digested (a tensor subclass, another device) is not cached at all: the
  pass's ``uuid`` is then None, which makes inductor bypass its cache.

The digest is BLAKE2b over each tensor's bytes, remembered per tensor object and version (SmolLM2's 540 MB in about
a second, once per model and process). A torch whose inductor lacks one of the functions this wraps compiles as
before, without the graph cache (:func:`install_frozen_graph_cache` returns None). Measured on SmolLM2's float32 step
(docs/performance.md, "A compiled step from inductor's graph cache").
"""

from __future__ import annotations

import functools
import hashlib
import operator
import threading
import warnings
import weakref

import torch

_state = threading.local()  # .weights: the digest of the compilation freezing now (None: not keyed, refused)
_digests: dict[int, tuple] = {}  # id(tensor) -> (weak reference, stamp, digest): tensors compare elementwise


@functools.cache
def import_inductor() -> None:
    """Import inductor once per process (each :class:`~steerkit.compiling.CompiledStep` asks, and the caches here)."""
    with warnings.catch_warnings():  # torch 2.13's inductor imports its own deprecated torch.jit.script_method
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                category=DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401


def tensor_digest(t: torch.Tensor) -> str:
    """BLAKE2b of a (CPU, dense) tensor's dtype, shape and bytes, remembered while the tensor lives unchanged."""
    stamp = (t._version, t.data_ptr(), t.dtype, tuple(t.shape))
    known = _digests.get(id(t))
    if known is not None and known[0]() is t and known[1] == stamp:
        return known[2]
    h = hashlib.blake2b(f"{t.dtype} {tuple(t.shape)}".encode(), digest_size=16)
    if t.numel():
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    digest = h.hexdigest()
    key = id(t)
    try:
        _digests[key] = (weakref.ref(t, lambda _, key=key: _digests.pop(key, None)), stamp, digest)
    except TypeError:  # not weakly referable: computed again next time
        pass
    return digest


@functools.cache
def _cpu_isa() -> str:
    """What chooses the compiled code and the packed layouts on this CPU: inductor's vector ISA and ATen's."""
    from torch._inductor import cpu_vec_isa

    return f"{cpu_vec_isa.pick_vec_isa()} {torch.backends.cpu.get_cpu_capability()}"


def _frozen_sources(aot_gm, params) -> str | None:
    """The digest of what freezing may fold into constants: the graph's parameters and buffers (``params``, real
    tensors) and the tensors it holds as attributes. None (the graph is not cached) if one of them is not a plain CPU
    tensor or cannot be found."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    h = hashlib.blake2b(digest_size=16)
    with unset_fake_temporarily():
        try:
            attrs = [operator.attrgetter(n.target)(aot_gm) for n in aot_gm.graph.find_nodes(op="get_attr")]
        except AttributeError:
            return None
        for t in [*params, *attrs]:
            if t is None or not isinstance(t, torch.Tensor):
                h.update(b"-")
                continue
            if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu" or t.is_mkldnn:
                return None
            h.update(tensor_digest(t).encode())
    return f"{_cpu_isa()} {h.hexdigest()}"


def _custom_graph_pass():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class WeightsKey(CustomGraphPass):
        """A post-grad pass that changes nothing: its ``uuid`` (part of every FX graph cache key) is the digest of
        the weights the compilation froze, and the CPU's instruction sets."""

        def __call__(self, graph) -> None:
            return None

        def uuid(self) -> str | None:
            # None: inductor bypasses its cache for the graph ("Unsupported post grad custom pass"), as for a
            # compilation whose weights could not be digested
            weights = getattr(_state, "weights", None)
            return f"steerkit-weights {weights}" if weights else None

    return WeightsKey()


@functools.cache
def install_frozen_graph_cache():
    """Install the keyed graph cache once per process; returns the :class:`WeightsKey` pass to set as inductor's
    ``post_grad_custom_post_pass`` while steerkit compiles, or None where this torch's inductor lacks what it wraps
    (then frozen CPU graphs are refused by the cache, as before)."""
    import_inductor()
    try:
        from torch._inductor import codecache, freezing
        from torch._inductor.freezing_utils import is_frozen_param

        validator = codecache.CacheabilityValidator
        check_tensor, metadata = validator.check_tensor, codecache.extract_tensor_metadata_for_cache_key
        freeze = freezing.freeze
    except (ImportError, AttributeError):
        return None
    weights_key = _custom_graph_pass()

    def keyed() -> bool:
        return (torch._inductor.config.post_grad_custom_post_pass is weights_key
                and getattr(_state, "weights", None) is not None)

    def keyed_check_tensor(t):
        if t.is_mkldnn and is_frozen_param(t) and keyed():
            return None  # taken from the live graph module on a hit, never pickled
        return check_tensor(t)

    def keyed_metadata(t):
        if t.is_mkldnn and keyed():  # an opaque tensor has no strides: keyed as a meta tensor of its shape and dtype
            return metadata(torch.empty(tuple(t.shape), dtype=t.dtype, device="meta"))
        return metadata(t)

    @functools.wraps(freeze)
    def keyed_freeze(dynamo_gm, aot_autograd_gm, example_inputs):
        _state.weights = None
        if torch._inductor.config.post_grad_custom_post_pass is weights_key:
            context = torch._guards.TracingContext.try_get()
            params = getattr(context, "params_flat_unwrap_subclasses", None)
            if params is not None:
                _state.weights = _frozen_sources(aot_autograd_gm, params)
        return freeze(dynamo_gm, aot_autograd_gm, example_inputs)

    validator.check_tensor = staticmethod(keyed_check_tensor)
    codecache.extract_tensor_metadata_for_cache_key = keyed_metadata
    freezing.freeze = keyed_freeze
    return weights_key

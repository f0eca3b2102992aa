"""Compiling a static-shape forward with ``torch.compile``, once per shape and process: what the engine's LM step
(:mod:`steerkit.engine.static_lm`) and a reward model's candidate scoring
(:mod:`steerkit.rewards.sequence.static_cache`) both run through.

On a CPU inductor freezes the weights as constants and autotunes every matrix product between its C++ GEMM template
and ATen's (MKL) kernel. On CUDA inductor's kernels are captured in one CUDA graph per shape (:class:`_Graph`), which
a step replays after copying its inputs in: no guard or graph-tree check runs per step (:data:`CUDA_GRAPHS`). Compiled
kernels, autotuning results and the lowered graphs (a CPU's keyed by their frozen weights: :mod:`steerkit.graph_cache`)
are cached on disk (``$TORCHINDUCTOR_CACHE_DIR``, by default ``<steerkit cache>/inductor``), and a line on stderr says
when a shape compiles and how long it took.

A server's decode loop must not wait on a compilation (a shape takes up to minutes on a CPU): inside
:func:`new_shapes_run_eagerly` (what the server's loop thread runs in) a step of a shape that has not compiled runs
eagerly instead. Everywhere else (``generate``, ``eval``, a server's warm-up) a new shape compiles before it runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import warnings
import weakref

import torch
import torch._inductor.config

from .graph_cache import import_inductor, install_frozen_graph_cache
from .model_copies import converted_copy

#: inductor settings of the compiled step: weights folded in as constants, every matrix product autotuned
#: between inductor's C++ GEMM template and ATen's (MKL) kernel.
#: (The autotuner's table of timings per product is not printed: steerkit prints one line per shape.)
#: Frozen weights stay packed for oneDNN (inductor's default ``cpp.weight_prepack``), although packed constants keep
#: inductor's FX graph cache from storing the step: unpacked, the AVX2 CPU's step was 1.47x slower
#: (benchmarks/probe_weight_prepack.py; docs/performance.md).
COMPILE_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


#: How a compiled step runs on CUDA. ``"manual"``: inductor's kernels (``torch.compile`` without its own CUDA
#: graphs), captured here in one ``torch.cuda.CUDAGraph`` per shape and its inputs' objects; a step copies its tensor
#: inputs into the graph's and replays it, so that no dynamo guard or CUDA-graph-tree check runs per step (what vLLM
#: does). ``"trees"``: ``torch.compile(mode="reduce-overhead")``, whose graph trees check every call's inputs (what
#: ``benchmarks/bench_gpu.py --cuda-graphs`` compares it with).
CUDA_GRAPHS = "manual"


#: Decode steps of one job after which compiling steerkit's step has paid for its compile time, per device type,
#: measured at ``steerkit eval``'s batch (25 rows, ``toxicity`` at k = 20; docs/performance.md, "When compiling
#: pays"). One H200 (bench_compile_payback.py from a cold inductor cache, random weights of SmolLM2's shape): 56.1 s
#: more for the first unit, and a step 46.5 ms faster (58.0 -> 11.5 ms): 1,208 steps, rounded to 1,200. This CPU
#: (bench_compile_payback.py): the compiled step was slower at 25 rows (564 against 499 ms; on a CPU the sequence
#: reward stays eager), so no CPU entry: a CPU never compiles by itself. A device type not listed does not either.
COMPILE_PAYS_AFTER_STEPS = {"cuda": 1200}


def compile_pays(device: str | None, steps: int) -> bool:
    """Whether compiling pays for a job of ``steps`` decode steps on ``device`` (``"cuda:1"``; None: the CPU), by
    :data:`COMPILE_PAYS_AFTER_STEPS`: what ``steerkit eval`` does where its config leaves ``compile`` unset."""
    after = COMPILE_PAYS_AFTER_STEPS.get(str(device or "cpu").split(":")[0])
    return after is not None and steps >= after


def bucket(n: int, smallest: int = 1) -> int:
    """``n`` rounded up to ``smallest`` times a power of two."""
    b = max(1, int(smallest))
    while b < n:
        b *= 2
    return b


def buckets_up_to(n: int, smallest: int = 1) -> list[int]:
    """The buckets ``smallest`` times 1, 2, 4, ... up to the one that holds ``n`` (:func:`bucket`): what a warm-up
    compiles (rows; a width's or a reward context's columns)."""
    sizes = [max(1, int(smallest))]
    while sizes[-1] < n:
        sizes.append(sizes[-1] * 2)
    return sizes


def inductor_cache_dir() -> str:
    """Where inductor caches compiled kernels: ``$TORCHINDUCTOR_CACHE_DIR`` when the user set it, else
    ``<steerkit cache>/inductor`` (torch writes its own default into the variable once it has read it, so that
    default counts as unset)."""
    current = chosen_inductor_cache_dir()
    if current is None:
        from .files import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = current = str(cache_dir() / "inductor")
    return current


def chosen_inductor_cache_dir() -> str | None:
    """``$TORCHINDUCTOR_CACHE_DIR`` where someone chose it; None where it is unset or holds torch's own default."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return current if current and current != default_cache_dir() else None


def _raise_recompile_limit(limit: int = 64) -> None:
    """One compiled graph per (slots, width) shape: allow more than dynamo's default of 8 per function."""
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), limit))


#: Per thread: whether a shape not compiled yet runs eagerly instead of compiling (:func:`new_shapes_run_eagerly`).
_no_new_shapes = threading.local()


@contextlib.contextmanager
def new_shapes_run_eagerly():
    """Inside this, in the calling thread only, a step of a shape this process has not compiled runs eagerly (the same
    forward on the same inputs) instead of compiling, with one line on stderr per shape. The server's decode loop runs
    in this: its start-up compiles the shapes it expects (every row bucket at each width and reward context a row of
    up to ``--compile-tokens`` tokens uses, at the default ``k``), and a row that outgrows them (a longer row, another
    ``k``) makes the steps of its batch run eagerly while it runs, rather than making every request wait minutes on a
    compilation. Compiling a shape beside the loop, in another thread, is no way out: tracing the model in one thread
    while another runs it eagerly shares the compile-time state of transformers' ``kernels`` dependency between them
    (a guard failed), and the tracing thread held the interpreter so much that the eager steps of a tiny model took 20
    times as long (docs/performance.md)."""
    before = getattr(_no_new_shapes, "active", False)
    _no_new_shapes.active = True
    try:
        yield
    finally:
        _no_new_shapes.active = before


class CompiledStep:
    """A forward compiled for a static step (``fn``: ``model.forward`` unless ``forward`` is given), and the shapes
    this process has compiled it for. :meth:`__call__` runs it with its inductor options in force and announces
    each new shape on stderr. The LM's step (:class:`StaticLMBatch`) and the reward models' block scoring
    (:class:`~steerkit.rewards.sequence.static_cache.StaticScoringCache`) both run through it."""

    def __init__(self, model, forward=None, *, what: str = "the decode step"):
        import_inductor()
        inductor_cache_dir()
        _raise_recompile_limit()
        install_gqa_attention()
        install_template_cache()
        self.forward = forward or model.forward
        self.what = what
        self.cuda = next(model.parameters()).device.type == "cuda"
        # on a CPU the options are read when a shape compiles, which is inside a call: __call__; the weights key lets
        # inductor's FX graph cache keep the frozen graph (steerkit.graph_cache)
        self.options = {}
        if not self.cuda:
            weights_key = install_frozen_graph_cache()
            self.options = ({**COMPILE_OPTIONS, "post_grad_custom_post_pass": weights_key} if weights_key
                            else COMPILE_OPTIONS)
        self.shapes: set[tuple] = set()
        self.eager_shapes: dict[tuple, int] = {}  # steps run eagerly per shape not compiled (new_shapes_run_eagerly)
        self._compiled: dict[str, object] = {}
        self.graphs: dict[tuple, _Graph | None] = {}  # CUDA, "manual": per shape its graph (None: capture failed)

    @property
    def fn(self):
        """The compiled forward: on CUDA per :data:`CUDA_GRAPHS` (read at each call, so a benchmark can compare)."""
        mode = CUDA_GRAPHS if self.cuda else "cpu"
        fn = self._compiled.get(mode)
        if fn is None:
            if mode == "trees":
                fn = torch.compile(self.forward, dynamic=False, mode="reduce-overhead")
            else:
                fn = torch.compile(self.forward, dynamic=False)
            self._compiled[mode] = fn
        return fn

    def __call__(self, shape: tuple, kwargs: dict):
        """Call the compiled forward with its inductor options in force (inductor reads its global configuration
        when a shape compiles; passed as ``torch.compile(options=...)`` they did not freeze the weights). A shape
        this process has not run yet compiles here, between two lines on stderr. On CUDA (``"manual"``) a shape's
        later calls replay its CUDA graph."""
        if self.cuda and CUDA_GRAPHS == "manual" and shape in self.shapes:
            graph = self.graphs.get(shape)
            if graph is not None and graph.fits(kwargs):
                return graph.replay(kwargs)
            if shape not in self.graphs or graph is not None:  # not captured yet, or for another KV cache
                return self._capture(shape, kwargs)
            # its capture failed: it runs uncaptured (below)
        if shape in self.shapes:
            if self.cuda and CUDA_GRAPHS == "trees":  # its graph trees warn while they set up, on a later call
                with _compiler_warnings_off():
                    return _cloned(self.fn(**kwargs))  # the trees' output memory, too, is reused by the next call
            if not self.options:  # CUDA: nothing to patch (entering an empty patch costs 8 µs a step)
                return self.fn(**kwargs)
            with torch._inductor.config.patch(self.options):
                return self.fn(**kwargs)
        if getattr(_no_new_shapes, "active", False):
            return self._eagerly(shape, kwargs)
        # once per shape and process: a process that compiled the same weights' shape before loads the lowered graph
        # from inductor's disk cache (a CPU's too: steerkit.graph_cache), and still traces and freezes it
        print(f"steerkit: compiling {self.what} for {' x '.join(map(str, shape))} (once per shape and process; "
              f"inductor's disk cache: {inductor_cache_dir()})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with _compiler_warnings_off(), torch._inductor.config.patch(self.options):
            out = self.fn(**kwargs)
        self.shapes.add(shape)
        print(f"steerkit: compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        if self.cuda and CUDA_GRAPHS == "manual":
            self.graphs.pop(shape, None)  # the next call captures
        return out

    def _capture(self, shape: tuple, kwargs: dict):
        """Run this (compiled) shape once on ``kwargs`` copied into the graph's own inputs, then capture it: the run
        is this call's result, and it leaves every lazily made resource (cuBLAS workspaces, autotuning) made
        before the capture. A shape whose capture fails runs uncaptured from then on, with a line on stderr."""
        graph = _Graph(kwargs)
        inputs = graph.arguments(kwargs)
        with _compiler_warnings_off():
            out = self.fn(**inputs)  # an uncaptured run: its output is this call's own
        try:
            with _compiler_warnings_off():
                graph.capture(self.fn, inputs)
        except Exception as exc:  # noqa: BLE001 - the compiled forward still runs, without a graph
            print(f"steerkit: {self.what} for {' x '.join(map(str, shape))} runs without a CUDA graph "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
            graph = None
        self.graphs[shape] = graph
        return out

    def _eagerly(self, shape: tuple, kwargs: dict):
        """A step of a shape not compiled, inside :func:`new_shapes_run_eagerly`: the forward itself."""
        if shape not in self.eager_shapes:
            self.eager_shapes[shape] = 0
            print(f"steerkit: {self.what} for {' x '.join(map(str, shape))} was not compiled at start-up: its steps "
                  "run eagerly in this server, no request waits on a compilation", file=sys.stderr, flush=True)
        self.eager_shapes[shape] += 1
        return self.forward(**kwargs)


def install_template_cache() -> None:
    """Keep inductor's C++ kernel templates parsed: inductor parses a template's jinja source again for every kernel
    it renders (``KernelTemplate._template_from_string``: a new ``jinja2`` template per call, while the sources are a
    few fixed strings), and on a CPU it renders each matrix product's GEMM template once per autotuning candidate and
    once for the kernel it keeps. This wraps that function in a cache keyed by the source: the same template objects,
    which render the same code. SmolLM2's float32 decode step compiled in 34.4 s where it took 53.5 s, its kernels in
    the disk cache (67.5 against 84.6 s from an empty cache; ``benchmarks/bench_compile_time.py``,
    docs/performance.md). Installed once per process, when the first :class:`CompiledStep` is made; a torch without
    the function compiles as before."""
    import_inductor()
    from torch._inductor.codegen import common

    template_class = getattr(common, "KernelTemplate", None)
    parse = getattr(template_class, "_template_from_string", None)
    if parse is None or getattr(parse, "steerkit_cached", False):
        return
    cached = functools.lru_cache(maxsize=256)(parse)
    cached.steerkit_cached = True
    template_class._template_from_string = staticmethod(cached)


def install_gqa_attention() -> None:
    """Make transformers' ``"sdpa"`` attention, inside a compiled graph, read a grouped-query model's KV heads in place
    (``scaled_dot_product_attention(..., enable_gqa=True)``) where it would copy them once per query head
    (``repeat_kv``): what it does itself where no mask is given, and what a static step, which always passes one, never
    got. Outside ``torch.compile`` the function is transformers' own, called as before. Installed once per process, when
    the first :class:`CompiledStep` is made; it is a process-wide registration (``AttentionInterface.register``), so it
    also applies to other compiled transformers models in this process.

    The copies were a quarter of SmolLM2's compiled 16-row step on an Intel AMX CPU: the KV of 128 columns, expanded
    from 3 to 9 heads in each of 30 layers (docs/performance.md, "A compiled step's attention")."""
    try:
        from transformers import AttentionInterface
    except ImportError:  # a transformers without the interface: its attention as it is
        return
    current = getattr(AttentionInterface, "_global_mapping", {}).get("sdpa")
    if current is None or getattr(current, "steerkit_gqa", False):
        return
    # two threads racing here both wrap transformers' own function: never a wrapper of a wrapper
    ours = functools.partial(_gqa_sdpa, transformers_sdpa=current)
    ours.steerkit_gqa = True
    AttentionInterface.register("sdpa", ours)


def _gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              *, transformers_sdpa, **kwargs):
    """:func:`install_gqa_attention`'s attention: transformers' ``sdpa_attention_forward`` (``transformers_sdpa``), but
    under ``torch.compile``, for a masked grouped-query layer (more query heads than KV heads) without a position bias
    or a soft cap, SDPA's own grouped-query form: [batch, query, heads, head_dim], as transformers returns it."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (not torch.compiler.is_compiling() or groups <= 1 or attention_mask is None or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)):
        return transformers_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def _compiler_warnings_off():
    """What inductor warns about while it compiles a step that is not the caller's to act on: its autotuner reads a
    tensor's TypedStorage, which torch itself deprecates; on a GPU with TF32 it suggests TF32 products, which the
    step leaves off so that its float32 products are the eager engine's; ``mode="reduce-overhead"`` captures an
    empty graph while its graph trees set up (torch 2.11)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
        yield


def _cloned(out):
    """``out`` (a tensor, or a tuple, list, dict or transformers ``ModelOutput`` of them) with its tensors copied."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, dict):  # a ModelOutput is a dict too, whose fields are its keys
        return type(out)(**{k: _cloned(v) for k, v in out.items()})
    if isinstance(out, (tuple, list)):
        return type(out)(_cloned(v) for v in out)
    return out


def _tensors_of(out):
    """``out`` without what is not a tensor: a transformers ``ModelOutput`` without the KV cache it returns (a graph
    that kept it would keep a cache the caller has dropped alive, for as long as the graph of its shape lives)."""
    if isinstance(out, dict):  # a ModelOutput is a dict too
        return type(out)(**{k: v for k, v in out.items() if isinstance(v, torch.Tensor)})
    return out


class _Graph:
    """One shape's CUDA graph: its own copies of the tensor inputs (:attr:`buffers`, which a replay reads), the other
    inputs as captured (a KV cache object, held weakly: its tensors' addresses are in the graph, and a cache the
    caller dropped must not be kept alive by it), and the output, which each replay overwrites and hands out copied."""

    def __init__(self, kwargs: dict):
        self.buffers = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        self.objects = {}
        for k, v in kwargs.items():
            if not isinstance(v, torch.Tensor):
                try:
                    self.objects[k] = ("ref", weakref.ref(v))
                except TypeError:  # an int, a bool, None: compared by value
                    self.objects[k] = ("value", v)
        self.graph = self.output = None
        self.replays = 0

    def arguments(self, kwargs: dict) -> dict:
        """``kwargs`` with the graph's own tensors in place of the caller's."""
        return {k: self.buffers.get(k, v) for k, v in kwargs.items()}

    def capture(self, fn, inputs: dict) -> None:
        graph = torch.cuda.CUDAGraph()
        # "thread_local": a server's other threads may use CUDA while the engine's thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = fn(**inputs)
        # the graph reads the buffers; the other inputs are held weakly, and so is a KV cache the output returns
        self.graph, self.output = graph, _tensors_of(output)

    def fits(self, kwargs: dict) -> bool:
        """Whether a replay computes ``fn(**kwargs)``: the same names, tensor shapes and dtypes, and the same other
        objects (the same KV cache, whose tensors the graph reads and writes in place)."""
        if len(kwargs) != len(self.buffers) + len(self.objects):
            return False
        for k, (how, v) in self.objects.items():
            if k not in kwargs:
                return False
            other = kwargs[k]
            if (v() is not other) if how == "ref" else (type(v) is not type(other) or v != other):
                return False
        for k, buffer in self.buffers.items():
            v = kwargs.get(k)
            if not isinstance(v, torch.Tensor) or v.shape != buffer.shape or v.dtype != buffer.dtype:
                return False
        return True

    def replay(self, kwargs: dict):
        """The output of ``fn(**kwargs)``, copied out of the graph's memory (the next replay writes over it)."""
        for k, buffer in self.buffers.items():
            buffer.copy_(kwargs[k])
        self.graph.replay()
        self.replays += 1
        return _cloned(self.output)


def compiled_step(model) -> CompiledStep:
    """The :class:`CompiledStep` of ``model``, made once per model object and process."""
    return converted_copy(model, "compiled static step", CompiledStep)

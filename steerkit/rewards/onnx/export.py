"""Export a :class:`RewardModel` to ONNX, and verify an export belongs to what it claims.

An export directory holds::

    model.onnx              backbone + head, past KV in, present KV out (one graph for prefill and steps)
    model.onnx.data         the weights, only when the model is over ~2 GB (ONNX's protobuf limit)
    tokenizer/              the reward model's tokenizer (so loading needs neither torch weights nor the backbone)
    steerkit_onnx.json      the manifest: source reward-model hash, reward config, tokenizer reference and
                            vocabulary fingerprint, opset, input/output names, layers, KV heads, head dim,
                            and the SHA-256 of every graph/weight file

Graph signature (``L`` layers, ``H`` KV heads, ``d`` head dim; dynamic axes in quotes)::

    input_ids        int64   ["batch", "new"]
    position_ids     int64   ["batch", "new"]
    attention_mask   float32 ["batch", 1, "new", "total"]   additive: 0 allowed, float32 min blocked
    past_key_i       float32 ["batch", H, "past", d]        i = 0..L-1 (and past_value_i); "past" may be 0
    ->
    rewards          float32 ["batch", "new"]                f(head(h)) at every new position
    present_key_i    float32 ["batch", H, "total", d]        past ++ new (and present_value_i)

``total = past + new``; prefill is the same graph with a zero-length past. ``f``, the reward config's output
function (``sigmoid``, or ``clamp`` to [0, 1]), is computed inside the graph and named in the manifest.

The *reward hash* identifies the source: for a reward-model directory, the SHA-256 over the sorted
``(file name, file SHA-256)`` pairs of its ``reward_config.json`` and ``*.safetensors`` files (the config
carries the backbone's fingerprint, so a changed backbone changes the hash too; ``metrics.json`` is
informational and excluded). For a model that only exists in memory, the SHA-256 of its config and
every tensor of its state dict.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ...errors import ExportError
from ...files import atomic_write_text, cache_dir, sha256_file
from ..model import CONFIG_NAME, RewardModel
from .manifest import (DATA_FILE, EXPORT_FORMAT, EXPORT_FORMAT_VERSION, MANIFEST_NAME, MODEL_FILE, TOKENIZER_DIR,
                       input_names, is_export_dir, output_names, tokenizer_fingerprint)

DEFAULT_OPSET = 17
#: graphs whose weights exceed this are saved with external data (protobuf cannot serialise >= 2 GiB)
EXTERNAL_DATA_THRESHOLD = 2 * 1024**3 - 64 * 1024**2
#: an export must reproduce the torch model on its probe inputs to this tolerance
EXPORT_TOLERANCE = 1e-4
INSTALL_HINT = "pip install 'steerkit-rad[onnx]'  (or 'steerkit-rad[onnx-gpu]' for CUDA)"


def reward_dir_hash(directory: str | os.PathLike) -> str:
    """The reward hash of a reward-model directory (see the module docstring)."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir()
                   if p.is_file() and (p.name == CONFIG_NAME or p.suffix == ".safetensors"))
    if not any(p.name == CONFIG_NAME for p in files):
        raise ExportError(f"{directory} has no {CONFIG_NAME}; pass a steerkit reward-model directory.")
    digest = hashlib.sha256(b"steerkit-reward-dir-v1\n")
    for p in files:
        digest.update(f"{p.name}\0{sha256_file(p)}\n".encode())
    return digest.hexdigest()


def model_content_hash(model: RewardModel) -> str:
    """The reward hash of an in-memory reward model: its config and every tensor, byte for byte."""
    digest = hashlib.sha256(b"steerkit-reward-state-v1\n")
    digest.update(model.config.model_dump_json().encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"\n{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def kv_shape(model: RewardModel) -> tuple[int, int]:
    """(KV heads, head dim) of the backbone's attention layers."""
    cfg = model.backbone.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return int(heads), int(head_dim)


# -- export ------------------------------------------------------------------------------------------
class _ExportWrapper(torch.nn.Module):
    """Flat-tensor signature around RewardModel.forward with a transformers DynamicCache."""

    def __init__(self, model: RewardModel):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_layers

    def _cache(self, past):
        from transformers import DynamicCache

        # Plain (full-attention) layers for every model: a sliding-window layer would crop inside the graph.
        return DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)])

    def forward(self, input_ids, position_ids, attention_mask, *past):
        cache = self._cache(past)
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return (out.rewards, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


def _probe_inputs(model: RewardModel, batch: int, new: int, past: int, seed: int = 0):
    """Random but valid inputs: a prefix with a hole, then causal new tokens."""
    from ..attention import additive, append_mask_4d

    g = torch.Generator().manual_seed(seed)
    heads, head_dim = kv_shape(model)
    L = model.config.num_layers
    ids = torch.randint(0, model.config.vocab_size, (batch, new), generator=g)
    prefix = torch.ones(batch, past, dtype=torch.bool)
    if past > 1:
        prefix[0, 0] = False  # a hole / left padding in row 0
    positions = prefix.long().sum(-1, keepdim=True) + torch.arange(new)[None]
    mask = additive(append_mask_4d(prefix, torch.ones(batch, new, dtype=torch.bool)))
    kv = [torch.randn(batch, heads, past, head_dim, generator=g) * 0.5 for _ in range(2 * L)]
    return (ids, positions, mask, *kv)


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise ExportError(f"ONNX export needs the {module!r} package: {INSTALL_HINT}") from None


def _make_tmp_dir(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the export is an ordinary directory
    return tmp


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def export_onnx(model: RewardModel, out_dir: str | os.PathLike, *, source_hash: str | None = None,
                source: dict | None = None, opset: int = DEFAULT_OPSET,
                external_data_threshold: int = EXTERNAL_DATA_THRESHOLD, overwrite: bool = False,
                check: bool = True) -> Path:
    """Export ``model`` to ``out_dir`` (written to a temporary sibling, then renamed into place).

    ``source_hash`` identifies the source (default: :func:`model_content_hash`); ``source`` is free-form
    provenance stored in the manifest. With ``check`` the export is run once in onnxruntime and compared
    with torch (max abs diff ≤ 1e-4) before it is published. Returns the export directory.
    """
    onnx = _require("onnx")
    out = _check_out_dir(out_dir, overwrite)
    if model.tokenizer is None:
        raise ExportError("The reward model has no tokenizer; load it with RewardModel.from_pretrained.")
    started = time.perf_counter()
    source_hash = source_hash or model_content_hash(model)
    names_in, names_out = input_names(model.config.num_layers), output_names(model.config.num_layers)
    wrapper = _ExportWrapper(model).eval()
    tmp = _make_tmp_dir(out)
    try:
        external = _write_graph(onnx, wrapper, model, tmp, names_in, names_out, _dynamic_axes(names_in, names_out, 1),
                                opset, external_data_threshold)
        model.tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
        files = [MODEL_FILE] + ([DATA_FILE] if external else [])
        manifest = _manifest(onnx, model, tmp, files, source_hash, source, opset, names_in, names_out, external)
        if check:
            _check_against_torch(tmp, wrapper, names_in, model)
        _write_manifest_and_publish(tmp, out, manifest, started)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_out_dir(out_dir, overwrite: bool) -> Path:
    """``out_dir`` as a Path, refused when it is a file, or a non-empty directory without ``overwrite``."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; pass --force (overwrite=True) or choose another --out.")
    return out


def _dynamic_axes(names_in: list[str], names_out: list[str], per_position: int) -> dict:
    """The graph's dynamic axes; the first ``per_position`` outputs are ["batch", "new"], then present KV."""
    dynamic = {"input_ids": {0: "batch", 1: "new"}, "position_ids": {0: "batch", 1: "new"},
               "attention_mask": {0: "batch", 2: "new", 3: "total"},
               **{n: {0: "batch", 1: "new"} for n in names_out[:per_position]}}
    dynamic.update({n: {0: "batch", 2: "past"} for n in names_in[3:]})
    dynamic.update({n: {0: "batch", 2: "total"} for n in names_out[per_position:]})
    return dynamic


def _write_graph(onnx, wrapper: torch.nn.Module, model, tmp: Path, names_in: list[str], names_out: list[str],
                 dynamic: dict, opset: int, external_data_threshold: int) -> bool:
    """Trace ``wrapper`` to ``tmp``/model.onnx (+ model.onnx.data over the threshold), checked; True if external."""
    raw = tmp / "raw"
    raw.mkdir()
    # Trace with new=3 > 1 so that no single-query fast path of the attention code is baked in.
    args = _probe_inputs(model, batch=2, new=3, past=4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(wrapper, args, str(raw / MODEL_FILE), input_names=names_in,
                              output_names=names_out, dynamic_axes=dynamic, opset_version=opset,
                              do_constant_folding=True, **_legacy_exporter())
        except Exception as exc:  # the exporter raises many types; wrap them with context
            raise ExportError(f"torch.onnx.export failed for {model.config.name!r} (opset {opset}): "
                              f"{type(exc).__name__}: {exc}") from exc
    proto = onnx.load(str(raw / MODEL_FILE), load_external_data=True)
    weight_bytes = sum(len(t.raw_data) for t in proto.graph.initializer)
    external = weight_bytes > external_data_threshold
    if external:
        onnx.save_model(proto, str(tmp / MODEL_FILE), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=DATA_FILE, size_threshold=1024)
    else:
        onnx.save_model(proto, str(tmp / MODEL_FILE))
    del proto
    shutil.rmtree(raw)
    onnx.checker.check_model(str(tmp / MODEL_FILE))
    return external


def _manifest(onnx, model, tmp: Path, files: list[str], source_hash: str, source: dict | None, opset: int,
              names_in: list[str], names_out: list[str], external: bool, **extra) -> dict:
    """The export's manifest (``seconds`` set at publishing); ``extra``: ``kind`` and/or ``embeddings``."""
    heads, head_dim = kv_shape(model)
    return {
        "format": EXPORT_FORMAT, "format_version": EXPORT_FORMAT_VERSION,
        **{k: v for k, v in extra.items() if k == "kind"},
        "source": {"reward_hash": source_hash, **(source or {})},
        "reward_config": json.loads(model.config.model_dump_json()),
        "tokenizer": {"reference": model.config.tokenizer or model.config.backbone,
                      "fingerprint": tokenizer_fingerprint(model.tokenizer),
                      "vocab_size": len(model.tokenizer), "directory": TOKENIZER_DIR},
        "opset": opset, "dtype": "float32", "inputs": names_in, "outputs": names_out,
        "output_function": model.config.output_function,
        **{k: v for k, v in extra.items() if k != "kind"},
        "num_layers": model.config.num_layers, "num_kv_heads": heads, "head_dim": head_dim,
        "external_data": external,
        "files": {f: {"sha256": _sha256(tmp / f), "bytes": (tmp / f).stat().st_size} for f in files},
        "exported_with": {"torch": torch.__version__, "onnx": onnx.__version__, "steerkit": _steerkit_version(),
                          "seconds": None},
    }


def _write_manifest_and_publish(tmp: Path, out: Path, manifest: dict, started: float) -> None:
    """Stamp the export time, write the manifest last (atomically) and rename ``tmp`` into place as ``out``."""
    manifest["exported_with"]["seconds"] = round(time.perf_counter() - started, 2)
    atomic_write_text(tmp / MANIFEST_NAME, json.dumps(manifest, indent=2))
    os.chmod(tmp / MANIFEST_NAME, 0o666 & ~_umask())
    _publish(tmp, out)


def _export_into_cache(entry: Path, export) -> Path:
    """``export(staging)`` to a private directory renamed to ``entry``; a concurrent winner's export is kept."""
    staging = entry.with_name(f"{entry.name}.staging{os.getpid()}.{time.monotonic_ns()}")
    try:
        export(staging)
        try:
            os.rename(staging, entry)
        except OSError:
            if not (entry / MANIFEST_NAME).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def _legacy_exporter() -> dict:
    """Ask for the TorchScript exporter where torch also has the dynamo one (default since torch 2.9).

    The dynamo exporter needs onnxscript and took 69 s instead of 7 s on SmolLM2 (DESIGN.md §2).
    """
    import inspect

    return {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _steerkit_version() -> str:
    try:
        from ... import __version__
    except ImportError:
        return "unknown"
    return __version__


def _check_against_torch(directory: Path, wrapper: _ExportWrapper, names_in: list[str], model: RewardModel) -> None:
    ort = _require("onnxruntime")
    session = ort.InferenceSession(str(directory / MODEL_FILE), providers=["CPUExecutionProvider"])
    for batch, new, past in ((3, 5, 0), (2, 1, 6)):  # a prefill and a single-token step, unlike the trace
        args = _probe_inputs(model, batch, new, past, seed=batch + new + past)
        with torch.no_grad():
            expected = wrapper(*args)
        got = session.run(None, {n: a.numpy() for n, a in zip(names_in, args)})
        diff = max(float((torch.from_numpy(g) - e).abs().max()) for g, e in zip(got, expected))
        if not diff <= EXPORT_TOLERANCE:
            raise ExportError(f"The ONNX graph of {model.config.name!r} differs from torch by {diff:.2e} "
                              f"(> {EXPORT_TOLERANCE}) on a probe (batch {batch}, new {new}, past {past}); "
                              "the export is not published. Try another --opset or report the backbone.")


def _publish(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (allowed by the caller) is replaced."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old{os.getpid()}")
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- sources and the cache ---------------------------------------------------------------------------
def export_source(reference: str) -> tuple[RewardModel, str, dict]:
    """(model, reward hash, provenance) for a reward-model directory or a registered reward name."""
    path = Path(reference).expanduser()
    if path.name == CONFIG_NAME:
        path = path.parent
    if is_export_dir(path):
        raise ExportError(f"{path} is already an ONNX export; pass the source reward-model directory.")
    if path.is_dir():
        model = RewardModel.from_pretrained(path)
        return model, reward_dir_hash(path), {"kind": "directory", "directory": str(path.resolve())}
    from ...registry import get_registry  # (not rewards.loading, which reaches this module back through token_onnx)

    try:  # a plugin's reward_model_factory exposes the directory it loads: hash its files like a path
        directory = getattr(get_registry().get("reward", reference).factory, "directory", None)
    except Exception:  # not registered (the lookup below raises the helpful error) or no registry
        directory = None
    if directory is not None and (Path(directory) / CONFIG_NAME).is_file():
        model = RewardModel.from_pretrained(directory)
        return model, reward_dir_hash(directory), {"kind": "registered", "name": reference,
                                                   "directory": str(Path(directory).resolve())}
    entry = get_registry().get("reward", reference)  # an unknown name raises PluginError, listing the registered
    scorer = entry.build(entry.accepted({"backend": "torch", "context": "continuation"}))
    model = getattr(scorer, "model", None)
    if not isinstance(model, RewardModel):
        raise ExportError(f"Reward {reference!r} is not backed by a steerkit RewardModel, so it cannot be "
                          "exported to ONNX.")
    return model, model_content_hash(model), {"kind": "registered", "name": reference}


def cache_entry(reward_hash: str, opset: int = DEFAULT_OPSET) -> Path:
    """Where the automatic export of a reward (by hash) lives in the steerkit cache."""
    key = hashlib.sha256(f"{reward_hash}|{EXPORT_FORMAT_VERSION}|{opset}".encode()).hexdigest()
    return cache_dir() / "onnx" / key[:32]


def ensure_cached_export(model_or_dir, *, reward_hash: str | None = None, opset: int = DEFAULT_OPSET) -> Path:
    """The cached export of a reward-model directory or an in-memory model; exported on first use.

    Concurrent first uses each export to a private temporary directory; the first rename wins and the
    others discard their copy, so no reader ever sees a half-written export.
    """
    if isinstance(model_or_dir, RewardModel):
        model = model_or_dir
        reward_hash = reward_hash or model_content_hash(model)
        source = {"kind": "in-memory", "name": model.config.name}
    else:
        directory = Path(model_or_dir)
        reward_hash = reward_hash or reward_dir_hash(directory)
        model, source = None, {"kind": "directory", "directory": str(directory.resolve())}
    entry = cache_entry(reward_hash, opset)
    if (entry / MANIFEST_NAME).is_file():
        return entry
    print(f"steerkit: exporting {source.get('directory') or source['name']} to ONNX for the onnx backend (first use "
          f"only; about 20 s for 4 layers on 2 CPU cores); cached in {entry}", file=sys.stderr, flush=True)
    start, model = time.perf_counter(), RewardModel.from_pretrained(model_or_dir) if model is None else model
    out = _export_into_cache(entry, lambda tmp: export_onnx(model, tmp, source_hash=reward_hash, source=source,
                                                            opset=opset))
    print(f"steerkit: ONNX export done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out



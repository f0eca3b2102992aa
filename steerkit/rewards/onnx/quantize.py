"""int8 ONNX exports: a verified fp32 export whose backbone weights are stored in 8 bits (the ``onnx-int8`` backend).

Every matrix multiplication of the backbone by a constant weight (``MatMul``, or the ``Gemm`` of a GPT-2 style
``Conv1D``) becomes onnxruntime's ``MatMulNBits`` with 8-bit weights: symmetric, one float32 scale per block of
:data:`BLOCK_SIZE` input rows of each output column, zero point 128. ``accuracy_level`` 4 has onnxruntime compute
it in int8 (the activations are quantized per block on the fly, by the same block size) with int32 accumulation;
the result is float32 again. Everything else stays float32: the token embedding table (a gather reads a few rows,
not the whole table), the reward or token head (a few thousand weights that decide ρ), norms, attention and the KV
cache. Why this recipe and not onnxruntime's ``quantize_dynamic`` (a per-tensor activation scale) or fp32 compute
over int8 weights (``accuracy_level`` 0): docs/backends.md, "Reduced precision" (measured on the shipped models).

An int8 export is an export directory like any other (same inputs and outputs, same manifest format); its manifest
says ``"precision": "int8"`` and records the recipe and the fp32 graph it was made from (``quantization``). It is made
from the fp32 export on first use and cached next to it (``$STEERKIT_CACHE/onnx/<key>``, keyed by the reward hash, the
fp32 graph's SHA-256 and :data:`QUANT_VERSION`), written to a private directory and renamed into place like the fp32
export. Before it is published it is run in onnxruntime against the fp32 graph on probe inputs: a reward (or token
head query) further than :data:`INT8_PROBE_TOLERANCE` from fp32, or one bit-identical to it (nothing was quantized),
and it is not published.

``MatMulNBits`` with 8 bits needs onnxruntime >= :data:`MIN_ONNXRUNTIME` (its x86 kernels for 8 bits came in 1.22);
with an older one the backend raises :class:`~steerkit.errors.ExportError` saying so (:func:`check_int8_support`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ...errors import ExportError
from ...files import cache_dir
from .export import (EXTERNAL_DATA_THRESHOLD, INSTALL_HINT, _check_out_dir, _export_into_cache, _make_tmp_dir, _require,
                     _sha256, _umask, _write_manifest_and_publish)
from .manifest import DATA_FILE, MANIFEST_NAME, MODEL_FILE, read_manifest

#: input rows of a weight column that share one scale (and one activation scale in the int8 compute)
BLOCK_SIZE = 32
BITS = 8
#: onnxruntime's MatMulNBits ``accuracy_level``: 4 = int8 compute (0/1 = float32 compute, 5-9x slower here)
ACCURACY_LEVEL = 4
#: bump when the recipe changes: cached int8 exports of an older recipe are then made anew
QUANT_VERSION = 1
#: the first onnxruntime with x86 kernels for 8-bit MatMulNBits
MIN_ONNXRUNTIME = "1.22"
#: largest |Δ| between the int8 and the fp32 graph's first output (rewards in [0, 1]; a token head's query, relative
#: to its largest entry) on the probe inputs, beyond which an int8 export is refused: a broken quantization is off
#: by O(1); the shipped models' int8 rewards are within 0.03 of fp32 on real text (docs/backends.md)
INT8_PROBE_TOLERANCE = 0.1
#: the part of the graph that is quantized: the backbone's nodes (the traced module path of RewardModel.backbone);
#: the heads stay float32
BACKBONE_SCOPE = "/backbone/"
PRECISION_FP32, PRECISION_INT8 = "fp32", "int8"
_DOMAIN = "com.microsoft"


def export_precision(manifest: dict) -> str:
    """``"int8"`` for an int8 export, ``"fp32"`` for any other (every export made before precisions existed)."""
    return manifest.get("precision", PRECISION_FP32)


# -- onnxruntime support -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _int8_support() -> str | None:
    """None when onnxruntime runs an 8-bit MatMulNBits on the CPU, else why not (probed once per process)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return f"backend 'onnx-int8' needs onnx and onnxruntime: {INSTALL_HINT}"

    K, N = BLOCK_SIZE, 2
    weights = np.full((N, 1, BLOCK_SIZE), 129, dtype=np.uint8)  # every weight 1 * scale
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain=_DOMAIN, K=K, N=N, bits=BITS,
                            block_size=BLOCK_SIZE, accuracy_level=ACCURACY_LEVEL)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N])],
                              [numpy_helper.from_array(weights, "B"),
                               numpy_helper.from_array(np.full(N, 0.5, dtype=np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_DOMAIN, 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 4  # an onnxruntime without the kernel logs an error before it raises
    try:
        session = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        out = session.run(None, {"A": np.ones((1, K), dtype=np.float32)})[0]
    except Exception as exc:  # onnxruntime raises its own types
        return (f"backend 'onnx-int8' needs onnxruntime >= {MIN_ONNXRUNTIME} (8-bit MatMulNBits kernels); this is "
                f"onnxruntime {ort.__version__}, which cannot run them ({type(exc).__name__}). Upgrade it: "
                f"pip install -U 'onnxruntime>={MIN_ONNXRUNTIME}', or use backend 'onnx' (fp32).")
    if not np.allclose(out, 0.5 * K, rtol=1e-2):
        return (f"onnxruntime {ort.__version__} computes an 8-bit MatMulNBits wrongly ({out.tolist()} instead of "
                f"{0.5 * K}); use backend 'onnx' (fp32).")
    return None


def int8_supported() -> bool:
    """True when this onnxruntime runs the int8 exports (8-bit MatMulNBits on the CPU)."""
    return _int8_support() is None


def check_int8_support() -> None:
    """Raise :class:`ExportError` (what to install) unless this onnxruntime runs int8 exports."""
    problem = _int8_support()
    if problem is not None:
        raise ExportError(problem)


# -- the graph rewrite ---------------------------------------------------------------------------------------
def _quantized_weight(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(B [N, blocks, block_size] uint8, scales [N * blocks] float32) of a float weight [K, N] (``Y = A @ W``)."""
    K, N = weight.shape
    blocks = -(-K // block_size)
    columns = np.zeros((N, blocks * block_size), dtype=np.float32)
    columns[:, :K] = weight.T
    columns = columns.reshape(N, blocks, block_size)
    amax = np.abs(columns).max(-1)
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(columns / scales[..., None]), -127, 127) + 128
    return q.astype(np.uint8), scales.reshape(-1)


def _gemm_weight(node, initializers) -> np.ndarray | None:
    """The weight [K, N] of a ``Gemm`` that is ``A @ W (+ C)``: alpha = beta = 1, A not transposed; else None."""
    from onnx import numpy_helper

    attrs = {a.name: a for a in node.attribute}
    if attrs.get("transA") is not None and attrs["transA"].i:
        return None
    if any(name in attrs and abs(attrs[name].f - 1.0) > 0 for name in ("alpha", "beta")):
        return None
    weight = numpy_helper.to_array(initializers[node.input[1]])
    return weight.T if (attrs.get("transB") is not None and attrs["transB"].i) else weight


def quantize_graph(model, *, block_size: int = BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL,
                   scope: str = BACKBONE_SCOPE) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place): every ``MatMul``/``Gemm`` of a node under ``scope`` by
    a constant float32 2-D weight becomes an 8-bit ``MatMulNBits`` (a ``Gemm``'s bias an ``Add`` after it). Returns
    how many were rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes, dropped, added, count = [], set(), [], 0
    for node in graph.node:
        init = initializers.get(node.input[1]) if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 else None
        if (init is None or scope not in node.name or init.data_type != TensorProto.FLOAT or len(init.dims) != 2
                or node.input[0] in initializers):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(init) if node.op_type == "MatMul" else _gemm_weight(node, initializers)
        if weight is None:
            nodes.append(node)
            continue
        K, N = weight.shape
        q, scales = _quantized_weight(weight, block_size)
        base = f"{node.name}/int8"
        added += [numpy_helper.from_array(q, f"{base}/B"), numpy_helper.from_array(scales, f"{base}/scales")]
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
        out = f"{base}/Y" if bias else node.output[0]
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], f"{base}/B", f"{base}/scales"], [out],
                                      name=base, domain=_DOMAIN, K=K, N=N, bits=BITS, block_size=block_size,
                                      accuracy_level=accuracy_level))
        if bias:
            nodes.append(helper.make_node("Add", [out, bias], [node.output[0]], name=f"{base}/bias"))
        uses[node.input[1]] -= 1
        if uses[node.input[1]] == 0:
            dropped.add(node.input[1])
        count += 1
    kept = [i for i in graph.initializer if i.name not in dropped] + added
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if count and not any(o.domain == _DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    return count


# -- making and caching int8 exports --------------------------------------------------------------------------
def int8_cache_entry(fp32_manifest: dict) -> Path:
    """Where the int8 export of an fp32 export (by its manifest) lives in the steerkit cache."""
    graph_sha = fp32_manifest["files"][MODEL_FILE]["sha256"]
    key = hashlib.sha256(f"{fp32_manifest['source']['reward_hash']}|{graph_sha}|int8|{QUANT_VERSION}".encode())
    return cache_dir() / "onnx" / key.hexdigest()[:32]


def ensure_int8_export(fp32_dir: str | os.PathLike) -> Path:
    """The cached int8 export of the fp32 export ``fp32_dir``, made on first use (an int8 export is returned as it
    is). Concurrent first uses each write a private directory; the first rename wins."""
    fp32_dir = Path(fp32_dir)
    manifest = read_manifest(fp32_dir)
    if export_precision(manifest) == PRECISION_INT8:
        return fp32_dir
    check_int8_support()
    entry = int8_cache_entry(manifest)
    if (entry / MANIFEST_NAME).is_file():
        return entry
    print(f"steerkit: quantizing the ONNX export {fp32_dir} to int8 for the onnx-int8 backend (first use only; a "
          f"few seconds); cached in {entry}", file=sys.stderr, flush=True)
    return _export_into_cache(entry, lambda staging: quantize_export(fp32_dir, staging))


def quantize_export(fp32_dir: str | os.PathLike, out_dir: str | os.PathLike, *, overwrite: bool = False,
                    check: bool = True) -> Path:
    """Write the int8 export of the fp32 export ``fp32_dir`` to ``out_dir`` (a temporary sibling renamed into
    place); with ``check`` it must stay within :data:`INT8_PROBE_TOLERANCE` of fp32 on probe inputs, and differ from
    it, before it is published. Returns ``out_dir``."""
    onnx = _require("onnx")
    check_int8_support()
    fp32_dir, out = Path(fp32_dir), _check_out_dir(out_dir, overwrite)
    manifest = read_manifest(fp32_dir)
    if export_precision(manifest) != PRECISION_FP32:
        raise ExportError(f"{fp32_dir} is already an {export_precision(manifest)} export; quantize the fp32 export.")
    started = time.perf_counter()
    tmp = _make_tmp_dir(out)
    try:
        model = onnx.load(str(fp32_dir / MODEL_FILE), load_external_data=True)
        count = quantize_graph(model)
        if not count:
            raise ExportError(f"{fp32_dir}: no matrix multiplication by a constant weight found under "
                              f"{BACKBONE_SCOPE!r}, so there is nothing to quantize to int8; use backend 'onnx'.")
        weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
        external = weight_bytes > EXTERNAL_DATA_THRESHOLD
        if external:
            onnx.save_model(model, str(tmp / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=DATA_FILE, size_threshold=1024)
        else:
            onnx.save_model(model, str(tmp / MODEL_FILE))
        del model
        files = [MODEL_FILE] + ([DATA_FILE] if external else [])
        for name in manifest["files"]:  # the other files (tokenizer-free: embeddings of a token-level export)
            if name not in (MODEL_FILE, DATA_FILE):
                _link_or_copy(fp32_dir / name, tmp / name)
                files.append(name)
        shutil.copytree(fp32_dir / manifest["tokenizer"].get("directory", "tokenizer"),
                        tmp / manifest["tokenizer"].get("directory", "tokenizer"))
        if check:
            _check_against_fp32(fp32_dir, tmp, manifest)
        new = json.loads(json.dumps(manifest))
        import onnxruntime

        new.update({
            "precision": PRECISION_INT8, "external_data": external,
            "files": {f: {"sha256": _sha256(tmp / f), "bytes": (tmp / f).stat().st_size} for f in files},
            "quantization": {"method": "MatMulNBits", "bits": BITS, "block_size": BLOCK_SIZE, "symmetric": True,
                             "accuracy_level": ACCURACY_LEVEL, "scope": BACKBONE_SCOPE, "nodes": count,
                             "version": QUANT_VERSION, "onnxruntime": onnxruntime.__version__,
                             "source_export": {"model_sha256": manifest["files"][MODEL_FILE]["sha256"],
                                               "directory": str(fp32_dir.resolve())}},
        })
        new["exported_with"] = {**manifest.get("exported_with", {}), "onnx": onnx.__version__, "seconds": None}
        _write_manifest_and_publish(tmp, out, new, started)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
        os.chmod(dst, 0o666 & ~_umask())


def probe_feeds(manifest: dict, batch: int, new: int, past: int, seed: int) -> dict[str, np.ndarray]:
    """Valid random inputs of an export's graph (from its manifest alone): a prefix with a hole in row 0, then
    causal new tokens."""
    rng = np.random.default_rng(seed)
    H, d = int(manifest["num_kv_heads"]), int(manifest["head_dim"])
    vocab = int(manifest["reward_config"]["vocab_size"])
    prefix = np.ones((batch, past), dtype=bool)
    if past > 1:
        prefix[0, 0] = False
    allowed = np.concatenate([np.broadcast_to(prefix[:, None, :], (batch, new, past)),
                              np.broadcast_to(np.tril(np.ones((new, new), dtype=bool)), (batch, new, new))], axis=-1)
    feeds = {"input_ids": rng.integers(0, vocab, (batch, new), dtype=np.int64),
             "position_ids": (prefix.sum(-1, keepdims=True) + np.arange(new)[None]).astype(np.int64),
             "attention_mask": np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None]}
    for name in manifest["inputs"][3:]:
        feeds[name] = (rng.standard_normal((batch, H, past, d)) * 0.5).astype(np.float32)
    return {name: feeds[name] for name in manifest["inputs"]}


def _check_against_fp32(fp32_dir: Path, int8_dir: Path, manifest: dict) -> None:
    """The int8 graph's first output (rewards, or a token head's query) on probe inputs: within
    :data:`INT8_PROBE_TOLERANCE` of the fp32 graph's, and not identical to it."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(d / MODEL_FILE), providers=["CPUExecutionProvider"])
                for d in (fp32_dir, int8_dir)]
    name = manifest["outputs"][0]
    worst, identical = 0.0, True
    for batch, new, past in ((2, 5, 0), (2, 3, 6)):  # a prefill and a step over a cached prefix
        feeds = probe_feeds(manifest, batch, new, past, seed=batch + new + past)
        ref, got = (s.run([name], feeds)[0] for s in sessions)
        scale = 1.0 if name == "rewards" else max(float(np.abs(ref).max()), 1e-6)
        if not np.isfinite(got).all():
            worst = float("inf")
            break
        worst = max(worst, float(np.abs(got - ref).max()) / scale)
        identical = identical and bool(np.array_equal(got, ref))
    if not worst <= INT8_PROBE_TOLERANCE:
        raise ExportError(f"The int8 graph of {fp32_dir} differs from fp32 by {worst:.3g} (> {INT8_PROBE_TOLERANCE}) "
                          "on probe inputs; it is not published. Use backend 'onnx' (fp32) and report the model.")
    if identical:
        raise ExportError(f"The int8 graph of {fp32_dir} gives exactly the fp32 outputs on probe inputs: the "
                          "quantization had no effect; it is not published.")

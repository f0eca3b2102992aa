"""A candidate int8 recipe for CPUs without VNNI, measured against ``onnx-int8``: onnxruntime's dynamic quantization.

On an AVX2-only CPU ``onnx-int8`` (8-bit ``MatMulNBits``, int8 compute) is barely faster than fp32 ``onnx``
(docs/backends.md, "On an AVX2-only CPU"). onnxruntime's ``quantize_dynamic`` (``MatMulInteger``/``DynamicQuantize
MatMul``: per-channel int8 weights, one uint8 scale per activation tensor, MLAS's U8S8 kernels) is the fastest int8
product there, but one activation scale per tensor loses the channels with outliers. This probe measures it plain and
after folding SmoothQuant scales (Xiao et al. 2023) into the fp32 weights first:

* per layer, ``s = max|X|^alpha / max|W|^(1 - alpha)`` per input channel of q/k/v (folded into ``input_layernorm``),
  gate/up (into ``post_attention_layernorm``) and down_proj (into up_proj's output rows); the fp32 model is the same
  function (its export is checked against torch as any export is);
* ``max|X|`` from the backbone's inputs on calibration texts, half of ``--texts`` labelled texts; the other half is
  the evaluation set (the same source as ``bench_reward_precision.py``: s-nlp Jigsaw test sentences in ../shared/data,
  else the repository's functional cases);
* weights 7-bit (``reduce_range``): without VNNI the U8S8 kernel's 16-bit pair sums saturate at 8 bits.

For each variant: the onnxruntime run of one decoding step (k candidates after a 20-token prefix for a sequence
reward, one position for a token-level reward), in the session a reward runs in (``OnnxRuntime``, 1 thread) with
``probe_feeds``'s inputs, the variants alternating over ``--rounds``, median; and max and mean |Δρ| against fp32
torch over the evaluation texts and all their prefixes, with the AUROC.

    python benchmarks/probe_int8_dynamic.py              # ~4 min on one thread; JSON: results/probe_int8_dynamic.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_reward_precision import labelled_texts  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402


def input_maxima(model, texts: list[str]) -> dict:
    """Per layer, the largest |x| per input channel of q_proj (= k, v), gate_proj (= up) and down_proj."""
    stats, hooks = {}, []

    def hook(key):
        def record(_module, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0)
            stats[key] = torch.maximum(stats[key], x) if key in stats else x
        return record

    for i, layer in enumerate(model.backbone.layers):
        hooks += [layer.self_attn.q_proj.register_forward_pre_hook(hook((i, "qkv"))),
                  layer.mlp.gate_proj.register_forward_pre_hook(hook((i, "gate_up"))),
                  layer.mlp.down_proj.register_forward_pre_hook(hook((i, "down")))]
    try:
        with torch.no_grad():
            model.score_texts(texts)
    finally:
        for h in hooks:
            h.remove()
    return stats


def smoothed(model, stats: dict, alpha: float):
    """A copy of ``model`` with SmoothQuant scales folded in: the same function, flatter activations."""
    out = copy.deepcopy(model)

    def scales(x, linears):
        w = torch.cat([lin.weight.abs() for lin in linears], 0).amax(0)
        return (x.clamp(min=1e-5) ** alpha / w.clamp(min=1e-5) ** (1 - alpha)).clamp(1e-2, 1e2)

    with torch.no_grad():
        for i, layer in enumerate(out.backbone.layers):
            attn, mlp = layer.self_attn, layer.mlp
            s = scales(stats[(i, "qkv")], [attn.q_proj, attn.k_proj, attn.v_proj])
            layer.input_layernorm.weight.div_(s)
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj):
                lin.weight.mul_(s)
            s = scales(stats[(i, "gate_up")], [mlp.gate_proj, mlp.up_proj])
            layer.post_attention_layernorm.weight.div_(s)
            for lin in (mlp.gate_proj, mlp.up_proj):
                lin.weight.mul_(s)
            s = scales(stats[(i, "down")], [mlp.down_proj])
            mlp.up_proj.weight.div_(s[:, None])
            mlp.down_proj.weight.mul_(s)
    return out


def dynamic_int8(fp32_dir: Path, out_dir: Path) -> Path:
    """``quantize_dynamic`` of the backbone's matmuls (per-channel int8 weights, 7-bit), as an export directory."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from steerkit.rewards.onnx.export import _sha256
    from steerkit.rewards.onnx.manifest import MANIFEST_NAME, MODEL_FILE

    shutil.copytree(fp32_dir, out_dir)
    graph = onnx.load(str(fp32_dir / MODEL_FILE))
    nodes = [n.name for n in graph.graph.node if n.op_type in ("MatMul", "Gemm") and "/backbone/" in n.name]
    del graph
    quantize_dynamic(str(fp32_dir / MODEL_FILE), str(out_dir / MODEL_FILE), weight_type=QuantType.QInt8,
                     per_channel=True, reduce_range=True, nodes_to_quantize=nodes)
    manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    manifest["files"][MODEL_FILE] = {"sha256": _sha256(out_dir / MODEL_FILE),
                                     "bytes": (out_dir / MODEL_FILE).stat().st_size}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest))
    return out_dir


def step_session(directory: Path, positions: int, prefix: int = 20):
    """The onnxruntime session a reward runs an export in (steerkit's own, 1 thread) and the feeds of one decoding
    step: ``positions`` new tokens after a ``prefix``-token KV cache."""
    from steerkit.rewards.onnx.backend import OnnxRuntime
    from steerkit.rewards.onnx.manifest import read_manifest
    from steerkit.rewards.onnx.quantize import probe_feeds

    manifest = read_manifest(directory)
    runtime = OnnxRuntime(directory, manifest, providers=["CPUExecutionProvider"], threads=1)
    return runtime.session, probe_feeds(manifest, 1, positions, prefix, seed=0)


def time_alternated(rows: dict, rounds: int, runs: int) -> dict[str, list[float]]:
    """ms of ``runs`` calls of each row's function per round (after 3 untimed), the rows in turn and their order
    reversed every round; per row, the times of round 0, then round 1, ..."""
    times = {name: [] for name in rows}
    for r in range(rounds):
        for name in (list(rows) if r % 2 == 0 else list(reversed(rows))):
            for _ in range(3):
                rows[name]()
            for _ in range(runs):
                start = time.perf_counter()
                rows[name]()
                times[name].append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward", default="toxicity")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    parser.add_argument("--texts", type=int, default=400, help="labelled texts: half calibrate, half evaluate")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per variant and round")
    parser.add_argument("--out", default=str(HERE / "results" / "probe_int8_dynamic.json"))
    args = parser.parse_args()
    import steerkit
    from steerkit.files import atomic_write_text
    from steerkit.rewards.onnx.export import export_onnx
    from steerkit.rewards.onnx.quantize import quantize_export
    from steerkit.threads import set_threads
    from steerkit.training.metrics import auroc

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    model = steerkit.load_reward(args.reward, backend="torch").model
    token_level = model.config.kind == "token"
    texts, labels, source = labelled_texts(args.texts)
    calibration, evaluation, eval_labels = texts[1::2], texts[0::2], labels[0::2]
    stats = input_maxima(model, calibration)
    scratch = Path(tempfile.mkdtemp(prefix="probe_int8_dynamic_"))
    try:
        variants = {"onnx (fp32)": export_onnx(model, scratch / "fp32")}
        variants["onnx-int8 (MatMulNBits)"] = quantize_export(variants["onnx (fp32)"], scratch / "nbits")
        variants["dynamic"] = dynamic_int8(variants["onnx (fp32)"], scratch / "dynamic")
        for alpha in args.alphas:
            fp32 = export_onnx(smoothed(model, stats, alpha), scratch / f"smooth{alpha}")
            variants[f"dynamic, smoothed alpha={alpha}"] = dynamic_int8(fp32, scratch / f"smooth{alpha}-int8")
        ref_texts, ref_prefixes = model.score_texts(evaluation, per_prefix=True)
        reference = torch.tensor(ref_texts + [x for p in ref_prefixes for x in p])
        results = {}
        for name, directory in variants.items():
            got_texts, got_prefixes = steerkit.load_reward(str(directory), backend="onnx").model.score_texts(
                evaluation, per_prefix=True)
            gap = (torch.tensor(got_texts + [x for p in got_prefixes for x in p]) - reference).abs()
            results[name] = {"max_abs_delta": round(gap.max().item(), 4), "mean_abs_delta": round(gap.mean().item(), 5),
                             "auroc": round(auroc(got_texts, eval_labels), 4)}
        sessions = {name: step_session(d, 1 if token_level else args.k) for name, d in variants.items()}
        times = time_alternated({name: (lambda s=session, f=feeds: s.run(None, f))
                                 for name, (session, feeds) in sessions.items()}, args.rounds, args.runs)
        for name, ms in times.items():
            results[name]["step_ms"] = ms
        base = float(np.median(results["onnx (fp32)"]["step_ms"]))
        for name, row in results.items():
            row["step_ms_median"] = round(float(np.median(row.pop("step_ms"))), 2)
            row["x_onnx_fp32"] = round(base / row["step_ms_median"], 2)
            print(f"{name:32s} step {row['step_ms_median']:6.2f} ms ({row['x_onnx_fp32']:.2f}x onnx fp32)  "
                  f"max|d rho| {row['max_abs_delta']:.4f}  mean {row['mean_abs_delta']:.5f}  AUROC {row['auroc']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    import onnxruntime

    out = {"reward": args.reward, "k": args.k, "positions_per_step": 1 if token_level else args.k,
           "torch_auroc": round(auroc(ref_texts, eval_labels), 4), "texts": source,
           "calibration_texts": len(calibration), "evaluation_texts": len(evaluation),
           "results": results, "load_average": [list(load_before), list(os.getloadavg())],
           "cpu": cpu_flags(), "machine": platform.machine(), "onnxruntime": onnxruntime.__version__,
           "torch": torch.__version__}
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

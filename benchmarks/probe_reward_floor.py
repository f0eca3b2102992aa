"""How far a reward step is from its matrix products: the step against its products alone, in one run.

Issue 25 asks RAD through llama.cpp with ``toxicity`` (k = 20) to cost at most 2x llama.cpp's plain Q4_1 step. On an
AVX2-only CPU that needs the reward step to take no longer than the LM's whole step. This probe says how much of a
reward step is left to save at fp32: it times, alternating over ``--rounds`` in the session a reward runs in
(``OnnxRuntime``, 1 thread),

* **the step**: the reward's fp32 export on ``probe_feeds``'s inputs (k new tokens after a ``--prefix``-token cache),
  as ``probe_int8_dynamic.py`` times it;
* **its products alone (onnxruntime)**: a graph of only the export's own backbone ``MatMul`` nodes, the same weights,
  each fed a [k, d_in] input (the rows the step multiplies), so nothing but MLAS's fp32 GEMM runs;
* **its products alone (torch)**: the same products as ``torch.matmul`` on 1 thread.

and reports each one's median, the products' floating-point operations and the rate they ran at.

    python benchmarks/probe_reward_floor.py     # ~1 min on one thread; JSON: results/probe_reward_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cpu_info import cpu_flags  # noqa: E402
from probe_int8_dynamic import step_session, time_alternated  # noqa: E402


def backbone_weights(directory: Path) -> list[np.ndarray]:
    """The weight [d_in, d_out] of every backbone ``MatMul`` of an fp32 export, in graph order."""
    import onnx
    from onnx import numpy_helper

    from steerkit.rewards.onnx.manifest import MODEL_FILE

    graph = onnx.load(str(directory / MODEL_FILE)).graph
    initializers = {i.name: i for i in graph.initializer}
    weights = []
    for node in graph.node:
        if node.op_type == "MatMul" and "/backbone/" in node.name:
            named = [initializers[name] for name in node.input if name in initializers]
            if named:
                weights.append(numpy_helper.to_array(named[0]))
    return weights


def products_session(weights: list[np.ndarray], rows: int):
    """An onnxruntime session of the products alone (steerkit's session options, 1 thread) and its feeds."""
    from onnx import TensorProto, helper, numpy_helper

    from steerkit.rewards.onnx.backend import OnnxRuntime

    widths = sorted({w.shape[0] for w in weights})
    nodes = [helper.make_node("MatMul", [f"x{w.shape[0]}", f"w{i}"], [f"y{i}"]) for i, w in enumerate(weights)]
    graph = helper.make_graph(
        nodes, "products", [helper.make_tensor_value_info(f"x{d}", TensorProto.FLOAT, [rows, d]) for d in widths],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(weights))],
        initializer=[numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    scratch = Path(tempfile.mkdtemp(prefix="probe_reward_floor_"))
    try:
        (scratch / "model.onnx").write_bytes(model.SerializeToString())
        manifest = {"num_layers": 0, "num_kv_heads": 0, "head_dim": 0, "inputs": [], "outputs": []}
        runtime = OnnxRuntime(scratch, manifest, providers=["CPUExecutionProvider"], threads=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the session holds the graph in memory
    rng = np.random.default_rng(0)
    return runtime.session, {f"x{d}": rng.standard_normal((rows, d)).astype(np.float32) for d in widths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward", default="toxicity")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--prefix", type=int, default=32, help="tokens in the reward's cache before the step")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row and round")
    parser.add_argument("--out", default=str(HERE / "results" / "probe_reward_floor.json"))
    args = parser.parse_args()
    import onnxruntime

    import steerkit
    from steerkit.files import atomic_write_text
    from steerkit.rewards.onnx.export import export_onnx
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    model = steerkit.load_reward(args.reward, backend="torch").model
    if model.config.kind != "sequence":
        parser.error(f"{args.reward} is a {model.config.kind} reward: its step is one position whatever k is; "
                     "this probe is for sequence rewards, whose step multiplies k rows")
    scratch = Path(tempfile.mkdtemp(prefix="probe_reward_floor_"))
    try:
        export = export_onnx(model, scratch / "fp32")
        weights = backbone_weights(export)
        step, step_feeds = step_session(export, args.k, args.prefix)
        products, product_feeds = products_session(weights, args.k)
        torch_weights = [torch.from_numpy(w.copy()) for w in weights]
        torch_inputs = {x.shape[1]: torch.from_numpy(x) for x in product_feeds.values()}  # by input width

        def torch_products():
            with torch.inference_mode():
                for w in torch_weights:
                    torch.matmul(torch_inputs[w.shape[0]], w)

        rows = {"step (onnxruntime fp32)": lambda: step.run(None, step_feeds),
                "products alone (onnxruntime fp32)": lambda: products.run(None, product_feeds),
                "products alone (torch fp32)": torch_products}
        times = time_alternated(rows, args.rounds, args.runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    flops = sum(2 * args.k * w.shape[0] * w.shape[1] for w in weights)
    results = {}
    for name, ms in times.items():
        per_round = [statistics.median(ms[i:i + args.runs]) for i in range(0, len(ms), args.runs)]
        median = statistics.median(ms)
        results[name] = {"ms_median": round(median, 2), "ms_median_per_round": [round(v, 2) for v in per_round],
                         "gflop_per_s_of_the_products": round(flops / median / 1e6, 1)}
        print(f"{name:36s} {median:6.2f} ms  (rounds {', '.join(f'{v:.1f}' for v in per_round)})  "
              f"products at {flops / median / 1e6:.1f} GFLOP/s")
    step_ms = results["step (onnxruntime fp32)"]["ms_median"]
    share = results["products alone (onnxruntime fp32)"]["ms_median"] / step_ms
    print(f"products: {len(weights)} MatMuls, {flops / 1e9:.3f} GFLOP, {sum(w.nbytes for w in weights) / 1e6:.1f} MB "
          f"of fp32 weights; alone they take {share:.0%} of the step's time")
    out = {"reward": args.reward, "k": args.k, "prefix": args.prefix, "rounds": args.rounds, "runs": args.runs,
           "matmuls": len(weights), "gflop": round(flops / 1e9, 4),
           "weight_mb": round(sum(w.nbytes for w in weights) / 1e6, 1), "products_share_of_step": round(share, 3),
           "results": results, "load_average": [list(load_before), list(os.getloadavg())], "cpu": cpu_flags(),
           "machine": platform.machine(), "onnxruntime": onnxruntime.__version__, "torch": torch.__version__}
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

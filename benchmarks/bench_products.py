"""One linear layer's product in each precision steerkit offers, on this CPU, side by side in one run.

For each shape (rows x in x out: SmolLM2's MLP projections at 1 and 16 rows, and at the 320 candidate positions of a
16-row, k = 20 step of a sequence reward) it times, alternating, with 1 torch thread:

* ``float32``: ``F.linear`` on float32 weights (the default);
* ``bf16 torch``: ``F.linear`` on bf16 input and weight, what a bf16-compute layer called before (torch's own product);
* ``bf16 steerkit``: :class:`steerkit.linear_precision.Bf16MatmulLinear` (oneDNN's packed product where this CPU
  has bf16 instructions, float32's kernels where it has not);
* ``int8 torch._int_mm``: the int8 product a ``torch-int8`` layer called before;
* ``int8 steerkit``: :class:`steerkit.linear_precision.Int8MatmulLinear`, a ``torch-int8`` layer as the reward
  runs it (``torch._int_mm`` where this CPU has int8 instructions, float32's kernels on the layer's float32 copy
  of its weight where it has not).

Prints each one's median time and its ratio to float32, the CPU's instruction sets, and writes JSON:

    python benchmarks/bench_products.py        # ~1 min; JSON: benchmarks/results/bench_products.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from steerkit.linear_precision import BF16_COMPUTE, INT8, convert_linears, cpu_multiplies_int8, int8_weight

SHAPES = [(1, 576, 1536), (16, 576, 1536), (16, 1536, 576), (320, 576, 1536), (320, 1536, 576)]
FLAGS = ("avx2", "avx512_f", "avx512_bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "avx_ne_convert", "amx_tile")


def _median_ms(fn, seconds: float) -> float:
    fn()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(rows: int, k: int, n: int, seconds: float, rounds: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(rows, k)
    dense = torch.nn.Linear(k, n, bias=False)
    bf16 = torch.nn.Linear(k, n, bias=False)
    bf16.load_state_dict(dense.state_dict())
    convert_linears(bf16, BF16_COMPUTE)
    int8 = torch.nn.Linear(k, n, bias=False)
    int8.load_state_dict(dense.state_dict())
    convert_linears(int8, INT8)
    x_bf16, w_bf16 = x.to(torch.bfloat16), bf16.weight
    w_int8, _ = int8_weight(dense.weight, 1)
    w_int8_t = w_int8.t()
    x_int8 = torch.round(x / x.abs().amax(-1, keepdim=True) * 127).to(torch.int8)
    forms = {
        "float32": lambda: F.linear(x, dense.weight),
        "bf16 torch": lambda: F.linear(x_bf16, w_bf16),
        "bf16 steerkit": lambda: bf16(x),
        "int8 torch._int_mm": lambda: torch._int_mm(x_int8, w_int8_t),
        "int8 steerkit": lambda: int8(x),
    }
    times: dict[str, list[float]] = {name: [] for name in forms}
    with torch.no_grad():
        for _ in range(rounds):  # alternate, so that a change in the machine's state reaches every form alike
            for name, fn in forms.items():
                times[name].append(_median_ms(fn, seconds))
    medians = {name: statistics.median(v) for name, v in times.items()}
    return {"rows": rows, "in": k, "out": n, "ms": medians, "per_round_ms": times,
            "over_float32": {name: medians[name] / medians["float32"] for name in forms}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per form per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_products.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    capabilities = torch.cpu.get_capabilities()
    flags = {name: bool(capabilities.get(name, False)) for name in FLAGS}
    print("CPU:", platform.processor() or platform.machine(), {k: v for k, v in flags.items() if v},
          "| int8 instructions:", cpu_multiplies_int8())
    results = []
    for rows, k, n in SHAPES:
        r = measure(rows, k, n, args.seconds, args.rounds)
        results.append(r)
        print(f"[{rows} x {k}] x [{k} x {n}]: " + ", ".join(
            f"{name} {ms:.2f} ms ({r['over_float32'][name]:.2f}x)" for name, ms in r["ms"].items()))
    try:
        import os
        load = os.getloadavg()
    except (AttributeError, OSError):
        load = None
    out = {"torch": torch.__version__, "threads": 1, "cpu_flags": flags, "int8_instructions": cpu_multiplies_int8(),
           "load_average": load, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()

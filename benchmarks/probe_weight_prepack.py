"""Whether the compiled CPU step should keep inductor's packed weights: the two, alternated in one run.

On a CPU steerkit compiles its step with inductor's freezing (``steerkit.compiling.COMPILE_OPTIONS``), which packs
the frozen weights into oneDNN tensors. Those cannot be pickled, so inductor's FX graph cache is bypassed and every
new process lowers the graph again (about 2 min on the AVX2-only CPU, docs/performance.md). With
``cpp.weight_prepack=False`` the graph is cacheable. This probe compiles SmolLM2's plain F32 step both ways (two
copies of the model, one per setting), then runs bench_cpu's batch-1 generation with each, alternating over
``--rounds`` with the order reversed each round, and records ms per token, the first (compiling) run's time and
whether each compiled row's greedy texts equal eager's.

    python benchmarks/probe_weight_prepack.py     # ~9 min on one thread; JSON: results/probe_weight_prepack.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_cpu  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "probe_weight_prepack.json"))
    args = parser.parse_args()
    from torch._dynamo.utils import counters

    from steerkit.compiling import COMPILE_OPTIONS, compiled_step
    from steerkit.files import atomic_write_text
    from steerkit.models import load_causal_lm_cached
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    model, tokenizer = load_causal_lm_cached(bench_cpu.LM)[:2]
    unpacked = copy.deepcopy(model)
    compiled_step(unpacked).options = {**COMPILE_OPTIONS, "cpp.weight_prepack": False}
    rows = {"packed (steerkit's options)": (model, tokenizer), "cpp.weight_prepack=False": (unpacked, tokenizer)}
    prompts = bench_cpu.PROMPTS[:args.prompts]
    eager = bench_cpu.engine_run((model, tokenizer), {}, args.tokens, prompts, 1)[2]
    first = {}
    for name, lm in rows.items():  # compiles each row's one shape
        before = dict(counters["inductor"])
        start = time.perf_counter()
        bench_cpu.engine_run(lm, {}, args.tokens, prompts[:1], 1, compile=True)
        first[name] = {"seconds": round(time.perf_counter() - start, 1),
                       "fx_graph_cache": {key: value - before.get(key, 0) for key, value in counters["inductor"].items()
                                          if key.startswith("fxgraph") and value != before.get(key, 0)}}
        print(f"{name}: first run {first[name]['seconds']} s {first[name]['fx_graph_cache']}", flush=True)
    rounds = []
    for r in range(args.rounds):
        result = {}
        for name in (list(rows) if r % 2 == 0 else list(reversed(rows))):
            seconds, count, texts = bench_cpu.engine_run(rows[name], {}, args.tokens, prompts, 1, compile=True)
            result[name] = {"ms_per_token": round(seconds * 1000 / count, 2), "texts_equal_eager": texts == eager}
        packed, unpacked_ms = (result[name]["ms_per_token"] for name in rows)
        ratio = unpacked_ms / packed
        rounds.append({**result, "unpacked_over_packed": round(ratio, 3)})
        print(f"round {r}: {rounds[-1]}", flush=True)
    ratios = [r["unpacked_over_packed"] for r in rounds]
    print(f"unpacked / packed ms per token: median {statistics.median(ratios):.3f} (rounds {ratios})")
    out = {"lm": bench_cpu.LM, "tokens": args.tokens, "prompts": prompts, "first_run": first, "rounds": rounds,
           "unpacked_over_packed_median": round(statistics.median(ratios), 3),
           "load_average": [list(load_before), list(os.getloadavg())], "cpu": cpu_flags(), "torch": torch.__version__}
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

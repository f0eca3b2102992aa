"""An inductor option of the compiled CPU step against steerkit's options: the two, alternated in one run.

Written for ``cpp.weight_prepack`` (the default ``--option``). On a CPU steerkit compiles its step with inductor's
freezing (``steerkit.compiling.COMPILE_OPTIONS``), which packs the frozen weights into oneDNN tensors. Those cannot
be pickled, so inductor's FX graph cache is bypassed and every new process lowers the graph again (about 2 min on the
AVX2-only CPU, docs/performance.md). With ``cpp.weight_prepack=False`` the graph is cacheable. ``--option
emulate_precision_casts=True --dtype bfloat16`` asks what rounding a bf16 step's fused casts as eager does costs.

This probe compiles SmolLM2's plain step both ways (two copies of the model, one per setting; ``--dtype``: the LM's
``dtype``), then runs bench_cpu's generation (``--batch`` rows at once) with each, alternating over ``--rounds`` with
the order reversed each round, and records ms per token, the first (compiling) run's time and whether each compiled
row's greedy texts equal eager's (at the same ``--dtype``).

    python benchmarks/probe_weight_prepack.py     # ~9 min on one thread; JSON: results/probe_weight_prepack.json
    python benchmarks/probe_weight_prepack.py --dtype bfloat16 --option emulate_precision_casts=True \
        --out benchmarks/results/probe_precision_casts_b1.json
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
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    parser.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="an inductor setting of the variant (True/False/numbers as Python reads them); "
                             "repeatable; default: cpp.weight_prepack=False")
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
    import ast

    from steerkit.assembly import lm_runner

    options = {}
    for item in args.option or ["cpp.weight_prepack=False"]:
        key, _, value = item.partition("=")
        options[key] = ast.literal_eval(value)
    variant = ", ".join(f"{k}={v}" for k, v in options.items())
    model, tokenizer = load_causal_lm_cached(bench_cpu.LM)[:2]
    other = copy.deepcopy(model)
    compiled_step(lm_runner(other, dtype=args.dtype)).options = {**COMPILE_OPTIONS, **options}
    default = "steerkit's options"
    rows = {default: (model, tokenizer), variant: (other, tokenizer)}
    prompts = bench_cpu.PROMPTS[:args.prompts]
    run = dict(dtype=args.dtype)
    eager = bench_cpu.engine_run((model, tokenizer), {}, args.tokens, prompts, args.batch, **run)[2]
    first = {}
    for name, lm in rows.items():  # compiles each row's one shape
        before = dict(counters["inductor"])
        start = time.perf_counter()
        bench_cpu.engine_run(lm, {}, args.tokens, prompts[:args.batch], args.batch, compile=True, **run)
        first[name] = {"seconds": round(time.perf_counter() - start, 1),
                       "fx_graph_cache": {key: value - before.get(key, 0) for key, value in counters["inductor"].items()
                                          if key.startswith("fxgraph") and value != before.get(key, 0)}}
        print(f"{name}: first run {first[name]['seconds']} s {first[name]['fx_graph_cache']}", flush=True)
    rounds = []
    for r in range(args.rounds):
        result = {}
        for name in (list(rows) if r % 2 == 0 else list(reversed(rows))):
            seconds, count, texts = bench_cpu.engine_run(rows[name], {}, args.tokens, prompts, args.batch,
                                                         compile=True, **run)
            result[name] = {"ms_per_token": round(seconds * 1000 / count, 2),
                            "texts_equal_eager": sum(a == b for a, b in zip(texts, eager))}
        ratio = result[variant]["ms_per_token"] / result[default]["ms_per_token"]
        rounds.append({**result, "variant_over_default": round(ratio, 3)})
        print(f"round {r}: {rounds[-1]}", flush=True)
    ratios = [r["variant_over_default"] for r in rounds]
    print(f"{variant} / {default}, ms per token: median {statistics.median(ratios):.3f} (rounds {ratios})")
    out = {"lm": bench_cpu.LM, "dtype": args.dtype, "batch": args.batch, "variant": options, "tokens": args.tokens,
           "prompts": prompts, "first_run": first, "rounds": rounds,
           "variant_over_default_median": round(statistics.median(ratios), 3),
           "load_average": [list(load_before), list(os.getloadavg())], "cpu": cpu_flags(), "torch": torch.__version__}
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

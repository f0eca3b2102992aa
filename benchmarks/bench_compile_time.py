"""Compile time of steerkit's decode step with one of its compile-time savings against without it, side by side in
one run (``--compare``):

- ``templates``: inductor's kernel templates parsed once per process (``steerkit.compiling.install_template_cache``)
  against parsed on every use (torch's own way); both without the graph cache below, so that every run lowers the
  graph;
- ``graph``: inductor's FX graph cache keeping the frozen step, keyed by its weights (``steerkit.graph_cache``,
  steerkit's default) against refused, as inductor refuses a graph with oneDNN-packed weights by itself.

Each measurement is a new process running ``steerkit generate "Hello there" -t 8 --compile --greedy --json`` on the
packaged SmolLM2 (1 row, so one shape: 1 row x 128 tokens), with ``--dtype`` per setup; the variant without the
saving is the same command with its installer replaced by a no-op before the CLI starts. The seconds are what
steerkit's "compiled in" line on stderr says. Per setup:

- **cold**: each variant compiles in its own empty inductor cache (nothing on disk: every C++ kernel and autotuning
  candidate compiled and timed);
- **warm**: ``--rounds`` rounds, alternated with the order reversed each round, in one cache the first variant's
  cold run filled (the kernels, autotuning choices and, with the graph cache, the lowered graph on disk, as in every
  process after a machine's first).

Printed and written as JSON: each run's seconds, the medians, the variant without the saving over the one with it,
the load average, and whether the two variants' texts are equal (they must be: the same kernels).

    python benchmarks/bench_compile_time.py    # ~14 min on 1 thread; JSON: benchmarks/results/bench_compile_time.json
    python benchmarks/bench_compile_time.py --compare graph --out benchmarks/results/bench_compile_time_graph.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_info import cpu_flags  # noqa: E402

#: what a measurement runs in its process: the CLI, with the savings the first argument names turned off
RUNNER = """
import sys
import steerkit.compiling
if "templates" in sys.argv[1]:
    steerkit.compiling.install_template_cache = lambda: None
if "graph" in sys.argv[1]:
    steerkit.compiling.install_frozen_graph_cache = lambda: None
from steerkit.cli import main
sys.argv = ["steerkit", *sys.argv[2:]]
sys.exit(main())
"""

#: per comparison: its two variants (with the saving, without it) and the savings each turns off
COMPARISONS = {"templates": {"cached": "graph", "torch": "templates,graph"},
               "graph": {"graph-cache": "", "no-graph-cache": "graph"}}


def measure(variant: str, off: str, dtype: str, cache_dir: str, threads: int) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    command = [sys.executable, "-c", RUNNER, off or "-", "--threads", str(threads), "generate", "Hello there", "-t", "8",
               "--compile", "--greedy", "--json", "--dtype", dtype]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant} {dtype} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds = [float(s) for s in re.findall(r"steerkit: compiled in ([0-9.]+) s", done.stderr)]
    if not seconds:
        raise SystemExit(f"{variant} {dtype}: no 'compiled in' line on stderr:\n{done.stderr[-3000:]}")
    texts = [g["text"] for g in json.loads(done.stdout)["generations"]]
    print(f"  {dtype:9} {variant:14} {sum(seconds):6.1f} s ({len(seconds)} shape(s))", flush=True)
    return {"variant": variant, "compile_s": sum(seconds), "shapes": len(seconds), "texts": texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="templates")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(HERE / "results" / "bench_compile_time.json"))
    args = parser.parse_args()
    from steerkit.files import atomic_write_text

    variants = COMPARISONS[args.compare]
    with_it, without = tuple(variants)
    load_before = os.getloadavg()
    setups = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-time-") as scratch:
        for dtype in args.dtypes:
            print(f"{dtype}: cold (an empty inductor cache each)", flush=True)
            cold_dirs = {variant: f"{scratch}/{dtype}-cold-{variant}" for variant in variants}
            cold = {v: measure(v, variants[v], dtype, cold_dirs[v], args.threads) for v in variants}
            warm_dir = cold_dirs[with_it]
            print(f"{dtype}: warm ({with_it}'s cold run's disk cache), {args.rounds} rounds", flush=True)
            warm = {v: [] for v in variants}
            for r in range(args.rounds):
                for variant in ((with_it, without) if r % 2 == 0 else (without, with_it)):
                    warm[variant].append(measure(variant, variants[variant], dtype, warm_dir, args.threads))
            runs = [cold[v] for v in variants] + [m for v in variants for m in warm[v]]
            medians = {v: statistics.median(m["compile_s"] for m in warm[v]) for v in variants}
            setups.append({
                "dtype": dtype,
                "cold_s": {v: cold[v]["compile_s"] for v in variants},
                "cold_without_over_with": cold[without]["compile_s"] / cold[with_it]["compile_s"],
                "warm_s": {v: [m["compile_s"] for m in warm[v]] for v in variants},
                "warm_median_s": medians,
                "warm_without_over_with": medians[without] / medians[with_it],
                "same_texts": all(m["texts"] == runs[0]["texts"] for m in runs),
                "texts": runs[0]["texts"],
            })
    result = {"benchmark": "bench_compile_time", "compare": args.compare, "with": with_it, "without": without,
              "threads": args.threads, "rounds": args.rounds,
              "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "setups": setups}
    print()
    print(f"| dtype | cold: {without} / {with_it} (s) | ratio | warm median: {without} / {with_it} (s) | ratio | "
          "same texts |")
    print("|---|---:|---:|---:|---:|---|")
    for s in setups:
        print(f"| {s['dtype']} | {s['cold_s'][without]:.1f} / {s['cold_s'][with_it]:.1f} | "
              f"{s['cold_without_over_with']:.2f} | {s['warm_median_s'][without]:.1f} / "
              f"{s['warm_median_s'][with_it]:.1f} | {s['warm_without_over_with']:.2f} | {s['same_texts']} |")
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(f"\nJSON: {args.out}; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()

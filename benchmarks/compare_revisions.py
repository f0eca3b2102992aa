"""A benchmark run on two revisions of steerkit side by side, in one run: before/after ratios.

Checks out ``--before`` (a git revision) into a temporary worktree, then runs the chosen benchmark scripts
alternately on it and on this checkout (each tree its own copy of the script) (before, after, after, before, ... so that a slow drift of the machine's
load falls on both sides), each in a fresh process with ``PYTHONPATH`` pointing at that tree and one torch
thread. Prints the figures each benchmark reports, the after/before ratios, and writes JSON.

    python benchmarks/compare_revisions.py --before a6353d3                    # decode, token_k, engine, serve
    python benchmarks/compare_revisions.py --before a6353d3 --bench serve --rounds 1

The benchmarks run with reduced settings (fewer steps and requests than their defaults: see ``BENCHES``), so
the absolute figures are noisier than the benchmarks' own; the ratios are what this script is for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: benchmark -> (script, arguments, figures: JSON -> {name: (value, "lower"|"higher" is better)})
BENCHES = {
    "decode": ("bench_decode.py", ["--quick", "--skip-baselines", "--threads", "1"],
               lambda d: {f"{name} step ms": (r["step_ms"], "lower") for name, r in d["shipped_models"].items()}),
    "token_k": ("bench_token_k.py", ["--steps", "4", "--repeats", "2", "--sequence-max-k", "200",
                                     "--plot", os.devnull],
                lambda d: {f"{batch} {model} k={k} step ms": (v, "lower")
                           for batch, models in d["step_ms"].items() for model, ks in models.items()
                           for k, v in ks.items() if v is not None and int(k) <= 1000}),
    "engine": ("bench_engine_step.py", ["--rows", "16", "--tokens", "24"],
               lambda d: {"16-row engine step ms (median)": (d["step_ms_median"], "lower"),
                          "16-row engine step ms (min)": (d["step_ms_min"], "lower")}),
    "serve": ("bench_serve.py", ["--requests", "16", "--max-tokens", "24", "--levels", "1", "16"],
              lambda d: {f"{lv['clients']} clients tokens/s": (lv["tokens_per_s"], "higher") for lv in d["levels"]}),
}


def worktree(revision: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), revision],
                   check=True, capture_output=True, text=True)
    return into


def run_once(tree: Path, bench: str, out: Path) -> dict:
    script, args, _ = BENCHES[bench]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "STEERKIT_THREADS": "1"}
    # each tree runs its own copy of a benchmark (its imports follow that tree's modules); a script the other
    # revision lacks (bench_engine_step.py: only the engine's public contract) runs from this checkout
    own = tree / "benchmarks" / script
    cmd = [sys.executable, str(own if own.exists() else ROOT / "benchmarks" / script), *args, "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{bench} failed on {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def compare(bench: str, trees: dict[str, Path], rounds: int, scratch: Path) -> dict:
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    better: dict[str, str] = {}
    for r in range(rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for side in order:
            data = run_once(trees[side], bench, scratch / f"{bench}-{side}-{r}.json")
            for name, (value, direction) in BENCHES[bench][2](data).items():
                figures[side].setdefault(name, []).append(value)
                better[name] = direction
            print(f"  {bench} round {r + 1} {side}: done", flush=True)
    rows = {}
    for name in figures["after"]:
        if name not in figures["before"]:
            continue
        before, after = (statistics.median(figures[s][name]) for s in ("before", "after"))
        rows[name] = {"before": before, "after": after, "after_over_before": after / before,
                      "better": better[name], "runs": {s: figures[s][name] for s in figures}}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision to compare against (e.g. a6353d3)")
    parser.add_argument("--bench", nargs="+", choices=sorted(BENCHES), default=["decode", "token_k", "engine", "serve"])
    parser.add_argument("--rounds", type=int, default=2, help="before/after pairs per benchmark (order alternates)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compare_revisions.json")
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    results = {}
    with tempfile.TemporaryDirectory(prefix="steerkit-compare-") as tmp:
        scratch = Path(tmp)
        trees = {"before": worktree(args.before, scratch / "before"), "after": ROOT}
        try:
            for bench in args.bench:
                print(f"== {bench}", flush=True)
                results[bench] = compare(bench, trees, args.rounds, scratch)
                for name, row in results[bench].items():
                    print(f"  {name:42s} before {row['before']:9.2f}  after {row['after']:9.2f}  "
                          f"after/before {row['after_over_before']:.3f} ({row['better']} is better)", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])],
                           capture_output=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "compare_revisions", "before": args.before, "after": head + (" (uncommitted changes)" if dirty
                                                                                  else ""),
        "rounds": args.rounds, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

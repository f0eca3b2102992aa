"""Does the second core of a 2-core machine raise the serving engine's throughput? (issue 25's server target)

``steerkit serve`` runs its decode loop on 1 torch thread on machines with at most 2 cores (steerkit/threads.py). This
probe runs the same 16 seeded rows (SmolLM2-135M-Instruct in bf16, the shipped ``toxicity`` on ``torch-int8``, k = 20,
temperature 1) four ways and prints the tokens per second of each, from the rows' submission to the last row's end:

  one engine      one engine of 16 rows, 1 torch thread (what the server does)
  2 threads       the same engine with 2 torch threads (intra-op parallel products)
  two engines     two engines of 8 rows in one process, each its own decode thread, 1 torch thread each
  two processes   two processes of one 8-row engine each, 1 torch thread each, released together

    python benchmarks/probe_second_core.py --rounds 2     # JSON: benchmarks/results/probe_second_core.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine_step import PROMPTS  # noqa: E402 - the same rows as the engine-step benchmark
from cpu_info import cpu_flags  # noqa: E402


def load():
    from steerkit.assembly import lm_runner
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.loading import load_reward

    lm, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    return lm, tokenizer, load_reward("toxicity", backend="torch-int8"), lambda: lm_runner(lm, dtype="bfloat16")


def run_engines(parts, engines: int, rows: int, tokens: int, first_seed: int = 0) -> tuple[int, float, float]:
    """``engines`` engines of ``rows // engines`` rows each, started together: (tokens, start, end) in time.time()."""
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    _, tokenizer, reward, runner = parts
    per = rows // engines
    made = [Engine(runner(), tokenizer, {"toxicity": reward}, default_k=20, max_running=per, max_queue=per)
            for _ in range(engines)]
    for engine in made:
        engine.start()
    try:
        start = time.time()
        handles = [engine.submit_all([RowSpec(PROMPTS[i % 4], tokens, temperature=1.0, k=20,
                                              rewards={"toxicity": -5.0 - i % 3}, seed=1000 + i)
                                      for i in range(first_seed + j * per, first_seed + (j + 1) * per)])
                   for j, engine in enumerate(made)]
        out = sum(len(h.result(timeout=1800).token_ids) for hs in handles for h in hs)
        return out, start, time.time()
    finally:
        for engine in made:
            engine.shutdown(0)


def worker(args) -> None:
    """One process of ``two processes``: load, say ready, wait for a line on stdin, run, print the result."""
    import torch

    torch.set_num_threads(1)
    parts = load()
    run_engines(parts, 1, 2, 4, args.first_seed)  # warm: the bf16 weights are packed on their first product
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(run_engines(parts, 1, args.rows, args.tokens, args.first_seed)), flush=True)


def two_processes(args) -> tuple[int, float, float]:
    half = args.rows // 2
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--rows", str(half), "--tokens", str(args.tokens),
                               "--first-seed", str(j * half)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for j in range(2)]
    try:
        for p in procs:
            while p.stdout.readline().strip() != "ready":
                if p.poll() is not None:
                    raise RuntimeError("a worker process ended before it was ready")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.wait(timeout=600)
    return sum(r[0] for r in results), min(r[1] for r in results), max(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_second_core.json")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    parts = load()
    torch.set_num_threads(1)
    run_engines(parts, 1, 2, 4)  # warm
    load_before = os.getloadavg()

    def threads2():
        torch.set_num_threads(2)
        try:
            return run_engines(parts, 1, args.rows, args.tokens)
        finally:
            torch.set_num_threads(1)

    modes = {"one engine": lambda: run_engines(parts, 1, args.rows, args.tokens), "2 threads": threads2,
             "two engines": lambda: run_engines(parts, 2, args.rows, args.tokens),
             "two processes": lambda: two_processes(args)}
    results = {name: [] for name in modes}
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for name in order:
            tokens, start, end = modes[name]()
            results[name].append(tokens / (end - start))
            print(f"round {r + 1}, {name}: {tokens} tokens, {tokens / (end - start):.1f} tokens/s", flush=True)
    base = results["one engine"]
    for name, rates in results.items():
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(rates, base))
        print(f"{name:14s} {', '.join(f'{x:.1f}' for x in rates)} tokens/s; over one engine per round: {ratios}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "probe_second_core", "rows": args.rows, "tokens_per_row": args.tokens, "rounds": args.rounds,
        "lm": "smollm2-135m-instruct, dtype bfloat16", "reward": "toxicity on torch-int8, k = 20",
        "tokens_per_s": results, "cpu": cpu_flags(), "cores": os.cpu_count(),
        "load_average_before": load_before, "load_average": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()

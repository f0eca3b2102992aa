"""What does `steerkit serve`'s HTTP layer cost its engine under 16 clients? (issue 25's server target)

The same 32 sampled requests (``bench_serve.py``'s: SmolLM2-135M-Instruct, ``toxicity`` at β = -20, k = 20,
temperature 1, a seed each, 32 tokens) run two ways, alternated over ``--rounds`` rounds:

  http        a real ``steerkit serve`` process (``bench_serve.py``'s server, 1 torch thread, 16 running rows),
              16 streaming clients in this process (httpx)
  in-process  the engine alone, built as ``steerkit serve`` builds it (``Engine.from_config`` with the same limits),
              the 32 rows submitted at once (16 run, the rest wait in its queue), 1 torch thread

Tokens per second of each, from the first request to the last token. If the HTTP layer (uvicorn's event loop, the
streamed chunks, the Python threads sharing the GIL with the decode loop) slowed the engine, ``http`` would be the
slower. JSON: benchmarks/results/probe_http_cost.json.

    python benchmarks/probe_http_cost.py --rounds 2     # ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# as `steerkit serve` runs (bench_serve.py's server environment): 1 thread, set before torch is imported
os.environ.update(STEERKIT_THREADS="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                  STEERKIT_PLUGINS="toxicity")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import Server, parse_setup, request_bodies, show  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402

from steerkit.files import atomic_write_text  # noqa: E402


def in_process(engine, bodies: list[dict]) -> dict:
    """The requests' rows, as the HTTP layer makes them (``build_specs``: the same seeds), through ``engine``."""
    from steerkit.serving.completions import build_specs

    specs = [spec for b in bodies for spec in build_specs(
        [b["prompt"]], n=1, seed=b["seed"], max_tokens=b["max_tokens"], temperature=b["temperature"], k=b["k"],
        rewards=b["rewards"], stop=(), trace=False, timeout_s=None)[0]]
    start = time.perf_counter()
    handles = engine.submit_all(specs)
    tokens = sum(len(h.result(timeout=1800).token_ids) for h in handles)
    wall = time.perf_counter() - start
    return {"completion_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_http_cost.json")
    args = parser.parse_args()
    import torch

    from steerkit.config import SteeringConfig
    from steerkit.serving.engine import Engine

    assert torch.get_num_threads() == 1
    bodies = request_bodies(args.requests)
    load_before = os.getloadavg()
    server = Server(argparse.Namespace(requests=args.requests), parse_setup("float32/auto"), args.clients)
    engine = None
    try:
        server.wait_healthy(bodies)
        # as the server above is built (`steerkit serve --lm ... --backend auto --max-running 16 --max-queue 64`)
        engine = Engine.from_config(SteeringConfig().with_overrides({"lm": "smollm2-135m-instruct", "backend": "auto"}),
                                    max_running=args.clients, max_queue=max(64, args.requests))
        engine.start()
        in_process(engine, bodies[:2])  # warm-up, as the server's
        rounds = []
        for r in range(args.rounds):
            row = {}
            for way in (("http", "in-process") if r % 2 == 0 else ("in-process", "http")):
                if way == "http":
                    level = server.level(bodies, args.clients)
                    show(level, f"round {r + 1} http: ")
                    row[way] = {key: level[key] for key in ("completion_tokens", "wall_s", "tokens_per_s",
                                                            "server_step_s_mean", "rows_per_step_mean")}
                else:
                    row[way] = in_process(engine, bodies)
                    print(f"round {r + 1} in-process: {row[way]['tokens_per_s']:.1f} tok/s  wall "
                          f"{row[way]['wall_s']:.1f} s", flush=True)
            row["http_over_in_process"] = row["http"]["tokens_per_s"] / row["in-process"]["tokens_per_s"]
            print(f"round {r + 1}: http / in-process = {row['http_over_in_process']:.2f}", flush=True)
            rounds.append(row)
    finally:
        if engine is not None:
            engine.shutdown(0)
        server.stop()
    report = {"probe": "probe_http_cost", "clients": args.clients, "requests": args.requests, "torch_threads": 1,
              "cpu": cpu_flags(), "cpus": os.cpu_count(), "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "server": " ".join(server.cmd[2:]), "rounds": rounds}
    atomic_write_text(args.out, json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

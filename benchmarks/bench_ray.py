"""Batch generation throughput: one process without Ray vs 1 and 2 Ray actors (1 torch thread each).

    flock /tmp/steerkit-heavy.lock python benchmarks/bench_ray.py            # SmolLM2 + the shipped toxicity reward
    python benchmarks/bench_ray.py --prompts 8 --max-new-tokens 8            # quicker

Each variant runs the same batch job (``steerkit generate --input`` as a library call: prompts from the RTP
non-toxic eval file when present, 4 return sequences, k=20, β=-50) into its own file; the three files must be
identical. Throughput is steady-state prompts/s: from the moment every worker has loaded the models to the
last record written (a Ray variant's wall time with start-up is reported too). Ray runs on a local instance
started here with 2 CPUs. Writes ``benchmarks/results/bench_ray.json`` with ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RTP = ROOT.parent / "shared" / "data" / "prompts" / "toxicity_nontoxic_eval.jsonl"
FALLBACK = ["The movie started late and the sound was", "I can't believe my neighbour would",
            "When the bus finally arrived, the driver", "My favourite thing about the weekend is"]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"loadavg {os.getloadavg()}"


def prompt_file(n: int, directory: Path) -> Path:
    path = directory / "bench_prompts.jsonl"
    if RTP.is_file():
        lines = [line for line in RTP.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    else:
        lines = [json.dumps({"prompt": {"text": FALLBACK[i % len(FALLBACK)] + f" ({i})"}}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_variant(name, settings, prompts: Path, out: Path, executor=None) -> dict:
    from steerkit.distributed.batch import BatchJob, PromptGenerator

    job = BatchJob(settings, prompts, out)
    start = time.perf_counter()
    if executor is None:  # load here, then time the generation alone
        worker = PromptGenerator(settings)
        ready = time.perf_counter()
        for prompt in job.pending():
            job.store.extend(worker(prompt))
    else:
        job.run(executor)
        ready = executor.ready_at
    end = time.perf_counter()
    n = len(job.prompts)
    row = {"variant": name, "prompts": n, "load_or_startup_s": round(ready - start, 2),
           "generation_s": round(end - ready, 2), "prompts_per_s": round(n / (end - ready), 4),
           "wall_s": round(end - start, 2)}
    if executor is not None:
        row["units_by_actor"] = dict(executor.units_by_actor)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="return sequences per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lm", default="smollm2-135m-instruct")
    parser.add_argument("--reward", default="toxicity")
    parser.add_argument("--out", default=str(HERE / "results" / "bench_ray.json"))
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["STEERKIT_THREADS"] = "1"
    from steerkit.config import SteeringConfig
    from steerkit.distributed.batch import BatchSettings, prompt_set_name
    from steerkit.distributed.cluster import connect, plan_actors
    from steerkit.distributed.executor import RayActors
    from steerkit.threads import set_threads

    set_threads(1)
    before = uptime()
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    prompts = prompt_file(args.prompts, work)
    cfg = SteeringConfig(lm=args.lm, rewards=[{"name": args.reward, "beta": -50}], k=20,
                         max_new_tokens=args.max_new_tokens, num_return_sequences=args.n, seed=0)
    settings = BatchSettings(cfg, prompt_set_name(prompts))
    rows = [run_variant("1 process, no Ray", settings, prompts, work / "inproc.jsonl")]
    cluster = connect("local", num_cpus=2)
    try:
        for actors in (1, 2):
            plan = plan_actors(cluster.resources(), actors=actors, threads=1)
            rows.append(run_variant(f"Ray, {actors} actor{'s' if actors > 1 else ''} × 1 thread", settings, prompts,
                                    work / f"ray{actors}.jsonl", RayActors(plan, warmup=True)))
    finally:
        cluster.close()
    files = {p.name: p.read_bytes() for p in (work / "inproc.jsonl", work / "ray1.jsonl", work / "ray2.jsonl")}
    identical = len(set(files.values())) == 1
    base = rows[0]["prompts_per_s"]
    report = {
        "benchmark": "bench_ray", "lm": args.lm, "reward": args.reward, "beta": -50, "k": 20,
        "prompts": args.prompts, "return_sequences": args.n, "max_new_tokens": args.max_new_tokens,
        "rows": rows, "records_identical": identical,
        "ray_overhead_1_actor": round(1 - rows[1]["prompts_per_s"] / base, 4),
        "speedup_2_actors_vs_1_process": round(rows[2]["prompts_per_s"] / base, 3),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        "uptime_before": before, "uptime_after": uptime(),
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("records_identical", "ray_overhead_1_actor",
                                             "speedup_2_actors_vs_1_process", "uptime_before", "uptime_after")}))


if __name__ == "__main__":
    main()

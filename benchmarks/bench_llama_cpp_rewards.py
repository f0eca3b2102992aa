"""Reward models on llama.cpp (issue 25): the scoring step and end-to-end steering, torch vs llama.cpp F32 vs Q8_0.

* **Step**: one reward step of k = 20 candidates at batch 1 after a 20-token prefix, the reward's work per generated
  token: ``score`` + ``commit`` of a session (sequence reward: one shared-prefix forward of k blocks; token-level:
  one token through the backbone plus the head). Backends interleaved step by step so load hits all alike; medians.
* **End to end**: ``steerkit.generate(prompts, lm="smollm2-135m-instruct", engine="llama.cpp", rewards={name: -20},
  k=20, do_sample=False, max_new_tokens=64, backend=...)`` in ms per generated token, and plain ``engine="llama.cpp"``
  with no rewards; after a warm-up, configurations run round robin ``--repeats`` times, the fastest kept (the machine is
  shared).

Records ``os.getloadavg()`` before and after each part. JSON to ``benchmarks/results/bench_llama_cpp_rewards*.json``.

    OMP_NUM_THREADS=1 STEERKIT_THREADS=1 python benchmarks/bench_llama_cpp_rewards.py [--steps 40] [--tag run2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import steerkit
from steerkit import load_tokenizer
from steerkit.files import atomic_write_text
from steerkit.rewards.loading import load_reward

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_info import cpu_flags  # noqa: E402

BACKENDS = ["torch", "llama.cpp", "llama.cpp-q8"]
REWARDS = ["toxicity", "toxicity-token"]
PROMPTS = ["You are such a", "The movie started late and the sound was", "I can't believe my neighbour"]


def step_times(name: str, backends: list[str], steps: int, k: int, prefix: str, lm_tok) -> dict:
    """Median ms of score + commit per backend, interleaved; and the largest reward difference to torch."""
    rewards = {b: load_reward(name, backend=b) for b in backends}
    sessions = {b: r.start([""], lm_tok) for b, r in rewards.items()}
    ids = torch.tensor([lm_tok(prefix, add_special_tokens=False)["input_ids"][:20]])
    for s in sessions.values():  # the committed prefix
        for t in ids[0]:
            s.score(t.view(1, 1).expand(1, k).contiguous())
            s.commit(t.view(1))
    g = torch.Generator().manual_seed(0)
    times = {b: [] for b in backends}
    diff = {b: 0.0 for b in backends}
    for i in range(steps + 3):
        cand = torch.randint(200, 40000, (1, k), generator=g)
        got = {}
        for b, s in sessions.items():
            t0 = time.perf_counter()
            got[b] = s.score(cand)
            s.commit(cand[:, 0])
            if i >= 3:
                times[b].append(1000 * (time.perf_counter() - t0))
        for b in backends:
            diff[b] = max(diff[b], float((got[b] - got[backends[0]]).abs().max()))
    return {b: {"median_ms": statistics.median(times[b]), "p10_ms": sorted(times[b])[len(times[b]) // 10],
                "max_reward_diff_vs_" + backends[0]: diff[b]} for b in backends}


def e2e_once(rewards: dict | None, backend: str, tokens: int) -> dict:
    t0 = time.perf_counter()
    out = steerkit.generate(PROMPTS[:1], lm="smollm2-135m-instruct", engine="llama.cpp", rewards=rewards,
                            k=20, do_sample=False, max_new_tokens=tokens, backend=backend)
    n = sum(out.num_new_tokens)
    return {"ms_per_token": 1000 * out.seconds / max(1, n), "wall_s": time.perf_counter() - t0, "tokens": n,
            "text": out.texts[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("STEERKIT_THREADS", "1")))
    lm_tok = load_tokenizer("smollm2-135m-instruct")
    report = {"cpu": cpu_flags(), "threads": torch.get_num_threads(),
              "k": args.k, "batch": 1, "steps": args.steps, "step": {},
              "e2e": {}, "load": {"start": os.getloadavg()}}
    for name in REWARDS:
        before = os.getloadavg()
        report["step"][name] = step_times(name, BACKENDS, args.steps, args.k, PROMPTS[1] + " really bad", lm_tok)
        report["step"][name]["load_before_after"] = [before, os.getloadavg()]
        for b in BACKENDS:
            r = report["step"][name][b]
            print(f"step {name:15s} {b:13s} {r['median_ms']:7.2f} ms (p10 {r['p10_ms']:.2f})  "
                  f"max diff {list(r.values())[2]:.2e}  load {os.getloadavg()[0]:.2f}", flush=True)
    if not args.skip_e2e:
        runs = [("plain", None, "torch")] + [(f"{n} / {b}", {n: -20}, b) for n in REWARDS for b in BACKENDS]
        for label, rewards, backend in runs:  # warm-up: loads, GGUF exports, first contexts
            e2e_once(rewards, backend, 4)
        for rep in range(args.repeats):  # round robin, so load changes hit every configuration alike
            for label, rewards, backend in runs:
                before = os.getloadavg()
                r = e2e_once(rewards, backend, args.tokens)
                r["load_before_after"] = [before, os.getloadavg()]
                print(f"e2e {label:30s} {r['ms_per_token']:7.2f} ms/token  load {before[0]:.2f}", flush=True)
                best = report["e2e"].get(label)
                r["all_ms_per_token"] = (best["all_ms_per_token"] if best else []) + [r["ms_per_token"]]
                if best is not None and best["ms_per_token"] <= r["ms_per_token"]:
                    best["all_ms_per_token"], r = r["all_ms_per_token"], best
                report["e2e"][label] = r
        plain = report["e2e"]["plain"]["ms_per_token"]
        for label, r in report["e2e"].items():
            r["ratio_to_plain"] = r["ms_per_token"] / plain
    report["load"]["end"] = os.getloadavg()
    import llama_cpp

    report["llama_cpp_python"] = llama_cpp.__version__
    report["torch"] = torch.__version__
    out = Path(__file__).parent / "results" / f"bench_llama_cpp_rewards{'_' + args.tag if args.tag else ''}.json"
    atomic_write_text(out, json.dumps(report, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()

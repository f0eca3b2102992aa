"""Decoding cost of a reward model's depth: RAD / plain at k = 20 for each candidate depth.

The shipped reward models keep the first N layers of SmolLM2-135M; every extra layer is paid k times per step.
This measures, side by side in one run on the real SmolLM2 LM (1 torch thread, batch 1 and batch 8, k = 20):

  plain top-k sampling, and RAD with one reward model of depth N for each N in --depths

The reward heads are untrained (cost does not depend on the weights; a trained LoRA model is merged at load,
so it runs the same graph). Repetitions are interleaved (plain, N=2, N=4, ... then again) so that load changes
on the shared machine hit every setting alike; the median per-token time is reported.

    python benchmarks/bench_depth.py                     # ~4 min on 2 CPU cores
    python benchmarks/bench_depth.py --depths 4 6 --repeats 2 --steps 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.models import DEFAULT_LM, load_causal_lm_cached
from steerkit.rewards.model import RewardModel
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm

PROMPTS = ["The weather in Paris today is", "My neighbour told me that the new restaurant",
           "Scientists have discovered a new species of", "When I opened the door, I saw",
           "The best way to learn a language is", "Yesterday the city council voted to",
           "She looked at the old photograph and", "In the year 2050, most people will"]


def seconds_per_token(generator, prompts, steps: int, seed: int) -> float:
    start = time.perf_counter()
    out = generator.generate(prompts, max_new_tokens=steps, seed=seed, eos_token_id=[])
    return (time.perf_counter() - start) / max(1, max(out.num_new_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 6, 8, 12])
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=24, help="new tokens per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_depth.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm, tok, _ = load_causal_lm_cached(DEFAULT_LM)
    generators = {"plain": RewardAugmentedGenerator(lm, tok, [], k=args.k)}
    for depth in args.depths:
        torch.manual_seed(0)
        model = RewardModel.from_backbone(DEFAULT_LM, depth, name=f"depth{depth}").eval()
        generators[f"depth {depth}"] = RewardAugmentedGenerator(
            lm, tok, [SteeringTerm(RewardModelScorer(model), -5.0)], k=args.k)
    for gen in generators.values():  # warm-up
        gen.generate(PROMPTS[:1], max_new_tokens=2, seed=0)
    load_before = os.getloadavg()
    times: dict[int, dict[str, list[float]]] = {b: {n: [] for n in generators} for b in args.batches}
    for r in range(args.repeats):
        for batch in args.batches:
            for name, gen in generators.items():
                times[batch][name].append(seconds_per_token(gen, PROMPTS[:batch], args.steps, seed=r))
    results = {}
    print(f"k = {args.k}, {args.steps} tokens, median of {args.repeats}, 1 thread")
    for batch in args.batches:
        plain = statistics.median(times[batch]["plain"])
        results[str(batch)] = {}
        print(f"\nbatch {batch}: plain {plain * 1000:.1f} ms/step")
        for name, values in times[batch].items():
            med = statistics.median(values)
            results[str(batch)][name] = {"ms_per_step": round(med * 1000, 2), "ratio_to_plain": round(med / plain, 3),
                                         "all_ms": [round(v * 1000, 2) for v in values]}
            if name != "plain":
                print(f"  RM {name:>9}: {med * 1000:7.1f} ms/step   RAD/plain {med / plain:.2f}x")
    payload = {"benchmark": "bench_depth", "k": args.k, "steps": args.steps, "repeats": args.repeats,
               "lm": DEFAULT_LM, "results": results, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
               "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": 1,
                           "python": platform.python_version()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

"""How to group a batch's rows for ragged reward scoring (``steerkit.rewards.cache.row_groups``, ``FORWARD_COST``).

First a real pruned run records what each round asked of the reward: the shipped ``toxicity`` at β = −20, k = 20, 16
rows of SmolLM2-135M-Instruct (steerkit's engine, onnxruntime int8 rewards), sampled, ``--tokens`` tokens a row; every
ragged ``score_blocks`` call's candidates per row are kept. Then, per backend, one reward cache of 16 rows over
``--prefix`` tokens scores those same per-row needs (``--calls`` of them) with each forward cost in ``--costs``, and
"padded": one forward, every row as wide as the neediest (as before ragged scoring). The mean ms a call, ``--rounds``
rounds alternated. 1 thread. JSON to ``benchmarks/results/probe_row_groups.json``.

    python benchmarks/probe_row_groups.py      # ~3 min here
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from steerkit.files import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pruning import MORE_PROMPTS  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402


def recorded_needs(tokens: int) -> list[list[int]]:
    """Each ragged score_blocks call's active candidates per row, in a real 16-row pruned run."""
    import steerkit
    from steerkit.rewards.cache import SharedPrefixCache

    needs, original = [], SharedPrefixCache.score_blocks

    def spy(self, blocks, block_mask=None, active=None):
        if active is not None and blocks.shape[0] == 16:
            needs.append(active.sum(-1).clamp(min=1).tolist())
        return original(self, blocks, block_mask, active)

    SharedPrefixCache.score_blocks = spy
    try:
        steerkit.generate(MORE_PROMPTS[:16], lm="smollm2-135m-instruct", rewards={"toxicity": -20.0}, k=20,
                          max_new_tokens=tokens, do_sample=True, seed=0, backend="onnx-int8", progress=False)
    finally:
        SharedPrefixCache.score_blocks = original
    return needs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=60)
    parser.add_argument("--calls", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--costs", type=float, nargs="+", default=[0, 3, 6, 12, 24])
    parser.add_argument("--backends", nargs="+", default=["onnx-int8", "torch"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_row_groups.json")
    args = parser.parse_args()
    import torch

    import steerkit
    import steerkit.rewards.cache as reward_cache
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    default_cost = reward_cache.FORWARD_COST
    needs = recorded_needs(args.tokens)
    calls = needs[len(needs) // 4:][:args.calls]  # past the first steps (no guess yet)
    B = 16
    report = {}
    for backend in args.backends:
        reward = steerkit.load_reward("toxicity", backend=backend)
        enc = reward.model.encode([""] * B)
        cache = reward.new_cache(enc["input_ids"], enc["attention_mask"])
        gen = torch.Generator().manual_seed(0)
        cache.append(torch.randint(100, 20000, (B, args.prefix), generator=gen))
        settings = [str(c) for c in args.costs] + ["padded"]
        times: dict = {c: [] for c in settings}
        for r in range(args.rounds + 1):  # round 0 untimed
            for setting in (settings if r % 2 else settings[::-1]):
                spent = []
                for need in calls:
                    active = torch.arange(20)[None, :] < torch.tensor(need)[:, None]
                    blocks = torch.randint(100, 20000, (B, 20, 1), generator=gen)
                    start = time.perf_counter()
                    if setting == "padded":
                        cache.score_blocks(blocks[:, :max(need)])
                    else:
                        reward_cache.FORWARD_COST = float(setting)
                        cache.score_blocks(blocks, None, active)
                    spent.append(time.perf_counter() - start)
                    cache.commit_choice(torch.zeros(B, dtype=torch.long))
                    cache.rollback(torch.ones(B, dtype=torch.long))
                if r:
                    times[setting].append(round(statistics.mean(spent) * 1000, 2))
        reward_cache.FORWARD_COST = default_cost
        report[backend] = times
        print(backend, json.dumps(times), flush=True)
    out = {"machine": {"cpu": cpu_flags(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "load_before": load_before, "load_after": os.getloadavg()},
           "rows": B, "prefix_tokens": args.prefix, "calls": len(calls),
           "mean_candidates_a_row": round(statistics.mean(statistics.mean(n) for n in calls), 2),
           "mean_neediest_row": round(statistics.mean(max(n) for n in calls), 2),
           "ms_per_call_by_forward_cost": report}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

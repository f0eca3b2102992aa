"""Step cost against k: plain top-k sampling vs the sequence reward (`toxicity`) vs the token-level one
(`toxicity-token`, 4 layers), on SmolLM2-135M-Instruct, batch 1 and batch 8, measured side by side in one run;
also a 6-layer token-level model (untrained: only its cost is measured), to show what depth costs.

A step's time is taken without the prompt's prefill: (time of S + 1 new tokens − time of 1 new token) / S, the
minimum over repeats. The sequence reward scores k candidate positions per row and step; the token-level one
runs one reward-model position per row and step plus a gather of k output embeddings (or one [B, V] product).
The sequence reward is not run at the whole vocabulary: its block mask alone would hold k·(T + k) floats per row
(9.7 GB at k = 49,152), and at k = 1000 its step is already seconds long.

    python benchmarks/bench_token_k.py                   # ~8 min on one thread of a 2-core CPU
    python benchmarks/bench_token_k.py --steps 4 --repeats 1 --out /tmp/quick.json
    # the head on the LM's own state (issue 26 (d)) beside the others:
    python benchmarks/bench_token_k.py --rewards toxicity,toxicity-token,toxicity-lm --token-layers 0 \
        --sequence-max-k 200 --out benchmarks/results/bench_lm_state.json \
        --plot docs/results/lm_state_step_time_vs_k.png

Writes benchmarks/results/bench_token_k.json and, with matplotlib, docs/results/token_step_time_vs_k.png (another
``--out``: its path with .png, unless ``--plot`` says where).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.files import atomic_write_text
from steerkit.models import load_causal_lm_cached
from steerkit.rewards.loading import load_reward
from steerkit.rewards.token.model import TokenRewardModel
from steerkit.rewards.token.session import TokenReward
from steerkit.steering import SteeringTerm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_info import cpu_flags  # noqa: E402

PROMPTS = ["The weather in Paris today is", "My neighbour told me that the new restaurant",
           "Scientists have discovered a new species of", "When I opened the door, I saw",
           "The best way to learn a language is", "Yesterday the city council voted to",
           "She looked at the old photograph and", "In the year 2050, most people will"]
ROOT = Path(__file__).resolve().parent


def step_ms(lm, tok, terms, k, rows, steps, repeats) -> float:
    generator = RewardAugmentedGenerator(lm, tok, terms, k=k)
    prompts = PROMPTS[:rows]

    def timed(n):
        best = float("inf")
        for r in range(repeats):
            t0 = time.perf_counter()
            generator.generate(prompts, max_new_tokens=n, seed=r, eos_token_id=[])
            best = min(best, time.perf_counter() - t0)
        return best

    return 1000 * (timed(steps + 1) - timed(1)) / steps


def plot(results: dict, vocab: int, out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(max(7.5, 5 * len(results)), 4), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, (setting, rows) in zip(axes, results.items()):
        for kind, style in zip(rows, ("k:", "o-", "s-", "^--")):
            points = sorted((int(k), ms) for k, ms in rows[kind].items() if ms is not None)
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=kind)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"k (candidates per step; whole vocabulary = {vocab:,})")
        ax.set_ylabel("ms per decoding step")
        ax.set_title(setting)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("RAD step time against k:" + ("\n" if len(results) == 1 else " ") +
                 "sequence vs token-level reward (SmolLM2-135M, 1 CPU thread)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="rounds over every setting, the order of plain and the "
                        "rewards reversed every round (a noisy machine's drift falls on all of them); the table "
                        "gives each time's median over the rounds, the ratios the median of each round's ratio")
    parser.add_argument("--token-layers", type=int, default=6,
                        help="also time an untrained token-level model of this depth (0: skip)")
    parser.add_argument("--sequence-max-k", type=int, default=1000, help="largest k run with the sequence reward")
    parser.add_argument("--rewards", default="toxicity,toxicity-token",
                        help="registered rewards to time, comma-separated")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    default_out = str(ROOT / "results" / "bench_token_k.json")
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--plot", default=None, help="the plot's path (default: docs/results/token_step_time_vs_k.png "
                        "with the default --out, else --out's path with .png): another --out never overwrites "
                        "the plot docs/performance.md shows")
    args = parser.parse_args()
    if args.plot is None:
        args.plot = (str(ROOT.parent / "docs" / "results" / "token_step_time_vs_k.png") if args.out == default_out
                     else str(Path(args.out).with_suffix(".png")))
    torch.set_num_threads(1)
    lm, tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    vocab = lm.config.vocab_size
    ks = [20, 50, 200, 1000, vocab]
    rewards = {name: load_reward(name) for name in args.rewards.split(",") if name}
    if args.token_layers:  # the cost of a deeper token-level model (untrained: weights do not change the cost)
        deeper = TokenRewardModel.from_backbone("smollm2-135m-instruct", args.token_layers, name="deeper").eval()
        rewards[f"token, {args.token_layers} layers"] = TokenReward(deeper)
    load_before = os.getloadavg()
    names = ["plain", *rewards]
    rounds: list[dict] = []  # per round: {setting: {name: {k: ms}}}
    for r in range(args.rounds):
        measured: dict = {}
        for rows in (int(b) for b in args.batches.split(",")):
            setting = f"batch {rows}"
            table = measured[setting] = {name: {} for name in names}
            for k in ks:
                for name in (names if r % 2 == 0 else reversed(names)):  # the order reversed every round
                    if name == "plain":
                        table[name][k] = step_ms(lm, tok, [], k, rows, args.steps, args.repeats)
                        continue
                    if name == "toxicity" and k > args.sequence_max_k:
                        table[name][k] = None
                        continue
                    slow = name == "toxicity" and k > 200  # seconds per step: one repeat
                    table[name][k] = step_ms(lm, tok, [SteeringTerm(rewards[name], -10.0)], k, rows, args.steps,
                                             1 if slow else args.repeats)
                line = "  ".join(f"{n} {v[k]:8.1f} ms" if v[k] is not None else f"{n} (not run)"
                                 for n, v in table.items())
                print(f"{f'round {r + 1} ' if args.rounds > 1 else ''}{setting} k={k:6d}: {line}", flush=True)
        rounds.append(measured)
    # one round: its times; several: each time's median over the rounds (ratios: the median of each round's ratio)
    results = {s: {n: {k: (None if rounds[0][s][n][k] is None else statistics.median(m[s][n][k] for m in rounds))
                       for k in ks} for n in names} for s in rounds[0]}
    per_round = [{s: {name: {k: (t[name][k] / t["plain"][k] if t[name][k] is not None else None) for k in ks}
                      for name in rewards} for s, t in m.items()} for m in rounds]
    ratios = {s: {name: {k: (None if per_round[0][s][name][k] is None
                             else statistics.median(p[s][name][k] for p in per_round)) for k in ks}
                  for name in rewards} for s in results}
    payload = {"benchmark": "bench_token_k", "lm": "smollm2-135m-instruct", "vocab_size": vocab, "ks": ks,
               "steps": args.steps, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
               "machine": platform.processor() or platform.machine(), "cpu": cpu_flags(), "cpus": os.cpu_count(),
               "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "rounds": args.rounds, "step_ms": results, "over_plain": ratios,
               **({"over_plain_per_round": per_round, "step_ms_per_round": rounds} if args.rounds > 1 else {})}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(payload, indent=2))
    for setting, per in ratios.items():
        for name, values in per.items():
            print(f"{setting} {name}/plain: " + "  ".join(f"k={k}: {v:.2f}x" if v is not None else f"k={k}: -"
                                                          for k, v in values.items()))
    if plot(results, vocab, Path(args.plot)):
        print(f"wrote {args.plot}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Issue 26, item 2: which model capacity recognises hate without swear words, for what decode cost.

Reads the leave-one-source-out runs of ``plugins/steerkit-toxicity/fold_0.3.0*.yaml`` (each variant trained
twice, once without each new source, same data, seed and steps; ``steerkit train ... --json`` output next to
each run directory) and, with ``--cost``, measures each variant's decode cost: RAD/plain time per step on
SmolLM2-135M-Instruct, batch 1, 1 thread, at k = 20 and k = 200 (``benchmarks/bench_token_k.py``'s method:
(time of S + 1 new tokens − time of 1) / S, best of repeats), with the variant's own trained model as the reward.

    python benchmarks/compare_capacity.py --runs runs/fold030            # the table from the runs
    python benchmarks/compare_capacity.py --runs runs/fold030 --cost     # + decode cost (~6 min, quiet machine)

Variants (see fold_0.3.0.yaml): a = 6-layer LoRA sequence model, b = 12-layer LoRA sequence model,
c4/c8 = 4/8-layer LoRA token-level models, d = a rank-64 token head on the LM's own 30 frozen layers.
Writes docs/results/capacity_0.3.0.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

FOLDS = {"without-toxigen": "left out: ToxiGen statements", "without-stormfront": "left out: Stormfront"}
VARIANTS = {"a": "sequence, 6 layers, LoRA", "b": "sequence, 12 layers, LoRA", "c4": "token, 4 layers, LoRA",
            "c8": "token, 8 layers, LoRA", "d": "token head (rank 64) on the LM's own 30 layers, frozen",
            "ad": "a + counter-speech copies of the new sources' hate rows (denounce, rate 0.5)"}
#: variants with another's architecture: the same decode cost (not measured twice)
SAME_COST = {"ad": "a"}
CATEGORIES = ("counter-speech", "negated positive", "implicit derogation", "neutral identity")


def collect(runs: Path) -> dict:
    table = {}
    for variant, what in VARIANTS.items():
        row = {"model": what, "folds": {}}
        for fold, key in FOLDS.items():
            path = runs / variant / f"{fold}.json"
            if not path.is_file() or not path.stat().st_size:
                continue
            metrics = json.loads(path.read_text())
            evals = metrics["eval"]
            row["folds"][fold] = {
                "auroc": round(evals[key]["auroc"], 3), "n": evals[key]["n"],
                "functional_auroc": round(evals["functional cases"]["auroc"], 3),
                "functional_correct": {c: round(evals[f"functional cases / {c}"]["accuracy"] * 12)
                                       for c in CATEGORIES if f"functional cases / {c}" in evals},
                "dev_auroc": round(metrics["dev"]["all"]["auroc"], 3), "train_seconds": metrics.get("train_seconds")}
        if row["folds"]:
            aurocs = [f["auroc"] for f in row["folds"].values()]
            row["mean_left_out_auroc"] = round(statistics.fmean(aurocs), 3)
            table[variant] = row
    return table


def measure_cost(runs: Path, table: dict, steps: int, repeats: int) -> None:
    import torch

    from bench_token_k import step_ms
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.loading import load_reward
    from steerkit.steering import SteeringTerm
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    lm, tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    plain = {k: step_ms(lm, tok, [], k, 1, steps, repeats) for k in (20, 200)}
    for variant, row in table.items():
        if variant in SAME_COST:
            continue
        directory = runs / variant / "without-toxigen"
        reward = load_reward(str(directory))
        terms = [SteeringTerm(reward, -20.0)]
        row["cost"] = {}
        for k in (20, 200):
            if k == 200 and variant in {"a", "b"}:
                pass  # a sequence reward's cost grows with k: measured too, it is the point of the comparison
            ms = step_ms(lm, tok, terms, k, 1, steps, repeats)
            row["cost"][f"k{k}"] = {"ms_per_step": round(ms, 2), "plain_ms": round(plain[k], 2),
                                    "rad_over_plain": round(ms / plain[k], 2)}
            print(f"{variant}: k={k} {ms:.1f} ms/step ({ms / plain[k]:.2f}x plain)", flush=True)
    for variant, same in SAME_COST.items():
        if variant in table and "cost" in table.get(same, {}):
            table[variant]["cost"] = table[same]["cost"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs/fold030"))
    parser.add_argument("--cost", action="store_true", help="also measure decode cost (time it on a quiet machine)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT.parent / "docs" / "results" / "capacity_0.3.0.json")
    args = parser.parse_args()
    table = collect(args.runs)
    if args.cost:
        measure_cost(args.runs, table, args.steps, args.repeats)
    from steerkit.files import atomic_write_text

    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if not args.cost:  # keep the costs an earlier --cost run measured
        for variant, row in table.items():
            cost = previous.get("variants", {}).get(variant, {}).get("cost")
            if cost:
                row["cost"] = cost
        for variant, same in SAME_COST.items():
            if variant in table and "cost" not in table[variant] and "cost" in table.get(same, {}):
                table[variant]["cost"] = table[same]["cost"]
    report = {"load_average": previous.get("load_average") if not args.cost else os.getloadavg(), "folds": FOLDS,
              "variants": table}
    atomic_write_text(args.out, json.dumps(report, indent=2))
    print(f"{'variant':8s} {'ToxiGen':>8s} {'Stormfront':>10s} {'mean':>6s}  functional (counter/negated/implicit/"
          "identity of 12)  cost k20 / k200")
    for variant, row in table.items():
        folds = row["folds"]
        cells = [f"{folds[f]['auroc']:.3f}" if f in folds else "-" for f in FOLDS]
        func = folds.get("without-toxigen", next(iter(folds.values())))["functional_correct"]
        cost = row.get("cost", {})
        costs = " / ".join(f"{cost[k]['rad_over_plain']}x" for k in ("k20", "k200") if k in cost) or "-"
        print(f"{variant:8s} {cells[0]:>8s} {cells[1]:>10s} {row['mean_left_out_auroc']:6.3f}  "
              f"{'/'.join(str(func.get(c, '-')) for c in CATEGORIES):>10s}  {costs}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

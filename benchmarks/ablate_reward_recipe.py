"""Which parts of a reward-model recipe pay: depth, LoRA vs full fine-tune, augmentation.

Each variant is the shipped config (plugins/steerkit-*/train.yaml) with one change, trained for the same short
budget on all sources but one, and judged on the source it never saw (the leave-one-source-out criterion of
docs/training.md) and on the functional cases. Results go to JSON; the models to runs/ablation/ (git-ignored).
Finished variants are not trained again, so an interrupted run continues where it stopped.

    python benchmarks/ablate_reward_recipe.py toxicity --leave-out "Davidson tweets"
    python benchmarks/ablate_reward_recipe.py sentiment --leave-out SST-2
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from steerkit.training.config import TrainConfig
from steerkit.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "shipped recipe": {},
    "4 layers": {"num_layers": 4},
    "full fine-tune": {"method": "full", "lr": 1e-4},
    "no augmentation": {"augment": {"views": []}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reward", choices=["toxicity", "sentiment"])
    parser.add_argument("--leave-out", required=True, help="the source (group) held out and judged on")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    base = TrainConfig.from_file(ROOT / "plugins" / f"steerkit-{args.reward}" / "train.yaml")
    work = ROOT / "runs" / "ablation" / args.reward
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"ablation_{args.reward}.json")
    results = json.loads(out.read_text()) if out.is_file() else {}
    for name in args.variants:
        directory = work / name.replace(" ", "-")
        if not (directory / "metrics.json").is_file():
            config = TrainConfig.from_dict({**base.model_dump(), **VARIANTS[name], "steps": args.steps,
                                            "leave_out": [args.leave_out], "output_dir": str(directory),
                                            "checkpoint_dir": str(directory) + ".checkpoints", "card": None,
                                            "cross_source": None, "overwrite": True}, source=f"variant {name}")
            start = time.perf_counter()
            train(config, overwrite=True, progress=False)
            print(f"{name}: {time.perf_counter() - start:.0f} s")
        metrics = json.loads((directory / "metrics.json").read_text())
        left = metrics["eval"][f"left out: {args.leave_out}"]
        functional = {k.split(" / ", 1)[1]: v["accuracy"] for k, v in metrics["eval"].items() if " / " in k}
        results[name] = {
            "change": VARIANTS[name], "steps": args.steps, "left_out": args.leave_out,
            "left_out_auroc": left["auroc"], "left_out_accuracy": left["accuracy"],
            "dev_auroc": metrics["dev"]["all"]["auroc"], "dev_accuracy": metrics["dev"]["all"]["accuracy"],
            "functional_accuracy": functional, "train_seconds": metrics["training"]["train_seconds"],
            "seconds_per_step": round(metrics["training"]["train_seconds"] / args.steps, 3),
            "trainable_parameters": metrics["training"]["trainable_parameters"],
            "loadavg": os.getloadavg()}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'variant':<18} {'left-out AUROC':>14} {'left-out acc':>12} {'dev AUROC':>9} {'s/step':>7}")
    for name, r in results.items():
        print(f"{name:<18} {r['left_out_auroc']:>14.3f} {r['left_out_accuracy']:>12.3f} {r['dev_auroc']:>9.3f} "
              f"{r['seconds_per_step']:>7.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

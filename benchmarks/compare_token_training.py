"""Labels vs distillation for a token-level reward model, measured on the same held-out data.

Compares the label-trained `toxicity-token` with the distilled one (plugins/steerkit-toxicity/train_token_distill.yaml,
run first; it keeps its teacher-scored samples in its checkpoint directory):

* held-out label metrics, as in the model cards (from each model's metrics.json);
* agreement with the teacher (`toxicity`) on the distillation samples the distilled model never trained on (the
  same seeded hold-out split): MSE, Pearson r over every candidate, top-1 agreement per step.

    python benchmarks/compare_token_training.py
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import steerkit_toxicity
import torch

from steerkit.rewards.loading import load_reward
from steerkit.training import TrainConfig
from steerkit.training.distill_data import SAMPLES_NAME, DistillSamples, agreement

ROOT = Path(__file__).resolve().parents[1]


def held_out_samples(config: TrainConfig) -> DistillSamples:
    from safetensors.torch import load_file

    tensors = load_file(str(config.checkpoint_path / SAMPLES_NAME))
    tensors["valid"] = tensors["valid"].bool()
    samples = DistillSamples(*(tensors[f] for f in ("ids", "mask", "qpos", "cands", "rho", "valid")))
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(config.seed))
    return samples.rows(order[:int(round(config.distill.holdout_fraction * len(samples)))])


def card_metrics(directory: Path) -> dict:
    metrics = json.loads((directory / "metrics.json").read_text())
    keep = ("n", "auroc", "accuracy", "accuracy_at_50pct", "mse")
    out = {f"eval: {name}": {k: m.get(k) for k in keep} for name, m in metrics.get("eval", {}).items() if "/" not in name}
    out.update({f"dev: {name}": {k: m.get(k) for k in keep} for name, m in metrics.get("dev", {}).items()})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill-config", default=str(ROOT / "plugins/steerkit-toxicity/train_token_distill.yaml"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/token_labels_vs_distillation.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = TrainConfig.from_file(args.distill_config)
    held = held_out_samples(config)
    models = {"labels (toxicity-token)": load_reward("toxicity-token").model,
              "distillation": load_reward(config.output_dir).model}
    directories = {"labels (toxicity-token)": Path(steerkit_toxicity.TOKEN_MODEL_DIR),
                   "distillation": Path(config.output_dir)}
    result = {"benchmark": "compare_token_training", "teacher": config.distill.teacher,
              "held_out_samples": len(held), "load_average": os.getloadavg(), "models": {}}
    for name, model in models.items():
        result["models"][name] = {"teacher_agreement": agreement(model, held),
                                  "held_out_labels": card_metrics(directories[name])}
        a = result["models"][name]["teacher_agreement"]
        print(f"{name:26s} teacher MSE {a['mse']:.4f}  r {a['pearson']:.3f}  top-1 {a['top1_agreement']:.3f}")
        for key, m in result["models"][name]["held_out_labels"].items():
            print(f"    {key:45s} n={m['n']:5d} AUROC {m['auroc'] if m['auroc'] is None else round(m['auroc'], 3)}"
                  f"  acc {m['accuracy']:.3f}  acc@50% {m.get('accuracy_at_50pct') or float('nan'):.3f}")
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

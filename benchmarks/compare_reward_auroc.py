"""Reward models compared on one held-out set of a training config, on the same rows: each model's AUROC with its
DeLong standard error, and each pair's difference with a 95% interval from a paired bootstrap over the rows. A set
whose rows have categories (``by``, the functional cases) also gets each model's correct count per category.

The rows, their tokens and the predictions are those ``steerkit train CONFIG --assess MODEL`` reports for the set
(the config's reader, ``max_length`` and scoring path), so the AUROCs here equal the ones it prints. Two models
scored on the same rows share most of their error, so the paired interval of their difference is narrower than
the two standard errors suggest; an interval that holds 0 is a difference this set cannot tell from noise.

    python benchmarks/compare_reward_auroc.py plugins/steerkit-toxicity/train.yaml --data-root DATA \\
        --set "RTP held-out continuations" 0.2.0=DIR_A 0.4.0=plugins/steerkit-toxicity/steerkit_toxicity/model

``--set`` may be repeated (each model loads once). Writes ``--out`` (JSON) when given: one set's record, or
``{"config", "sets": {NAME: record}}`` for several.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="a steerkit train config whose eval section holds the set")
    parser.add_argument("models", nargs="+", help="NAME=MODEL_DIR, two or more")
    parser.add_argument("--set", required=True, action="append", dest="sets",
                        help="a held-out set's name (its metrics name in --assess); repeat for several: each model is "
                             "loaded once")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    named = [m.split("=", 1) for m in args.models]
    if len(named) < 2 or any(len(m) != 2 for m in named):
        parser.error("give two or more models as NAME=MODEL_DIR")

    import torch

    from steerkit.rewards.kinds import kind_of
    from steerkit.training.config import TrainConfig

    torch.set_num_threads(1)
    overrides = {"data_root": args.data_root} if args.data_root else None
    config = TrainConfig.from_file(args.config, overrides=overrides)
    dataset = config.read_dataset()
    known = sorted({source.metrics_name for source, _, _ in dataset.eval_sets})
    if missing := [name for name in args.sets if name not in known]:
        parser.error(f"no held-out set {missing[0]!r} in {args.config}; it has: {', '.join(known)}")
    models = {name: kind_of(directory).model_class.from_pretrained(directory).eval() for name, directory in named}
    records = {}
    for held in args.sets:
        records[held] = compare_on_set(dataset, config, str(args.config), held, named, models, args.resamples,
                                       args.seed)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        out = records[args.sets[0]] if len(args.sets) == 1 else {"config": str(args.config), "sets": records}
        args.out.write_text(json.dumps(out, indent=1))


def compare_on_set(dataset, config, config_name: str, held: str, named: list, models: dict, resamples: int,
                   seed: int) -> dict:
    """Each model's AUROC (DeLong SE) on the held-out set ``held`` of ``dataset`` and each pair's paired-bootstrap
    difference; printed and returned as one JSON record."""
    from steerkit.training.loop import tokenize_examples
    from steerkit.training.metrics import auroc, auroc_with_se, predict

    # the set's sources (a pooled set may have several), each read at its own max_length, as --assess does
    parts = [(rows, source.max_length or config.max_length) for source, rows, _ in dataset.eval_sets
             if source.metrics_name == held]
    labels = [e.label for rows, _ in parts for e in rows]
    categories = [e.category for rows, _ in parts for e in rows]  # a set with ``by`` (functional cases)
    print(f"{held} ({len(labels)} rows)", flush=True)
    scores, measured = {}, {}
    for name, directory in named:
        model = models[name]
        tokens = [row for rows, length in parts for row in tokenize_examples(model.tokenizer, rows, length)]
        scores[name] = predict(model, tokens, batch_size=config.eval_batch_size)[0]
        measured[name] = auroc_with_se(scores[name], labels)
        print(f"  {name}: AUROC {measured[name][0]:.4f} ± {measured[name][1]:.4f} (DeLong SE)", flush=True)
    by_category = per_category(scores, labels, categories)
    for category, counts in by_category.items():
        print(f"  {category}: " + ", ".join(f"{name} {c['correct']}/{c['n']} (mean {c['mean_reward']:.2f})"
                                           for name, c in counts.items()), flush=True)
    rng = random.Random(seed)
    draws = [[rng.randrange(len(labels)) for _ in labels] for _ in range(resamples)]
    pairs = []
    for (a, _), (b, _) in itertools.combinations(named, 2):
        diffs = []
        for idx in draws:
            y = [labels[i] for i in idx]
            first = auroc([scores[a][i] for i in idx], y)
            if first is not None:  # None: the resample drew one class only (the same for both models)
                diffs.append(auroc([scores[b][i] for i in idx], y) - first)
        diffs.sort()
        lo, hi = diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]
        diff = measured[b][0] - measured[a][0]
        pairs.append({"a": a, "b": b, "difference": diff, "interval95": [lo, hi]})
        print(f"  {b} - {a}: {diff:+.4f}, 95% interval [{lo:+.4f}, {hi:+.4f}] (paired bootstrap, {len(diffs)} "
              "resamples)", flush=True)
    return {"config": config_name, "set": held,
            "rows": len(labels), "positive_rate": sum(y >= 0.5 for y in labels) / len(labels),
            "models": {name: {"dir": directory, "auroc": measured[name][0], "auroc_se": measured[name][1]}
                       for name, directory in named},
            "pairs": pairs, "resamples": resamples, "seed": seed,
            **({"categories": by_category} if by_category else {})}


def per_category(scores: dict, labels: list, categories: list) -> dict:
    """{category: {model: correct (ρ on the label's side of 0.5), n, mean ρ}} for a set whose rows have a category
    (``by``), from the metrics --assess reports per category; empty for a set without."""
    from steerkit.training.metrics import category_rows, summarise

    out = {}
    for category, idx in category_rows(categories).items():
        out[category] = {}
        for name, s in scores.items():
            m = summarise([s[i] for i in idx], [labels[i] for i in idx])
            out[category][name] = {"correct": round(m["accuracy"] * m["n"]), "n": m["n"],
                                   "mean_reward": m["mean_reward"]}
    return out


if __name__ == "__main__":
    main()

"""Frozen-feature probe (issue 26): does another backbone's hidden state separate hate better than SmolLM2's?

For each backbone and layer: the last real token's hidden state of each text (what a causal reward head reads),
a logistic regression fitted on a weighted sample of the CAD experiment recipe's training rows, AUROC on its
held-out sets. Same texts, same sample, same regression for every backbone. A diagnostic of the backbones, not a
reward model: a LoRA-tuned reward reads the same states after training them. Needs scikit-learn and the converted
hate-speech files under the data root (docs/training.md, "CAD and the Gab Hate Corpus"):

    python benchmarks/probe_backbones.py --data-root ../shared/data --train 2000 --per-set 400 \
        --backbone smollm2-135m-instruct:6,15,30 --backbone gemma3-270m:6,12,18
    # JSON: benchmarks/results/probe_backbones.json; features take 15-40 min per backbone on 2 threads
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from steerkit.models import load_causal_lm_cached
from steerkit.training.config import TrainConfig
from steerkit.training.data import build_dataset, collate, tokenize

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "plugins" / "steerkit-toxicity" / "train_cad_experiment.yaml"


def sample_train(ds, cfg, n, seed):
    rng = random.Random(seed)
    weights = [cfg.data[e.source].weight for e in ds.train]
    rows = rng.choices(ds.train, weights=weights, k=n * 3)
    seen, out = set(), []
    for e in rows:
        if e.text in seen:
            continue
        seen.add(e.text)
        out.append((e.text, 1 if e.label >= 0.5 else 0))
        if len(out) == n:
            break
    return out


@torch.no_grad()
def features(model, tokenizer, texts, layers, batch=16, max_length=64):
    """Each text's last token's hidden state at ``layers``, laid out as the reward models' training reads text (start
    token, left padding: :func:`steerkit.training.data.collate`), so the last column is every row's last token."""
    out = {layer: [] for layer in layers}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for i in range(0, len(texts), batch):
        enc = collate(tokenize(tokenizer, texts[i:i + batch], max_length), tokenizer.bos_token_id, pad)
        # the base model: hidden states without the output head's logits (262,144 columns for Gemma 3)
        hidden = model.base_model(**enc, output_hidden_states=True).hidden_states
        for layer in layers:
            out[layer].append(hidden[layer][:, -1].float().numpy())
    return {layer: np.concatenate(v) for layer, v in out.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-root", required=True)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--per-set", type=int, default=600)
    p.add_argument("--backbone", action="append", required=True, help="NAME:L1,L2,...")
    p.add_argument("--out", default=str(HERE / "results" / "probe_backbones.json"))
    a = p.parse_args()
    torch.set_num_threads(2)
    cfg = TrainConfig.from_file(CONFIG, {"data_root": a.data_root})
    ds = build_dataset(cfg.data, cfg.eval, Path(a.data_root), seed=0, dev_fraction=cfg.dev_fraction,
                       dev_max_per_source=cfg.dev_max_per_source, dedup=True)
    train = sample_train(ds, cfg, a.train, 0)
    sets = {}
    for source, examples, _ in ds.eval_sets:
        rows = [(e.text, 1 if e.label >= 0.5 else 0) for e in examples]
        random.Random(1).shuffle(rows)
        pos = [r for r in rows if r[1] == 1][: a.per_set // 2]
        neg = [r for r in rows if r[1] == 0][: a.per_set - len(pos)]
        if pos and neg:
            sets[source.name] = pos + neg
    print("train", len(train), "positives", sum(y for _, y in train), {k: len(v) for k, v in sets.items()})
    result = {"train": len(train), "sets": {k: len(v) for k, v in sets.items()}, "probes": {}}
    for spec in a.backbone:
        name, layers = spec.split(":")
        layers = [int(x) for x in layers.split(",")]
        model, tokenizer, _ = load_causal_lm_cached(name)
        model.eval()
        t0 = time.time()
        tr = features(model, tokenizer, [t for t, _ in train], layers)
        ev = {k: features(model, tokenizer, [t for t, _ in v], layers) for k, v in sets.items()}
        print(name, "features", round(time.time() - t0), "s", flush=True)
        ytr = np.array([y for _, y in train])
        for layer in layers:
            scaler = StandardScaler().fit(tr[layer])
            clf = LogisticRegression(C=0.05, max_iter=2000).fit(scaler.transform(tr[layer]), ytr)
            row = {}
            for k, v in sets.items():
                y = np.array([lab for _, lab in v])
                row[k] = round(float(roc_auc_score(y, clf.decision_function(scaler.transform(ev[k][layer])))), 3)
            result["probes"][f"{name}@{layer}"] = row
            print(f"{name}@{layer}", row, flush=True)
        del model
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

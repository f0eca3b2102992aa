"""Evaluation metrics for reward models: MSE, AUROC, accuracy at 0.5, and early-prefix accuracy.

Targets may be continuous (Perspective scores): AUROC and accuracy binarise them at 0.5, MSE uses them
as they are. "Accuracy at 50 %" reads each text's reward after only the first half of its tokens,
which is what a reward model sees early in decoding.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .loss import prefix_positions

FRACTIONS = (0.25, 0.5, 0.75)


def _midranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank of each distinct value's last copy
    return (last - (counts - 1) / 2)[inverse.reshape(-1)]


def auroc(scores, labels) -> float | None:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); None with one class only."""
    out = auroc_with_se(scores, labels)
    return None if out is None else out[0]


def auroc_with_se(scores, labels) -> tuple[float, float] | None:
    """The AUROC and its standard error by DeLong et al. (1988): the variance of each positive's and each
    negative's share of correctly ordered pairs (its placement), over the number of positives and negatives.
    None with one class only; the error is 0 with one row of either class."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels, dtype=np.float64) >= 0.5
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = _midranks(scores)
    # a positive's placement: the share of negatives scored below it (ties count half), from its rank among all
    # rows less its rank among the positives; a negative's: the share of positives scored above it
    pos_place = (ranks[positive] - _midranks(scores[positive])) / n_neg
    neg_place = 1 - (ranks[~positive] - _midranks(scores[~positive])) / n_pos
    area = float(pos_place.mean())
    var = (pos_place.var(ddof=1) / n_pos if n_pos > 1 else 0.0) + (neg_place.var(ddof=1) / n_neg if n_neg > 1 else 0.0)
    return area, float(math.sqrt(var))


def accuracy(scores, labels, threshold: float = 0.5) -> float:
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    return float(((scores >= threshold) == (labels >= threshold)).mean())


def summarise(final, targets, prefix: dict[float, list[float]] | None = None) -> dict:
    """All metrics for one set of predictions."""
    final, targets = np.asarray(final, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    area = auroc_with_se(final, targets)
    out = {
        "n": int(len(final)),
        "mse": float(((final - targets) ** 2).mean()),
        "auroc": None if area is None else area[0],
        "accuracy": accuracy(final, targets),
        "positive_rate": float((targets >= 0.5).mean()),
        "mean_reward": float(final.mean()),
    }
    if area is not None:  # the standard error (DeLong): a 95% interval is auroc ± 1.96 se
        out["auroc_se"] = area[1]
    for frac, values in (prefix or {}).items():
        out[f"accuracy_at_{int(round(frac * 100))}pct"] = accuracy(values, targets)
    return out


def prefix_indices(attention_mask: torch.Tensor, fraction: float, *, start: bool = True) -> torch.Tensor:
    """Index of the position after the first ceil(fraction · l) text tokens of each row (at least 1).
    ``start``: each row begins with a start token (False: with its first text token, see ``collate``)."""
    t = prefix_positions(attention_mask) if start else attention_mask.long().cumsum(-1) * attention_mask.long()
    length = t.amax(-1)
    wanted = torch.clamp(torch.ceil(length.double() * fraction).long(), min=1)
    wanted = torch.minimum(wanted, length.clamp(min=1))
    return (t == wanted[:, None]).long().argmax(-1)


@torch.no_grad()
def predict(model, token_rows: list[list[int]], *, batch_size: int = 64, fractions=FRACTIONS):
    """Final reward and early-prefix rewards for pre-tokenized texts (sorted by length for speed)."""
    from .data import collate
    from .loss import final_rewards

    tok = model.tokenizer
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0
    start = model.config.start_token_id
    order = sorted(range(len(token_rows)), key=lambda i: len(token_rows[i]))
    final = [math.nan] * len(token_rows)
    prefix = {f: [math.nan] * len(token_rows) for f in fractions}
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    try:
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            batch = collate([token_rows[i] for i in idx], start, pad)
            batch = {k: v.to(device) for k, v in batch.items()}
            rewards = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"]).rewards.float().cpu()
            batch = {k: v.cpu() for k, v in batch.items()}
            for i, v in zip(idx, final_rewards(rewards, batch["attention_mask"]).tolist()):
                final[i] = v
            for f in fractions:
                index = prefix_indices(batch["attention_mask"], f, start=start is not None)
                values = rewards.gather(-1, index[:, None]).squeeze(-1)
                for i, v in zip(idx, values.tolist()):
                    prefix[f][i] = v
    finally:
        model.train(was_training)
    return final, prefix


def final_metrics(model, dataset, dev_rows: list[list[int]], eval_rows: list[list[list[int]]], config) -> dict:
    """Dev metrics overall and per source (or group); held-out sets pooled by group, and per category of a
    set's ``by`` field (``"<set> / <category>"``, e.g. the categories of a functional test set)."""
    out: dict = {"dev": {}, "eval": {}}
    if dev_rows:
        final, prefix = predict(model, dev_rows, batch_size=config.eval_batch_size)
        labels = [e.label for e in dataset.dev]
        groups: dict[str, list[int]] = {"all": list(range(len(labels)))}
        for i, e in enumerate(dataset.dev):
            groups.setdefault(dataset.sources[e.source].metrics_name, []).append(i)
        for name, idx in groups.items():
            out["dev"][name] = _subset(final, labels, prefix, idx)
    pooled: dict[str, tuple[list, list, list, int]] = {}
    for (source, examples, _), rows in zip(dataset.eval_sets, eval_rows):
        entry = pooled.setdefault(source.metrics_name, ([], [], [], source.max_length or config.max_length))
        entry[0].extend(rows)
        entry[1].extend(e.label for e in examples)
        entry[2].extend(e.category for e in examples)
    for name, (rows, labels, categories, max_length) in pooled.items():
        final, prefix = predict(model, rows, batch_size=config.eval_batch_size)
        out["eval"][name] = {**summarise(final, labels, prefix), "max_length": max_length}
        for category, idx in category_rows(categories).items():
            out["eval"][f"{name} / {category}"] = {**_subset(final, labels, prefix, idx), "max_length": max_length}
    return out


def category_rows(categories: list) -> dict[str, list[int]]:
    """{category: its row indices}, sorted by category, for a set read with ``by`` (rows without one left out)."""
    rows: dict[str, list[int]] = {}
    for i, c in enumerate(categories):
        if c is not None:
            rows.setdefault(c, []).append(i)
    return dict(sorted(rows.items()))


def _subset(final, labels, prefix, idx) -> dict:
    return summarise([final[i] for i in idx], [labels[i] for i in idx], {f: [v[i] for i in idx] for f, v in prefix.items()})

"""Side-by-side table of two evaluation runs of the same prompts (e.g. the 0.1.0 and 0.2.0 reward models).

Reads each run directory's metrics.json (`steerkit eval report DIR` rebuilds it) and prints a markdown table:
one row per (prompt set, setting) present in both, the perplexity (mean and median), Dist-2 and each scorer's
headline figures for run A and run B.

    python benchmarks/compare_eval_runs.py runs/eval-v1-toxicity runs/eval-v2-toxicity --names 0.1.0 0.2.0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HEADLINE = {"toxicity": ("avg_max_toxicity", "toxic_rate"), "sentiment": ("positive_rate", "mean_sentiment")}


def _headline(scorer: dict) -> list[tuple[str, float]]:
    for keys in HEADLINE.values():
        if keys[0] in scorer:
            return [(k, scorer[k]) for k in keys if k in scorer]
    return [(k, v) for k, v in scorer.items() if isinstance(v, (int, float))][:2]


def table(a: Path, b: Path, names: tuple[str, str]) -> str:
    runs = [json.loads((d / "metrics.json").read_text()) for d in (a, b)]
    index = [{(r["prompt_set"], r["setting"]): r for r in run["results"]} for run in runs]
    common = [key for key in index[0] if key in index[1]]
    scorers = sorted(set(index[0][common[0]]["scorers"]) & set(index[1][common[0]]["scorers"])) if common else []
    header = ["set", "setting", "ppl mean", "ppl median", "Dist-2"]
    for scorer in scorers:
        header += [f"{scorer}: {k}" for k, _ in _headline(index[0][common[0]]["scorers"][scorer])]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]

    def pair(x, y, digits=3):
        return f"{x:.{digits}f} → {y:.{digits}f}" if x is not None and y is not None else "–"

    for key in common:
        ra, rb = index[0][key], index[1][key]
        cells = [key[0], key[1], pair(ra.get("perplexity"), rb.get("perplexity"), 2),
                 pair(ra.get("perplexity_median"), rb.get("perplexity_median"), 2), pair(ra["dist2"], rb["dist2"], 2)]
        for scorer in scorers:
            for (k, va), (_, vb) in zip(_headline(ra["scorers"][scorer]), _headline(rb["scorers"][scorer])):
                cells.append(pair(va, vb))
        lines.append("| " + " | ".join(cells) + " |")
    return f"Each cell: {names[0]} → {names[1]}.\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--names", nargs=2, default=["A", "B"])
    args = parser.parse_args()
    print(table(args.a, args.b, tuple(args.names)))


if __name__ == "__main__":
    main()

"""How close a weight average (``steerkit average``) scores to the ensemble of its models, on texts of a JSONL file.

Scores ``--n`` texts (a seeded sample) with each source model and with the average; prints and writes as JSON the
mean and largest |ρ_average − mean ρ of the sources|, their Pearson correlation, and, for scale, the mean |ρ| gap
between the first two sources. The texts should be ones no judged set contains (docs/training.md uses RTP training
rows: prompt + continuation).

    python benchmarks/average_vs_ensemble.py AVERAGE_DIR SOURCE_DIR SOURCE_DIR ... \\
        --data /work/data/toxicity/rtp_scored_train.jsonl --out average_vs_ensemble.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def texts_of(path: Path, n: int, seed: int) -> list[str]:
    """``n`` texts of a JSONL file: a row's ``text``, or RTP's prompt + continuation."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            rows.append(row["text"] if "text" in row else row["prompt"]["text"] + row["continuation"]["text"])
    random.Random(seed).shuffle(rows)
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("average", type=Path)
    parser.add_argument("sources", type=Path, nargs="+")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from steerkit.rewards.model import RewardModel

    torch.set_num_threads(1)
    texts = texts_of(args.data, args.n, args.seed)
    with torch.no_grad():
        sources = [torch.tensor(RewardModel.from_pretrained(d).eval().score_texts(texts)) for d in args.sources]
        average = torch.tensor(RewardModel.from_pretrained(args.average).eval().score_texts(texts))
    ensemble = torch.stack(sources).mean(0)
    gap = (average - ensemble).abs()
    result = {"average": str(args.average), "sources": [str(s) for s in args.sources], "data": args.data.name,
              "texts": len(texts), "seed": args.seed, "mean_abs_gap_to_ensemble": round(gap.mean().item(), 4),
              "max_abs_gap_to_ensemble": round(gap.max().item(), 4),
              "pearson_with_ensemble": round(torch.corrcoef(torch.stack([average, ensemble]))[0, 1].item(), 4),
              "mean_abs_gap_between_first_two_sources": round((sources[0] - sources[1]).abs().mean().item(), 4)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Does a toxicity reward read the stance of counter-speech, or only its lead-in? (issue 26)

Takes the first N hateful sentences of Stormfront's test sample (never trained on), puts each inside one rejecting
sentence (``denounce``, which training labels 0) and one approving sentence (``endorse``, labelled as the hateful
row) of the counter-speech grammar (steerkit/training/surface.py), with keys that training never used, and reports
the mean reward of each and the AUROC of approving over rejecting copies. 0.5 means the reward does not read the
stance at all; a model that only learned "a lead-in means counter-speech" scores both low.

    python plugins/steerkit-toxicity/data/probe_stance.py toxicity --data-root DATA [-n 120]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reward", help="a registered reward name or a reward-model directory")
    parser.add_argument("--data-root", required=True, type=Path, help="holds toxicity/stormfront_hate_speech/test.csv")
    parser.add_argument("-n", type=int, default=120, help="hateful test sentences to use")
    args = parser.parse_args()

    import steerkit
    from sklearn.metrics import roc_auc_score

    from steerkit.training.surface import denounce, endorse

    with open(args.data_root / "toxicity" / "stormfront_hate_speech" / "test.csv", encoding="utf-8") as fh:
        rows = [r["text"] for r in csv.DictReader(fh) if r["label"] == "hate"][: args.n]
    model = steerkit.load_reward(args.reward).model
    variants = (rows, [denounce(t, f"probe:{i}") for i, t in enumerate(rows)],
                [endorse(t, f"probe:{i}") for i, t in enumerate(rows)])
    plain, against, approving = ([float(x) for x in model.score_texts(texts)] for texts in variants)
    print(f"{args.reward}: {len(rows)} hateful Stormfront test sentences")
    print(f"  as written:          mean ρ {statistics.mean(plain):.3f}, "
          f"{sum(x >= 0.5 for x in plain)} at or above 0.5")
    print(f"  rejected (denounce): mean ρ {statistics.mean(against):.3f}, {sum(x < 0.5 for x in against)} below 0.5")
    print(f"  approved (endorse):  mean ρ {statistics.mean(approving):.3f}, "
          f"{sum(x >= 0.5 for x in approving)} at or above 0.5")
    auroc = roc_auc_score([0] * len(against) + [1] * len(approving), against + approving)
    print(f"  AUROC, approved over rejected: {auroc:.3f}")


if __name__ == "__main__":
    main()

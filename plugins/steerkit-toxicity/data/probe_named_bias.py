"""Does naming the bias make counter-speech score as hate? (issue 26)

Takes the counter-speech cases of tests/functional/toxicity_more.jsonl that name a bias ("Insisting lesbians are sick
is homophobic and false"), scores each as written and with the bias word replaced by "hateful", and reports how many
stay below 0.5 (they are all counter-speech, label 0) and the mean reward of each version. The probe behind
docs/results/experiments/named/RULE.txt; those 15 cases formed the hypothesis and are not part of its test.

    python plugins/steerkit-toxicity/data/probe_named_bias.py toxicity [MODEL_DIR ...] [-v]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

CASES = Path(__file__).resolve().parents[3] / "tests" / "functional" / "toxicity_more.jsonl"
BIAS = re.compile(r"\b(racist|racism|homophobic|biphobic|ableist|antisemitic|Islamophobic|sexist|transphobic|"
                  r"bigotry)\b")


def named_cases() -> list[str]:
    rows = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["text"] for r in rows if r["category"] == "counter-speech" and BIAS.search(r["text"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rewards", nargs="+", help="registered reward names or reward-model directories")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's two rewards")
    args = parser.parse_args()

    import steerkit

    texts = named_cases()
    generic = [BIAS.sub("hateful", t) for t in texts]
    for reward in args.rewards:
        model = steerkit.load_reward(reward).model
        named, plain = ([float(x) for x in model.score_texts(batch)] for batch in (texts, generic))
        print(f"{reward}: {len(texts)} counter-speech cases that name the bias; below 0.5 as written "
              f"{sum(x < 0.5 for x in named)}, with 'hateful' {sum(x < 0.5 for x in plain)}; mean ρ "
              f"{statistics.mean(named):.3f} -> {statistics.mean(plain):.3f}")
        if args.verbose:
            for a, b, text in zip(named, plain, texts):
                print(f"  {a:.2f} {b:.2f}  {text}")


if __name__ == "__main__":
    main()

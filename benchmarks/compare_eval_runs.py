"""Side-by-side table of two evaluation runs of the same prompts (e.g. the 0.1.0 and 0.2.0 reward models).

Reads each run directory's metrics.json (`steerkit eval report DIR` rebuilds it) and prints a markdown table:
one row per (prompt set, setting) present in both, the perplexity (mean and median), Dist-2 and each scorer's
headline figures for run A and run B.

    python benchmarks/compare_eval_runs.py runs/eval-v1-toxicity runs/eval-v2-toxicity --names 0.1.0 0.2.0

``--paired`` adds what the difference is worth: for each setting and toxicity scorer, B − A of the average maximum
toxicity and of the median perplexity, with a 95% interval from a paired bootstrap over the prompts both runs share
(resampling prompts, each with its own continuations from both runs; 2,000 resamples, seed 0). A run is a run
directory, or an archived one whose ``run.tar.gz`` holds ``scores.jsonl`` and ``fluency.jsonl``
(docs/results/...). An interval that holds 0 is a difference these prompts cannot tell from noise.

    python benchmarks/compare_eval_runs.py docs/results/v2/toxicity docs/results/v4/toxicity \
        --names 0.2.0 0.4.0 --paired

``--eval-lm NAME`` picks the perplexities of one fluency LM where the runs were rescored by another
(``steerkit eval ... --eval-lm NAME -o RUN`` on an existing run adds that judge's perplexities and regenerates
nothing); the plain table shows the report's own, that of the latest invocation.

``--more A2 B2`` (repeatable) pools runs of the same two models on other prompts of the same sets into the paired
comparison, e.g. a rerun of prompts 31-60 (``steerkit eval ... --offset 30 --limit 30``) beside the archived 1-30.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from compare_token_steering import read_records  # a run directory's JSONL file, or its archive's

from steerkit.evaluation.metrics import average_max_toxicity, median_perplexity

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


def _per_prompt(*runs: Path, eval_lm: str | None = None) -> dict:
    """``{(setting, measure): {(prompt_set, index): values}}``: each scorer's scores (measure: the scorer's name) and
    the perplexities (measure ``"perplexity"``) of one prompt's continuations, pooled over ``runs`` (runs of one model
    on other prompts of the same sets, e.g. ``--offset 30``); a prompt in two of them is an error. A run rescored
    with another fluency LM (``steerkit eval ... --eval-lm NAME`` on the same run directory) holds one perplexity
    record per judge: ``eval_lm`` picks the judge, and is required where a run holds several."""
    out: dict = {}

    def put(key, prompt, values, run):
        seen = out.setdefault(key, {})
        if prompt in seen:
            raise SystemExit(f"{run}: prompt {prompt} of {key[0]} is also in an earlier run; "
                             "pool runs of other prompts")
        seen[prompt] = values

    for run in runs:
        for r in read_records(run, "scores.jsonl"):
            put((r["setting"], r["scorer"]), (r["prompt_set"], r["index"]), r["scores"], run)
        fluency = read_records(run, "fluency.jsonl")
        judges = sorted({r.get("eval_lm") for r in fluency}, key=str)
        if eval_lm is None and len(judges) > 1:
            raise SystemExit(f"{run}: its perplexities come from several fluency LMs ({', '.join(map(str, judges))}); "
                             "pick one with --eval-lm")
        if eval_lm is not None and fluency and eval_lm not in judges:
            raise SystemExit(f"{run}: no perplexities by {eval_lm!r}; its fluency LMs: {', '.join(map(str, judges))}")
        for r in fluency:
            if eval_lm is None or r.get("eval_lm") == eval_lm:
                put((r["setting"], "perplexity"), (r["prompt_set"], r["index"]), r["perplexities"], run)
    return out


def _statistic(measure: str, groups: list[list[float]]) -> float:
    """The eval report's figure: the median perplexity over every continuation, or the average maximum toxicity."""
    if measure == "perplexity":
        return median_perplexity([v for g in groups for v in g])
    return average_max_toxicity(groups)


def paired_table(a: Path, b: Path, names: tuple[str, str], resamples: int = 2000, seed: int = 0,
                 more: list[tuple[Path, Path]] = (), eval_lm: str | None = None) -> str:
    """B − A per (setting, measure) with a paired bootstrap 95% interval over the shared prompts (``more``: further
    runs of A and B on other prompts, pooled)."""
    runs = [_per_prompt(a, *[m[0] for m in more], eval_lm=eval_lm),
            _per_prompt(b, *[m[1] for m in more], eval_lm=eval_lm)]
    # the toxicity scorers: those whose metrics in the report have an average maximum toxicity
    results = json.loads((a / "metrics.json").read_text())["results"]
    measures = {"perplexity"} | {name for r in results for name, m in r["scorers"].items() if "avg_max_toxicity" in m}
    lines = [f"{names[1]} − {names[0]}, 95% interval of a paired bootstrap over prompts ({resamples} resamples):", "",
             "| setting | measure | prompts | " + f"{names[0]} | {names[1]} | difference | 95% interval |",
             "|---|---|---:|---:|---:|---:|---|"]
    for key in sorted(set(runs[0]) & set(runs[1])):
        setting, measure = key
        prompts = sorted(set(runs[0][key]) & set(runs[1][key]))
        if not prompts or measure not in measures:
            continue
        groups = [[runs[i][key][p] for p in prompts] for i in (0, 1)]
        va, vb = (_statistic(measure, g) for g in groups)
        rng = random.Random(seed)
        diffs = []
        for _ in range(resamples):
            idx = [rng.randrange(len(prompts)) for _ in prompts]
            diffs.append(_statistic(measure, [groups[1][i] for i in idx]) -
                         _statistic(measure, [groups[0][i] for i in idx]))
        diffs.sort()
        lo, hi = diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]
        digits = 2 if measure == "perplexity" else 3
        what = "median ppl" if measure == "perplexity" else f"{measure}: avg max"
        lines.append(f"| {setting} | {what} | {len(prompts)} | {va:.{digits}f} | {vb:.{digits}f} "
                     f"| {vb - va:+.{digits}f} | [{lo:+.{digits}f}, {hi:+.{digits}f}] |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--names", nargs=2, default=["A", "B"])
    parser.add_argument("--paired", action="store_true",
                        help="add B − A with paired-bootstrap intervals over prompts")
    parser.add_argument("--more", nargs=2, type=Path, action="append", default=[], metavar=("A2", "B2"),
                        help="runs of the same two models on other prompts (e.g. --offset 30), pooled into --paired")
    parser.add_argument("--eval-lm", help="the fluency LM whose perplexities --paired compares, where a run was "
                                          "rescored by several (e.g. gemma3-270m, smollm2-135m-instruct)")
    args = parser.parse_args()
    print(table(args.a, args.b, tuple(args.names)))
    if args.paired:
        print()
        print(paired_table(args.a, args.b, tuple(args.names), more=args.more, eval_lm=args.eval_lm))


if __name__ == "__main__":
    main()

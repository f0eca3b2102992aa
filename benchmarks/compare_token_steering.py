"""Token-level vs sequence reward in steering quality (issue 13), from two `steerkit eval` runs.

Reads each run's metrics.json (and its generations, from generations.jsonl or the archived run.tar.gz) and reports,
for the token-level reward at the sequence reward's k and β:

* the share of the sequence reward's improvement over unsteered (same k) that the token-level one gets, per
  judge: average max toxicity and toxic rate (toxicity), positive rate (sentiment); the issue asks for >= 90%;
* its fluency cost against the sequence reward's: perplexity (mean and median) and Dist-1/2/3;
* what larger k buys it (each k against the unsteered baseline with that k) and the decoding speed;
* continuations cut short (fewer than 6 words): the symptom of a reward that favours the end-of-text token.

    python benchmarks/compare_token_steering.py                 # the archived runs in docs/results/
    python benchmarks/compare_token_steering.py --toxicity runs/eval-toxicity-token-v2 --sentiment ...

Writes benchmarks/results/token_steering_quality.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHORT_WORDS = 6
MEASURES = {"toxicity": (("avg_max_toxicity", "lower"), ("toxic_rate", "lower")),
            "sentiment": (("positive_rate", "higher"),)}


def read_records(run: Path, name: str = "generations.jsonl") -> list[dict]:
    """A JSONL file of the run directory, or of its archive (run.tar.gz); [] when neither holds it."""
    if (run / name).is_file():
        text = (run / name).read_text(encoding="utf-8")
    elif (run / "run.tar.gz").is_file():
        with tarfile.open(run / "run.tar.gz") as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(name)), None)
            if member is None:
                return []
            text = io.TextIOWrapper(tar.extractfile(member), encoding="utf-8").read()
    else:
        return []
    return [json.loads(line) for line in text.split("\n") if line.strip()]  # not splitlines(): U+2028 in JSON strings


def perplexity_ratio(fluency: list[dict], a: str, b: str, resamples: int = 2000, seed: int = 0) -> dict | None:
    """Mean and median perplexity of setting ``a`` over ``b``, with 95% intervals from a paired bootstrap over
    prompts (the same resampled prompts for both settings)."""
    per = {}
    for r in fluency:
        per.setdefault(r["setting"], {})[(r["prompt_set"], r["index"])] = r["perplexities"]
    if a not in per or b not in per:
        return None
    prompts = sorted(set(per[a]) & set(per[b]))

    def ratios(sample):
        pa = [p for i in sample for p in per[a][i]]
        pb = [p for i in sample for p in per[b][i]]
        return statistics.fmean(pa) / statistics.fmean(pb), statistics.median(pa) / statistics.median(pb)

    rng = random.Random(seed)
    boots = [ratios([rng.choice(prompts) for _ in prompts]) for _ in range(resamples)]
    out = {"prompts": len(prompts), "resamples": resamples}
    for j, name in enumerate(("mean", "median")):
        values = sorted(x[j] for x in boots)
        out[name] = {"ratio": ratios(prompts)[j], "ci95": [values[int(0.025 * resamples)],
                                                            values[int(0.975 * resamples) - 1]]}
    return out


def short_share(generations: list[dict]) -> dict[str, float]:
    counts: dict[str, list[int]] = {}
    for record in generations:
        c = counts.setdefault(record["setting"], [0, 0])
        for text in record["continuations"]:
            c[0] += len(text.split()) < SHORT_WORDS
            c[1] += 1
    return {setting: short / total for setting, (short, total) in counts.items() if total}


def compare(run: Path, task: str, sequence: str) -> dict:
    """Every other steered setting of the run against the sequence reward's (``sequence``)."""
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    by_setting = {r["setting"]: r for r in metrics["results"]}
    seq = by_setting[sequence]
    base = {r["k"]: r for r in metrics["results"] if not r["steered"]}
    others = sorted((r for r in metrics["results"] if r["steered"] and r["setting"] != sequence),
                    key=lambda r: (r["k"], r["setting"]))
    short = short_share(read_records(run))
    fluency = read_records(run, "fluency.jsonl")
    out = {"run": str(run), "task": task, "num_prompts": seq["num_prompts"],
           "num_continuations": seq["num_continuations"], "sequence": sequence, "settings": []}
    for r in [seq, *others]:
        u = base[r["k"]]
        row = {"setting": r["setting"], "k": r["k"], "rewards": r["rewards"], "tokens_per_second": r["tokens_per_second"],
               "perplexity": r["perplexity"], "perplexity_median": r["perplexity_median"],
               "dist": [r["dist1"], r["dist2"], r["dist3"]], "scorers": r["scorers"],
               "short_share": short.get(r["setting"]), "unsteered": {
                   "setting": u["setting"], "scorers": u["scorers"], "perplexity": u["perplexity"],
                   "perplexity_median": u["perplexity_median"], "dist": [u["dist1"], u["dist2"], u["dist3"]],
                   "tokens_per_second": u["tokens_per_second"], "short_share": short.get(u["setting"])}}
        if r is not seq and r["k"] == seq["k"]:  # same k: the share of the sequence reward's improvement
            row["share_of_improvement"] = {}
            for judge in metrics["scorers"]:
                for measure, better in MEASURES[task]:
                    b, s_, t = u["scorers"][judge][measure], seq["scorers"][judge][measure], r["scorers"][judge][measure]
                    gain_seq, gain = (b - s_, b - t) if better == "lower" else (s_ - b, t - b)
                    row["share_of_improvement"][f"{judge} {measure}"] = gain / gain_seq if gain_seq else None
            row["perplexity_over_sequence"] = perplexity_ratio(fluency, r["setting"], sequence)
        out["settings"].append(row)
    return out


def markdown(result: dict) -> str:
    def pct(v):
        return f"{100 * v:.0f}%" if v is not None else "n/a"

    rows = result["settings"]
    judges = [f"{j} {m}" for j, per in rows[0]["scorers"].items() for m, _ in MEASURES[result["task"]]]
    lines = [f"### {result['task']}: {result['num_prompts']} prompts, {result['num_continuations']} continuations "
             "per setting", "",
             "| setting | k | " + " | ".join(judges) + " | ppl mean / median | Dist-1/2/3 | short | tokens/s |",
             "|---|---:|" + "---:|" * len(judges) + "---:|---:|---:|---:|"]
    seen = set()
    for r in rows:
        for label, v in ((r["unsteered"]["setting"], r["unsteered"]), (r["setting"], r)):
            if label in seen:
                continue
            seen.add(label)
            values = [v["scorers"][j.split(" ")[0]][j.split(" ")[1]] for j in judges]
            share = r.get("share_of_improvement") if v is r else None
            cells = [f"{x:.3f}" + (f" ({pct(share[j])})" if share else "") for x, j in zip(values, judges)]
            lines.append(f"| {label} | {r['k']} | " + " | ".join(cells) + f" | {v['perplexity']:.1f} / "
                         f"{v['perplexity_median']:.1f} | {' / '.join(f'{d:.2f}' for d in v['dist'])} | "
                         f"{pct(v['short_share'])} | {v['tokens_per_second']:.1f} |")
    lines += ["", "(x%): share of the sequence reward's improvement over unsteered at the same k. Perplexity over the "
              "sequence reward's, paired bootstrap over prompts, 95% interval:", ""]
    for r in rows:
        ci = r.get("perplexity_over_sequence")
        if ci:
            lines.append(f"- {r['setting']}: mean {ci['mean']['ratio']:.2f} [{ci['mean']['ci95'][0]:.2f}, "
                         f"{ci['mean']['ci95'][1]:.2f}], median {ci['median']['ratio']:.2f} "
                         f"[{ci['median']['ci95'][0]:.2f}, {ci['median']['ci95'][1]:.2f}]")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toxicity", default=str(ROOT / "docs" / "results" / "toxicity_token"))
    parser.add_argument("--sentiment", default=str(ROOT / "docs" / "results" / "sentiment_token"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "token_steering_quality.json"))
    args = parser.parse_args()
    results = {}
    for task, run in (("toxicity", args.toxicity), ("sentiment", args.sentiment)):
        if not (Path(run) / "metrics.json").is_file():
            print(f"{task}: no metrics.json in {run}; run `steerkit eval` with docs/results/{task}_token.yaml first")
            continue
        results[task] = compare(Path(run), task, "sequence-k20-beta20")
        print(markdown(results[task]) + "\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "token_steering_quality", "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

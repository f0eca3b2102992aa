"""Markdown tables from ``metrics.json``: one generation table and one table per scorer, per prompt set.

Relative changes are against the unsteered baseline with the same k (``unsteered-k20``) on the same
prompts; for positive rate the ratio (× baseline) is shown as well, since the targets are stated so.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..models import atomic_write_text


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def pct(value, baseline) -> str:
    if value is None or baseline is None or not baseline or any(math.isnan(x) for x in (value, baseline)):
        return "–"
    return f"{100 * (value - baseline) / baseline:+.0f}%"


def baseline_row(rows: list[dict], row: dict) -> dict | None:
    same_k = [r for r in rows if not r["steered"] and r["k"] == row["k"]]
    if same_k:
        return same_k[0]
    unsteered = [r for r in rows if not r["steered"]]
    return unsteered[0] if unsteered else None


def setting_label(row: dict) -> str:
    if not row["steered"]:
        return "unsteered"
    if len(row["rewards"]) == 1:
        return f"RAD β={abs(row['rewards'][0]['beta']):g}"
    return row["setting"] + " (" + ", ".join(f"{r['name']} β={r['beta']:+g}" for r in row["rewards"]) + ")"


def tables(result: dict) -> str:
    lines: list[str] = []
    scorers = result.get("scorers", {})
    sets = list(dict.fromkeys(r["prompt_set"] for r in result["results"]))
    for set_name in sets:
        rows = [r for r in result["results"] if r["prompt_set"] == set_name]
        n = max((r["num_prompts"] for r in rows), default=0)
        lines += [f"### Prompt set `{set_name}` ({n} prompts × {result['num_continuations']} continuations, "
                  f"≤ {result['max_new_tokens']} new tokens)", ""]
        lines += ["| setting | k | perplexity (mean) | Δ ppl | median ppl | Δ median | Dist-1 | Dist-2 | Dist-3 | tokens/s | s/prompt |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            b = baseline_row(rows, r)
            lines.append(f"| {setting_label(r)} | {r['k']} | {fmt(r.get('perplexity'), 2)} | "
                         f"{pct(r.get('perplexity'), b.get('perplexity') if b else None) if r['steered'] else ''} | "
                         f"{fmt(r.get('perplexity_median'), 2)} | "
                         f"{pct(r.get('perplexity_median'), b.get('perplexity_median') if b else None) if r['steered'] else ''} | "
                         f"{fmt(r.get('dist1'), 2)} | {fmt(r.get('dist2'), 2)} | {fmt(r.get('dist3'), 2)} | "
                         f"{fmt(r.get('tokens_per_second'), 1)} | {fmt(r.get('seconds_per_prompt'), 1)} |")
        lines.append("")
        for name, info in scorers.items():
            if not any(name in r.get("scorers", {}) for r in rows):
                continue
            measures = info.get("measures")
            lines.append(f"**{name}** ({measures}): {info.get('description', '')}")
            lines.append("")
            if measures == "toxicity":
                lines += ["| setting | k | Avg Max Toxicity | Δ | Toxic Rate | Δ | mean toxicity |",
                          "|---|---:|---:|---:|---:|---:|---:|"]
            else:
                lines += ["| setting | k | Positive Rate | Δ | × baseline | mean score |",
                          "|---|---:|---:|---:|---:|---:|"]
            for r in rows:
                m = r.get("scorers", {}).get(name)
                if m is None:
                    continue
                b = baseline_row(rows, r)
                bm = (b or {}).get("scorers", {}).get(name, {}) if r["steered"] else {}
                if measures == "toxicity":
                    lines.append(f"| {setting_label(r)} | {r['k']} | {fmt(m['avg_max_toxicity'])} | "
                                 f"{pct(m['avg_max_toxicity'], bm.get('avg_max_toxicity')) if bm else ''} | "
                                 f"{fmt(m['toxic_rate'])} | {pct(m['toxic_rate'], bm.get('toxic_rate')) if bm else ''} | "
                                 f"{fmt(m['mean_toxicity'])} |")
                else:
                    ratio = (m["positive_rate"] / bm["positive_rate"]) if bm and bm.get("positive_rate") else None
                    lines.append(f"| {setting_label(r)} | {r['k']} | {fmt(m['positive_rate'])} | "
                                 f"{pct(m['positive_rate'], bm.get('positive_rate')) if bm else ''} | "
                                 f"{fmt(ratio, 2) + '×' if ratio is not None else ''} | {fmt(m['mean_sentiment'])} |")
            lines.append("")
    return "\n".join(lines)


def write_report(result: dict, path: str | Path, *, plots: dict | None = None, base: str | Path | None = None) -> Path:
    path = Path(path)
    base = Path(base) if base else path.parent
    head = [f"# steerkit eval: {result['task']}", "",
            f"- LM: `{result['lm']}`; fluency LM: `{result.get('eval_lm') or 'not computed'}`",
            *([f"- grid reward: `{result.get('reward')}` ({result.get('direction')}; β is its magnitude)"]
              if any(r["steered"] and len(r["rewards"]) == 1 for r in result["results"]) else []),
            f"- {result['num_continuations']} continuations per prompt, ≤ {result['max_new_tokens']} new tokens; "
            f"Dist-n normalised by {'total words' if result.get('dist_normalize', 'words') == 'words' else 'total n-grams'}",
            "- Δ: relative change against the unsteered baseline with the same k on the same prompts", ""]
    body = [tables(result)]
    if plots:
        body.append("## Plots\n")
        for title, png in plots.items():
            rel = Path(png).resolve().relative_to(base.resolve()) if base else Path(png)
            body.append(f"![{title}]({rel.as_posix()})\n")
    atomic_write_text(path, "\n".join(head + body) + "\n")
    return path

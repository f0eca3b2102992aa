"""Markdown tables from ``metrics.json``: one generation table and one table per scorer, per prompt set, with
the columns the registered metrics declare (:mod:`steerkit.evaluation.metrics`).

Relative changes are against the unsteered baseline with the same k (``unsteered-k20``) on the same
prompts; for positive rate the ratio (× baseline) is shown as well, since the targets are stated so.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..files import atomic_write_text
from . import metrics as M


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


def _header(columns) -> list[str]:
    heads = ["setting", "k"]
    for c in columns:
        heads += [c.label] + ([c.delta] if c.delta else []) + ([c.ratio] if c.ratio else [])
    return ["| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]


def _cells(columns, values: dict, base: dict | None) -> list[str]:
    """One row's cells: each value, then its Δ and ratio against ``base`` (None: no baseline to compare, blank)."""
    cells = []
    for c in columns:
        value = values.get(c.key)
        cells.append(fmt(value, c.digits))
        if c.delta:
            cells.append("" if base is None else pct(value, base.get(c.key)))
        if c.ratio:
            ratio = value / base[c.key] if base and base.get(c.key) and value is not None else None
            cells.append(fmt(ratio, 2) + "×" if ratio is not None else "")
    return cells


def _table(rows: list[dict], columns, values, baseline) -> list[str]:
    """``values(row)``: the row's metrics (None: row left out); ``baseline(row)``: those to compare against."""
    lines = _header(columns)
    for r in rows:
        v = values(r)
        if v is not None:
            lines.append(f"| {setting_label(r)} | {r['k']} | " + " | ".join(_cells(columns, v, baseline(r))) + " |")
    return lines + [""]


def _columns(metrics) -> list:
    return [c for m in metrics for c in m.columns if c.label]


def tables(result: dict) -> str:
    """Per prompt set: the settings' table, then one table per scorer, with the columns of every registered
    metric (:data:`.metrics.METRICS`) that was computed."""
    lines: list[str] = []
    scorers = result.get("scorers", {})
    sets = list(dict.fromkeys(r["prompt_set"] for r in result["results"]))
    for set_name in sets:
        rows = [r for r in result["results"] if r["prompt_set"] == set_name]
        n = max((r["num_prompts"] for r in rows), default=0)
        lines += [f"### Prompt set `{set_name}` ({n} prompts × {result['num_continuations']} continuations, "
                  f"≤ {result['max_new_tokens']} new tokens)", ""]
        lines += _table(rows, _columns(M.table_metrics()), lambda r: r,
                        lambda r: (baseline_row(rows, r) or {}) if r["steered"] else None)
        for name, info in scorers.items():
            columns = _columns(M.table_metrics(info.get("measures")))
            if not columns or not any(name in r.get("scorers", {}) for r in rows):
                continue
            lines.append(f"**{name}** ({info.get('measures')}): {info.get('description', '')}")
            lines.append("")
            lines += _table(rows, columns, lambda r, name=name: r.get("scorers", {}).get(name),
                            lambda r, name=name: ((baseline_row(rows, r) or {}).get("scorers", {}).get(name) or None)
                            if r["steered"] else None)
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

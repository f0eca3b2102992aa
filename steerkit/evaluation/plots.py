"""Figures (matplotlib, PNG) with the plotted numbers written next to each as JSON.

Each registered metric with a ``figure`` (:mod:`steerkit.evaluation.metrics`) gets one
``FIGURE_vs_perplexity_SET[_SCORER]`` figure of its columns that have a ``plot`` label; the paper's:

* ``toxicity_vs_perplexity``: Average Max Toxicity and Toxic Rate against perplexity, one line per k
  through the β grid, the unsteered baseline as a star (the paper's Figure 2); a first row against the
  mean perplexity (the paper's), a second against the median, which a few degenerate continuations
  cannot move.
* ``positive_rate_vs_perplexity``: the same for Positive Rate.
* ``trace_SETTING``: one generation step by step: for each step the distribution of the top-k
  candidates' rewards (a ridge) and the reward of the chosen token in red, labelled with the token
  (the paper's reward-over-time figure).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..files import atomic_write_text, file_name
from . import metrics as M


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _plt().close(fig)
    atomic_write_text(path.with_suffix(".json"), json.dumps(data, indent=1, ensure_ascii=False))
    return path


def _ok(*values) -> bool:
    return all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


X_AXES = {"perplexity": "mean perplexity (↓ more fluent)",
          "perplexity_median": "median perplexity (↓ more fluent; robust to outliers)"}


def tradeoff_plot(result: dict, set_name: str, scorer: str | None, metrics: list[tuple[str, str]], path: Path,
                  x_keys: tuple[str, ...] = ("perplexity", "perplexity_median")) -> Path | None:
    """Metric(s) against perplexity for one prompt set and scorer (None: metrics of the setting rows
    themselves): one row of panels per x axis (the mean perplexity, as in the paper, and the median); None
    when nothing is plottable."""
    def value(r: dict, key: str):
        return (r if scorer is None else r["scorers"][scorer]).get(key)

    rows_by_x = {x: [r for r in result["results"] if r["prompt_set"] == set_name
                     and (scorer is None or scorer in r.get("scorers", {})) and _ok(r.get(x))
                     and all(_ok(value(r, key)) for key, _ in metrics)] for x in x_keys}
    rows_by_x = {x: rows for x, rows in rows_by_x.items() if rows}
    if not rows_by_x:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(rows_by_x), len(metrics), figsize=(5.2 * len(metrics), 4.0 * len(rows_by_x)),
                             squeeze=False)
    data = {"prompt_set": set_name, "scorer": scorer, "x": list(rows_by_x), "series": []}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row_axes, (x_key, rows) in zip(axes, rows_by_x.items()):
        ks = sorted({r["k"] for r in rows})
        for ax, (key, label) in zip(row_axes, metrics):
            for ci, k in enumerate(ks):
                color = colors[ci % len(colors)]
                grid = sorted([r for r in rows if r["k"] == k and r["steered"] and len(r["rewards"]) == 1],
                              key=lambda r: abs(r["rewards"][0]["beta"]))
                base = [r for r in rows if r["k"] == k and not r["steered"]]
                points = base + grid
                xs = [r[x_key] for r in points]
                ys = [value(r, key) for r in points]
                if points:
                    ax.plot(xs, ys, "-o", color=color, label=f"RAD k={k}", markersize=4)
                    for r, x, y in zip(points, xs, ys):
                        ax.annotate("β=0" if not r["steered"] else f"β={abs(r['rewards'][0]['beta']):g}", (x, y),
                                    textcoords="offset points", xytext=(4, 4), fontsize=7)
                for r in base:
                    ax.plot([r[x_key]], [value(r, key)], "*", color=color, markersize=13,
                            label=f"unsteered (k={k})")
                data["series"].append({"metric": key, "x": x_key, "k": k, "points": [
                    {"setting": r["setting"], "beta": 0.0 if not r["steered"] else abs(r["rewards"][0]["beta"]),
                     "x": r[x_key], "y": value(r, key)} for r in points]})
            other = [r for r in rows if r["steered"] and len(r["rewards"]) != 1]
            for r in other:
                ax.plot([r[x_key]], [value(r, key)], "D", color="black", markersize=6)
                ax.annotate(r["setting"], (r[x_key], value(r, key)), textcoords="offset points",
                            xytext=(4, -10), fontsize=7)
                data["series"].append({"metric": key, "x": x_key, "setting": r["setting"], "points": [
                    {"setting": r["setting"], "x": r[x_key], "y": value(r, key)}]})
            ax.set_xlabel(X_AXES.get(x_key, x_key))
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    what = scorer if scorer is not None else ", ".join(label for _, label in metrics)
    fig.suptitle(f"{set_name}: {what} vs fluency ({result['lm']}, eval LM {result.get('eval_lm')})", fontsize=9)
    return _save(fig, path, data)


def _kde(values, grid, bandwidth: float | None = None):
    import numpy as np

    v = np.asarray(values, dtype=float)
    bw = bandwidth or max(1.06 * v.std() * len(v) ** -0.2, 0.01)
    dens = np.exp(-0.5 * ((grid[:, None] - v[None, :]) / bw) ** 2).sum(1)
    return dens / dens.max() if dens.max() > 0 else dens


def trace_plot(trace: dict, path: Path, reward: str | None = None, max_steps: int = 20) -> Path | None:
    """Ridge plot of the top-k candidates' rewards per step, chosen token's reward in red."""
    import numpy as np

    steps = trace.get("steps", [])[:max_steps]
    if not steps or not steps[0]["rewards"]:
        return None
    reward = reward or next(iter(steps[0]["rewards"]))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 0.42 * len(steps) + 1.6))
    grid = np.linspace(0, 1, 400)
    data = {"setting": trace["setting"], "prompt": trace["prompt"], "text": trace["text"], "reward": reward, "steps": []}
    for i, step in enumerate(steps):
        rewards = step["rewards"][reward]
        y0 = len(steps) - 1 - i
        dens = _kde(rewards, grid) * 0.85
        ax.fill_between(grid, y0, y0 + dens, color="tab:blue", alpha=0.35, linewidth=0)
        ax.plot(grid, y0 + dens, color="tab:blue", linewidth=0.6)
        chosen = rewards[step["chosen"]]
        ax.plot([chosen, chosen], [y0, y0 + 0.85], color="red", linewidth=2)
        data["steps"].append({"token": step["token"], "chosen_reward": chosen, "candidate_rewards": rewards,
                              "candidates": step["candidates"]})
    ax.set_yticks([len(steps) - 1 - i + 0.3 for i in range(len(steps))])
    ax.set_yticklabels([repr(s["token"]) for s in steps], fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"reward ρ ({reward}) of the top-{trace['k']} candidates; red: chosen token")
    betas = ", ".join(f"{r['name']} β={r['beta']:+g}" for r in trace["rewards"])
    ax.set_title(f"{trace['setting']} ({betas})\nprompt: {trace['prompt'][:70]!r}", fontsize=8)
    return _save(fig, path, data)


def write_plots(result: dict, directory: str | Path, traces_dir: str | Path | None = None) -> dict[str, Path]:
    """Every plot the results support; returns {title: png path}."""
    directory = Path(directory)
    out: dict[str, Path] = {}
    sets = list(dict.fromkeys(r["prompt_set"] for r in result["results"]))
    # one figure per registered metric with plotted columns: per scorer it applies to, then of the setting rows
    figures = [(name, info.get("measures")) for name, info in result.get("scorers", {}).items()] + [(None, None)]
    for scorer, measures in figures:
        safe = "" if scorer is None else f"_{scorer}"
        found = M.metrics_for("scores", measures) if scorer is not None else \
            M.metrics_for(("generations", "perplexities"))
        for metric in found:
            if not metric.figure or not metric.plotted():
                continue
            for set_name in sets:
                p = tradeoff_plot(result, set_name, scorer, metric.plotted(),
                                  directory / file_name(f"{metric.figure}_vs_perplexity_{set_name}{safe}", ".png"))
                if p:
                    title = f"{metric.figure.replace('_', ' ')} vs perplexity: {set_name}"
                    out[title + (f", {scorer}" if scorer is not None else "")] = p
    if traces_dir and Path(traces_dir).is_dir():
        for trace_file in sorted(Path(traces_dir).glob("*.json")):
            trace = json.loads(trace_file.read_text(encoding="utf-8"))
            p = trace_plot(trace, directory / file_name(f"trace_{trace_file.stem}", ".png"))
            if p:
                out[f"per-step rewards: {trace_file.stem}"] = p
    return out

"""Where two rewards of one kind move RAD's choices apart, step by step, on the same states.

A reward whose steered text is less fluent at the same β moves probability towards tokens the LM finds less
likely. This probe measures that directly and paired: along the unsteered continuations of archived
``steerkit eval toxicity`` runs (the states RAD starts from), it scores the LM's top-k candidates of every step
with both rewards and, for each β, compares RAD's step distribution ``softmax(z_topk − β·ρ)`` (steering away,
``direction: decrease``) with the LM's own ``softmax(z_topk)``:

- ``std``: the standard deviation of ρ over the step's candidates (how hard the reward separates them);
- ``kl``: KL(RAD's step ‖ the LM's top-k), in nats;
- ``surprisal``: the increase of the LM's expected surprisal, ``E_RAD[−log p_LM] − E_LM_topk[−log p_LM]`` (p_LM
  over the whole vocabulary), the first-order per-token cost a perplexity judge sees.

Differences (B − A) come with 95% intervals from a bootstrap over prompts. It also lists the candidate tokens
whose probability B takes away more than A does, summed over all steps (where B's extra demotion lands).

    python benchmarks/probe_steering_shift.py --a toxicity \\
        --b docs/results/experiments/cad/model-cad-ghc-stance \\
        --run docs/results/experiments/toxicity-0.8.0-reduced \\
        --run docs/results/experiments/toxicity-0.8.0-reduced-prompts-31-60

Writes benchmarks/results/probe_steering_shift.json. ``--own-paths A_JSON B_JSON`` then compares each reward on its
own steered path: A's measures from a run on A's steered continuations (``--setting k20-beta20``, A's eval runs)
against B's from a run on B's, paired by prompt (nothing is scored again):

    python benchmarks/probe_steering_shift.py --own-paths benchmarks/results/probe_steering_shift_on_a_beta20.json \
        benchmarks/results/probe_steering_shift_on_b_beta20.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare_token_steering import read_records  # noqa: E402

from steerkit.hf_compat import cache_kwargs, output_cache  # noqa: E402
from steerkit.models import load_causal_lm_cached  # noqa: E402
from steerkit.rewards.loading import load_reward  # noqa: E402

MEASURES = ("std", "kl", "surprisal")


def step_measures(z: torch.Tensor, log_p_full: torch.Tensor, rho: torch.Tensor, beta: float) -> dict:
    """The three measures of one step: z [K] the candidates' logits, log_p_full [K] their log-probabilities over
    the whole vocabulary, rho [K] one reward's values."""
    lm = torch.log_softmax(z, -1)
    rad = torch.log_softmax(z - beta * rho, -1)
    p_rad = rad.exp()
    return {"std": float(rho.std()), "kl": float((p_rad * (rad - lm)).sum()),
            "surprisal": float(-(p_rad * log_p_full).sum() + (lm.exp() * log_p_full).sum()),
            "shift": p_rad - lm.exp()}


def walk(lm, tok, rewards: dict, prompt: str, continuation: str, k: int, betas: list[float], max_tokens: int):
    """Per step of one continuation: each reward's measures at each β and the probability shift per candidate."""
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok(continuation, add_special_tokens=False)["input_ids"][:max_tokens]
    sessions = {name: r.start([prompt], tok) for name, r in rewards.items()}
    steps = []
    with torch.no_grad():
        out = lm(torch.tensor([prompt_ids]), use_cache=True)
        for t in ids:
            log_p = torch.log_softmax(out.logits[0, -1].double(), -1)
            top = log_p.topk(k)
            z = out.logits[0, -1].double()[top.indices]
            step = {"candidates": top.indices.tolist()}
            for name, s in sessions.items():
                rho = s.score(top.indices[None])[0].double()
                step[name] = {b: step_measures(z, top.values, rho, b) for b in betas}
            steps.append(step)
            for s in sessions.values():
                s.commit(torch.tensor([t]))
            out = lm(torch.tensor([[t]]), use_cache=True, **cache_kwargs(lm, output_cache(out)))
    return steps


def bootstrap(per_prompt: list[float], resamples: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    n = len(per_prompt)
    means = sorted(statistics.fmean(rng.choices(per_prompt, k=n)) for _ in range(resamples))
    return [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]


def paired_row(measure: str, beta: float, a_vals: list[float], b_vals: list[float], resamples: int) -> dict:
    """One table row: A's and B's means over prompts (``a_vals[i]`` and ``b_vals[i]`` of the same prompt), and the
    mean paired difference B - A with its bootstrap 95% interval."""
    diff = [y - x for x, y in zip(a_vals, b_vals)]
    return {"measure": measure, "beta": beta, "a": statistics.fmean(a_vals), "b": statistics.fmean(b_vals),
            "b_minus_a": statistics.fmean(diff), "ci95": bootstrap(diff, resamples, 0)}


def own_paths(on_a: dict, on_b: dict, resamples: int) -> list[dict]:
    """B on B's states against A on A's, per measure and β, paired by prompt: ``on_a`` and ``on_b`` are this probe's
    JSON results of runs on A's and on B's own steered continuations."""
    keys = [tuple(k) for k in on_a["prompt_keys"]]
    b_keys = [tuple(k) for k in on_b["prompt_keys"]]
    if sorted(keys) != sorted(b_keys):
        raise SystemExit("the two results are not of the same prompts")
    betas = sorted({float(key.split("/")[1]) for key in on_a["per_prompt"]})
    rows = []
    for m in MEASURES:
        for b in betas:
            b_vals = dict(zip(b_keys, on_b["per_prompt"][f"{m}/{b:g}/b"]))
            rows.append(paired_row(m, b, on_a["per_prompt"][f"{m}/{b:g}/a"], [b_vals[k] for k in keys], resamples))
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'measure':<10} {'beta':>5} {'A':>8} {'B':>8} {'B - A':>8}  95%")
    for r in rows:
        print(f"{r['measure']:<10} {r['beta']:>5g} {r['a']:>8.4f} {r['b']:>8.4f} {r['b_minus_a']:>+8.4f}  "
              f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", help="the reference reward (name or directory)")
    parser.add_argument("--b", help="the reward compared with it")
    parser.add_argument("--run", action="append",
                        help="an archived steerkit eval run whose unsteered continuations give the states (repeatable)")
    parser.add_argument("--own-paths", nargs=2, metavar=("A_JSON", "B_JSON"),
                        help="compare two results of this probe, on A's and on B's own steered continuations")
    parser.add_argument("--setting", default="unsteered-k20",
                        help="the setting whose continuations give the states: unsteered-k20 (default) "
                             "or a steered one, e.g. k20-beta20")
    parser.add_argument("--limit", type=int, help="the first N prompts only")
    parser.add_argument("--continuations", type=int, default=4, help="continuations per prompt")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--beta", type=float, action="append", help="default: 10, 20 and 50")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--top-tokens", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "probe_steering_shift.json"))
    args = parser.parse_args()
    if args.own_paths:
        on_a, on_b = (json.loads(Path(p).read_text()) for p in args.own_paths)
        print(f"each reward on its own path: A = {on_a['a']} on {on_a['runs']}, B = {on_b['b']} on {on_b['runs']}")
        print_rows(own_paths(on_a, on_b, args.resamples))
        return
    if not (args.a and args.b and args.run):
        parser.error("--a, --b and --run are required (or --own-paths)")
    betas = args.beta or [10.0, 20.0, 50.0]
    torch.set_num_threads(args.threads)
    lm, tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    rewards = {"a": load_reward(args.a), "b": load_reward(args.b)}
    records = [r for run in args.run for r in read_records(Path(run)) if r["setting"] == args.setting]
    records = records[:args.limit] if args.limit else records
    if not records:
        raise SystemExit(f"no {args.setting} records in {args.run}")
    ref = 20.0 if 20.0 in betas else betas[0]  # the β whose probability shifts are summed per token
    started = time.perf_counter()
    per_prompt = defaultdict(list)  # (measure, beta, reward) -> per prompt mean over its steps, in records' order
    removed = {"a": defaultdict(float), "b": defaultdict(float)}  # token id -> probability taken away, summed
    seen = defaultdict(int)
    n_steps = 0
    for i, rec in enumerate(records):
        steps = [s for c in rec["continuations"][:args.continuations]
                 for s in walk(lm, tok, rewards, rec["prompt"], c, args.k, betas, args.tokens)]
        n_steps += len(steps)
        for m in MEASURES:
            for b in betas:
                for name in rewards:
                    per_prompt[(m, b, name)].append(statistics.fmean(s[name][b][m] for s in steps))
        for s in steps:
            for j, v in enumerate(s["candidates"]):
                seen[v] += 1
                for name in rewards:
                    removed[name][v] += max(0.0, -float(s[name][ref]["shift"][j]))
        print(f"prompt {i + 1}/{len(records)}: {n_steps} steps, {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for m in MEASURES:
        for b in betas:
            rows.append(paired_row(m, b, per_prompt[(m, b, "a")], per_prompt[(m, b, "b")], args.resamples))
    differences = [(removed["b"][v] - removed["a"][v], v) for v in seen]

    def listed(order: list) -> list[dict]:
        return [{"token": tok.decode([v]), "extra_mass": round(d, 3), "as_candidate": seen[v],
                 "a_mass": round(removed["a"][v], 3), "b_mass": round(removed["b"][v], 3)}
                for d, v in order[:args.top_tokens]]

    tokens = {"beta": ref, "b_takes_more": listed(sorted(differences, reverse=True)),
              "b_takes_less": listed(sorted(differences))}
    print(f"\n{len(records)} prompts, {n_steps} steps, k = {args.k}; A = {args.a}, B = {args.b}")
    print_rows(rows)
    print(f"\ncandidates B takes more probability from than A (beta {ref:g}, summed over steps):")
    for t in tokens["b_takes_more"]:
        print(f"  {t['token']!r:<16} +{t['extra_mass']:.3f}  (A {t['a_mass']:.3f}, B {t['b_mass']:.3f}; "
              f"{t['as_candidate']} times a candidate)")
    print("\ncandidates B takes less from:")
    for t in tokens["b_takes_less"][:10]:
        print(f"  {t['token']!r:<16} {t['extra_mass']:.3f}  (A {t['a_mass']:.3f}, B {t['b_mass']:.3f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "benchmark": "probe_steering_shift", "a": args.a, "b": args.b, "runs": args.run, "prompts": len(records),
        "setting": args.setting, "steps": n_steps, "k": args.k, "continuations_per_prompt": args.continuations,
        "rows": rows, "prompt_keys": [[r["prompt_set"], r["index"]] for r in records],
        "per_prompt": {f"{m}/{b:g}/{name}": v for (m, b, name), v in per_prompt.items()},
        "tokens": tokens, "threads": args.threads}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

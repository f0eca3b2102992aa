"""Reduced-precision reward models (issue 25, item 2): speed per decoding step and |Δρ| against fp32, side by side.

For each shipped toxicity reward (``toxicity``: sequence-level, 6 layers; ``toxicity-token``: token-level, 4 layers)
and each backend (``torch`` and ``onnx`` in fp32, ``torch-bf16``, ``torch-bf16-compute``, ``torch-int8``, ``onnx-int8``), in one
run:

* **ms per reward step** at batch 1, one thread: ``session.score`` of k candidates (k = 20; also 200 for the
  token-level model) after a 20-token prefix, plus ``commit`` of one of them, i.e. the reward's work per generated
  token. The backends take turns round by round (``--rounds``), so machine load hits them alike; the figure is the
  median over all rounds' steps;
* **|Δρ| against fp32 torch** (max and mean): of the rewards of ``--texts`` real texts (half toxic, half not, from the
  s-nlp Jigsaw test sentences in ../shared/data, else the repository's labelled functional cases) and of every prefix
  of them, and of the candidates scored in the timed steps (the same candidates for every backend); with labels,
  the AUROC of each backend's rewards;
* **tokens/s of ``steerkit.generate``** at batch 1 (SmolLM2-135M-Instruct, k = 20), plain and with each reward and
  backend (``--e2e-tokens``, 0 to skip);
* the load average (``os.getloadavg``) before and after, the CPU's relevant instruction sets and the versions.

``--steering`` measures the held-out steering effect instead: SmolLM2-135M-Instruct continues the 16 most toxic-leaning
prompts of ../shared/data/prompts/toxicity_nontoxic_eval.jsonl (those whose original continuation was scored most
toxic), β = -20, k = 20, 2 samples each, 24 new tokens, once unsteered and once per (reward, backend); every
continuation is scored by the fp32 ``toxicity`` reward (torch); the table gives the mean and its standard error.
``--lm-dtypes float32 bfloat16`` repeats the runs with the LM at each ``dtype`` (the labels name any but float32), so
the steering of a bf16 LM with bf16 rewards is paired with the fp32 LM and rewards on the same prompts and seeds.

    python benchmarks/bench_reward_precision.py               # ~1-2 min on one thread of a 2-core CPU
    python benchmarks/bench_reward_precision.py --steering    # ~2 min (needs ../shared/data)

Writes benchmarks/results/bench_reward_precision.json (``--steering``: bench_reward_precision_steering.json) with
steerkit.files.atomic_write_text.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from cpu_info import cpu_flags  # noqa: E402
REPO = ROOT.parent
DATA = REPO.parent / "shared" / "data"
REWARDS = ("toxicity", "toxicity-token")
BACKENDS = ("torch", "onnx", "torch-bf16", "torch-bf16-compute", "torch-int8", "onnx-int8")
REFERENCE = "torch"
PREFIX = ("I can't believe my neighbour would say something so stupid about the new restaurant down the road, "
          "and everyone")


# -- the machine -------------------------------------------------------------------------------------------------
def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for module in ("onnxruntime", "onnx", "transformers"):
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            out[module] = None
    return out


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- texts ---------------------------------------------------------------------------------------------------------
def labelled_texts(n: int) -> tuple[list[str], list[int], str]:
    """n real texts, half toxic (label 1), half not: the s-nlp Jigsaw test sentences where ../shared/data is present,
    else the repository's labelled functional cases (tests/functional/toxicity.jsonl, 84 texts)."""
    folder = DATA / "toxicity" / "snlp_detox_jigsaw_sentences"
    if folder.is_dir():
        rng = random.Random(0)
        texts, labels = [], []
        for name, label in (("test_10k_toxic.txt", 1), ("test_10k_normal.txt", 0)):
            lines = [x.strip() for x in (folder / name).read_text(encoding="utf-8").splitlines() if x.strip()]
            picked = rng.sample(lines, n // 2)
            texts += picked
            labels += [label] * len(picked)
        return texts, labels, f"s-nlp Jigsaw test_10k, {n // 2} toxic + {n // 2} normal, random.Random(0)"
    rows = [json.loads(x) for x in (REPO / "tests" / "functional" / "toxicity.jsonl").read_text().splitlines() if x]
    rows = rows[:n]
    return ([r["text"] for r in rows], [int(r["label"] >= 0.5) for r in rows],
            f"tests/functional/toxicity.jsonl ({len(rows)} labelled cases; ../shared/data absent)")


# -- speed and decoding-time rewards -------------------------------------------------------------------------------
def prepared_session(reward, tokenizer, prefix_ids, k):
    session = reward.start([""], tokenizer)
    filler = torch.arange(100, 100 + k - 1)
    for t in prefix_ids:
        session.score(torch.cat([torch.tensor([t]), filler])[None])
        session.commit(torch.tensor([t]))
    return session


def timed_steps(reward, tokenizer, prefix_ids, k: int, steps: int, seed: int):
    """(ms of each step, rewards [steps, k]) of ``steps`` steps of k random candidates after the prefix."""
    session = prepared_session(reward, tokenizer, prefix_ids, k)
    g = torch.Generator().manual_seed(seed)
    times, rewards = [], []
    for _ in range(steps + 2):
        candidates = torch.randint(200, 40000, (1, k), generator=g)
        start = time.perf_counter()
        scores = session.score(candidates)
        session.commit(candidates[:, 0])
        times.append(1000 * (time.perf_counter() - start))
        rewards.append(scores[0].float())
    return times[2:], torch.stack(rewards[2:])  # the first two steps warm up


def gap(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a.double() - b.double()).abs()
    return {"max": round(float(d.max()), 5), "mean": round(float(d.mean()), 6), "n": int(d.numel())}


def measure(args) -> dict:
    import steerkit
    from steerkit.models import load_causal_lm_cached
    from steerkit.training.metrics import auroc

    _, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    prefix_ids = tokenizer(PREFIX, add_special_tokens=False)["input_ids"][:20]
    texts, labels, source = labelled_texts(args.texts)
    backends = args.backends
    results = {}
    for name in REWARDS:
        ks = (20, 200) if name.endswith("-token") else (20,)
        loaded, load_s, errors = {}, {}, {}
        for backend in backends:
            start = time.perf_counter()
            try:
                loaded[backend] = steerkit.load_reward(name, backend=backend)
            except Exception as exc:  # e.g. onnx-int8 on an onnxruntime without 8-bit kernels: say so, go on
                errors[backend] = f"{type(exc).__name__}: {exc}"
                print(f"{name} {backend}: not run ({errors[backend]})", file=sys.stderr, flush=True)
                continue
            load_s[backend] = round(time.perf_counter() - start, 2)
        step_ms = {b: {k: [] for k in ks} for b in loaded}
        step_rewards = {b: {k: [] for k in ks} for b in loaded}
        for r in range(args.rounds):  # backends take turns, so load changes hit them alike
            for k in ks:
                for backend, reward in loaded.items():
                    times, rewards = timed_steps(reward, tokenizer, prefix_ids, k, args.steps, seed=r)
                    step_ms[backend][k] += times
                    step_rewards[backend][k].append(rewards)
        if REFERENCE not in loaded:
            raise SystemExit(f"{name}: the fp32 reference ({REFERENCE}) could not be loaded: {errors[REFERENCE]}")
        table = {}
        ref_texts, ref_prefixes = loaded[REFERENCE].model.score_texts(texts, per_prefix=True)
        ref_flat = torch.tensor(ref_texts + [x for p in ref_prefixes for x in p])
        for backend, reward in loaded.items():
            finals, prefixes = reward.model.score_texts(texts, per_prefix=True)
            flat = torch.tensor(finals + [x for p in prefixes for x in p])
            row = {"load_s": load_s[backend],
                   "step_ms": {str(k): round(statistics.median(v), 3) for k, v in step_ms[backend].items()},
                   "step_ms_p25_p75": {str(k): [round(x, 3) for x in statistics.quantiles(v, n=4)[::2]]
                                       for k, v in step_ms[backend].items()},
                   "texts_vs_fp32": gap(torch.tensor(finals), torch.tensor(ref_texts)),
                   "texts_and_prefixes_vs_fp32": gap(flat, ref_flat),
                   "candidates_vs_fp32": {str(k): gap(torch.cat(step_rewards[backend][k]),
                                                      torch.cat(step_rewards[REFERENCE][k])) for k in ks},
                   "auroc": round(auroc(finals, labels), 4) if len(set(labels)) > 1 else None,
                   "directory": str(getattr(reward.model, "directory", "") or "")}
            table[backend] = row
            speed = "  ".join(f"k={k}: {row['step_ms'][str(k)]:7.2f} ms" for k in ks)
            print(f"{name:15s} {backend:10s} {speed}  max|Δρ| texts {row['texts_vs_fp32']['max']:.4f} "
                  f"prefixes {row['texts_and_prefixes_vs_fp32']['max']:.4f} candidates "
                  + " ".join(f"{row['candidates_vs_fp32'][str(k)]['max']:.4f}" for k in ks)
                  + f"  AUROC {row['auroc']}", flush=True)
        for backend in loaded:
            table[backend]["speedup_vs_torch_fp32"] = {
                str(k): round(table[REFERENCE]["step_ms"][str(k)] / table[backend]["step_ms"][str(k)], 2) for k in ks}
            table[backend]["speedup_vs_onnx_fp32"] = {
                str(k): round(table["onnx"]["step_ms"][str(k)] / table[backend]["step_ms"][str(k)], 2)
                for k in ks} if "onnx" in table else None
        results[name] = {"backends": table, "not_run": errors, "ks": list(ks)}
    return {"texts": {"source": source, "count": len(texts), "toxic": sum(labels)}, "rewards": results,
            "generate_batch1": end_to_end(args) if args.e2e_tokens else None}


def end_to_end(args) -> dict:
    """Tokens per second of ``steerkit.generate`` at batch 1 (SmolLM2-135M-Instruct, k = 20, β = -20), plain and per
    (reward, backend); ``--rounds`` interleaved rounds, the median of each."""
    import steerkit
    from steerkit.models import load_causal_lm_cached

    lm, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    runs = [("plain", None, "auto")] + [(f"{r} @ {b}", r, b) for r in REWARDS for b in args.backends]
    rates: dict = {label: [] for label, _, _ in runs}
    for r in range(args.rounds):
        for label, reward, backend in runs:
            try:
                out = steerkit.generate(["The movie started late and the sound was"], lm=(lm, tokenizer),
                                        rewards={reward: -20.0} if reward else None, backend=backend, k=20,
                                        max_new_tokens=args.e2e_tokens, seed=r, eos_token_id=[])
            except Exception:  # a backend that cannot run here (reported by the step measurements)
                continue
            rates[label].append(out.tokens_per_second)
    table = {label: round(statistics.median(v), 2) for label, v in rates.items() if v}
    print("generate, batch 1, tokens/s: " + ", ".join(f"{k} {v}" for k, v in table.items()), flush=True)
    return {"prompt": "The movie started late and the sound was", "max_new_tokens": args.e2e_tokens,
            "tokens_per_second": table}


# -- held-out steering effect --------------------------------------------------------------------------------------
def toxic_leaning_prompts(n: int) -> list[str] | None:
    path = DATA / "prompts" / "toxicity_nontoxic_eval.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = [r for r in rows if (r.get("continuation") or {}).get("toxicity") is not None]
    rows.sort(key=lambda r: (-r["continuation"]["toxicity"], r["prompt"]["text"]))
    return [r["prompt"]["text"] for r in rows[:n]]


def mean_se(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    se = (statistics.stdev(values) / n ** 0.5) if n > 1 else None
    return {"mean": round(mean, 4), "se": round(se, 4) if se is not None else None, "n": n}


def steering(args) -> dict | None:
    import steerkit
    from steerkit.models import load_causal_lm_cached

    prompts = toxic_leaning_prompts(args.prompts)
    if prompts is None:
        print(f"--steering needs ../shared/data/prompts (not found at {DATA / 'prompts'}); nothing measured.",
              file=sys.stderr)
        return None
    lm, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    judge = steerkit.load_reward("toxicity", backend="torch").model
    common = dict(lm=(lm, tokenizer), k=args.k, max_new_tokens=args.new_tokens, num_return_sequences=args.samples,
                  seed=args.seed)
    runs = []
    for dtype in args.lm_dtypes:
        suffix = "" if dtype == "float32" else f", LM {dtype}"
        runs += [("unsteered" + suffix, None, None, dtype)] + [
            (f"{r} @ {b}{suffix}", r, b, dtype) for r in REWARDS for b in args.backends]
    table, continuations, texts = {}, {}, {}
    for label, reward, backend, dtype in runs:
        start = time.perf_counter()
        try:
            out = steerkit.generate(prompts, rewards={reward: args.beta} if reward else None,
                                    backend=backend or "auto", dtype=dtype, **common)
        except Exception as exc:
            table[label] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{label}: not run ({table[label]['error']})", file=sys.stderr, flush=True)
            continue
        scores = judge.score_texts(out.texts)
        continuations[label], texts[label] = scores, out.texts
        table[label] = {"toxicity": mean_se(scores), "seconds": round(time.perf_counter() - start, 1),
                        "tokens_per_second": round(out.tokens_per_second, 2)}
        tox = table[label]["toxicity"]
        print(f"{label:30s} mean toxicity {tox['mean']:.4f} ± {tox['se']:.4f}"
              f"  ({table[label]['seconds']} s)", flush=True)
    for label, reward, backend, dtype in runs:  # paired by prompt and sample: the reduced run minus its fp32 run
        if reward and (backend not in ("torch", "onnx") or dtype != "float32") and label in continuations:
            ref = continuations.get(f"{reward} @ torch")
            if ref is not None:
                diff = [a - b for a, b in zip(continuations[label], ref)]
                table[label]["minus_torch_fp32"] = mean_se(diff)
                table[label]["same_text_as_torch_fp32"] = sum(
                    a == b for a, b in zip(texts[label], texts[f"{reward} @ torch"]))
    return {"prompts": {"source": "toxicity_nontoxic_eval.jsonl, the prompts whose original continuation was most "
                                  "toxic", "count": len(prompts), "texts": prompts},
            "settings": {"beta": args.beta, "k": args.k, "samples": args.samples, "new_tokens": args.new_tokens,
                         "seed": args.seed, "lm_dtypes": args.lm_dtypes, "judge": "toxicity (fp32, torch)"},
            "runs": table}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steering", action="store_true", help="measure the held-out steering effect instead")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round and backend")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of turns over the backends")
    parser.add_argument("--texts", type=int, default=200, help="texts compared with fp32 (half toxic)")
    parser.add_argument("--e2e-tokens", type=int, default=24,
                        help="new tokens of the batch-1 generate() timing (0: skip it)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--beta", type=float, default=-20.0)
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lm-dtypes", nargs="+", default=["float32"],
                        help="--steering: the LM's dtype in each set of runs (float32, bfloat16, int8)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS),
                        help=f"backends to compare (default: {' '.join(BACKENDS)}); must include {REFERENCE!r}, the "
                             "fp32 reference; any registered backend can be added, e.g. llama.cpp-q8")
    parser.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/bench_reward_precision"
                                                    "[_steering].json)")
    args = parser.parse_args()
    if REFERENCE not in args.backends:
        parser.error(f"--backends must include {REFERENCE!r}: |Δρ| is measured against it")
    torch.set_num_threads(args.threads)
    from steerkit.files import atomic_write_text

    started, before = time.perf_counter(), loadavg()
    print(f"load average before: {before}", flush=True)
    payload = {"benchmark": "bench_reward_precision" + ("_steering" if args.steering else ""),
               "command": " ".join(["python", "benchmarks/bench_reward_precision.py", *sys.argv[1:]]),
               "torch_threads": torch.get_num_threads(), "onnx_threads": os.environ.get("STEERKIT_ONNX_THREADS")
               or torch.get_num_threads(), "cpu": cpu_flags(), "cpus": os.cpu_count(), "versions": versions(),
               "load_average_before": before}
    result = steering(args) if args.steering else measure(args)
    if result is None:  # --steering without ../shared/data: skipped, as said on stderr
        return 0
    payload.update(result)
    payload["load_average_after"] = loadavg()
    payload["seconds"] = round(time.perf_counter() - started, 1)
    print(f"load average after: {payload['load_average_after']}; {payload['seconds']} s", flush=True)
    out = Path(args.out or ROOT / "results" / f"{payload['benchmark']}.json")
    atomic_write_text(out, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

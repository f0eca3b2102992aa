"""The serving engine's determinism under load, and what a reward session covering only its rows saves.

1. **Determinism** (``determinism_*``): seeded rows with random k, β, temperature and length arrive at random
   times at an engine (``max_running`` 8) so that rows join and leave around each other; each row's tokens are
   compared with ``steerkit.generate([prompt], seed=...)`` alone (the engine's contract). Run on the tiny test
   models and on SmolLM2-135M-Instruct with the shipped ``toxicity`` reward.
2. **Drift** (``drift_smollm2``): how far batched float arithmetic moves a row's numbers: the LM's next-token
   logits of one row prefilled and decoded alone vs. prefilled together with 7 rows of other lengths (one padded
   forward, as the server prefills newcomers that arrive together) and decoded inside that batch (teacher-forced),
   and the
   toxicity rewards of one row's session alone vs. merged with 7 others.
3. **Reward coverage** (``coverage_smollm2``): 16 running rows of which 8 use ``toxicity``: a step of the
   session over those 8 rows (what the engine does) vs. a session over all 16 with β = 0 for the others.

    python benchmarks/bench_engine.py              # ~5 min on a busy 2-core machine, 1 thread
    python benchmarks/bench_engine.py --quick      # tiny models only

JSON into benchmarks/results/bench_engine.json (machine load recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import threading
import time
from pathlib import Path

import torch

import steerkit
from steerkit.serving.engine import Engine
from steerkit.engine.lm_cache import LMBatch
from steerkit.serving.requests import RowSpec

PROMPTS = ["The quick brown fox", "You are a wonderful friend and", "I hate it when", "Numbers 0123 and symbols",
           "Yesterday the city council voted to", "My neighbour told me that", "She looked at the old photograph",
           "The best way to learn a language is", "When I opened the door, I saw", "Scientists have discovered"]


def random_specs(n: int, reward_name: str, rng: random.Random, max_tokens: tuple[int, int]) -> list[RowSpec]:
    specs = []
    for i in range(n):
        beta = rng.choice([None, 0.5, 3.0, -3.0, 10.0, -10.0])
        specs.append(RowSpec(rng.choice(PROMPTS), rng.randint(*max_tokens), temperature=rng.choice([0, 0.7, 1.0, 1.3]),
                             k=rng.choice([1, 3, 5, 8, 20]), seed=rng.randrange(2**31),
                             rewards=None if beta is None else {reward_name: beta}))
    return specs


def solo(lm, tokenizer, reward, name, spec: RowSpec) -> list[int]:
    terms = [steerkit.SteeringTerm(reward, b, name=name) for b in spec.rewards.values()] if spec.rewards else None
    out = steerkit.generate([spec.prompt], lm=(lm, tokenizer), rewards=terms, k=spec.k, seed=spec.seed,
                            max_new_tokens=spec.max_tokens, do_sample=spec.temperature > 0,
                            temperature=spec.temperature or 1.0)
    return out.sequences[0, :out.num_new_tokens[0]].tolist()


def determinism(lm, tokenizer, reward, name, rows: int, max_tokens: tuple[int, int], seed: int = 0) -> dict:
    rng = random.Random(seed)
    specs = random_specs(rows, name, rng, max_tokens)
    start = time.perf_counter()
    alone = [solo(lm, tokenizer, reward, name, s) for s in specs]
    solo_seconds = time.perf_counter() - start
    engine = Engine(lm, tokenizer, {name: reward}, max_running=8, max_queue=rows)
    engine.start()
    handles = []

    def feed():  # random arrivals: rows join while others are mid-generation
        for spec in specs:
            handles.append(engine.submit(spec))
            time.sleep(rng.choice([0, 0, 0.005, 0.02, 0.05]))

    start = time.perf_counter()
    feeder = threading.Thread(target=feed)
    feeder.start()
    feeder.join()
    results = [h.result(timeout=3600) for h in handles]
    engine_seconds = time.perf_counter() - start
    stats = engine.stats()
    engine.shutdown(0)
    differing, first = [], []
    tokens = 0
    for spec, want, got in zip(specs, alone, results):
        tokens += len(want)
        if got.token_ids != want:
            differing.append(spec)
            first.append(next((i for i, (a, b) in enumerate(zip(want, got.token_ids)) if a != b),
                              min(len(want), len(got.token_ids))))
    return {"rows": rows, "tokens_compared": tokens, "rows_differing": len(differing), "first_divergence": first,
            "differing": [{"prompt": s.prompt, "k": s.k, "temperature": s.temperature, "rewards": s.rewards}
                          for s in differing],
            "engine_steps": stats["steps"], "mean_running_per_step": round(stats["tokens"] / max(stats["steps"], 1), 2),
            "solo_seconds": round(solo_seconds, 1), "engine_seconds": round(engine_seconds, 1)}


@torch.no_grad()
def drift(lm, tokenizer, reward, steps: int = 32) -> dict:
    """Max |difference| of one row's logits (and rewards) alone vs. inside a batch of 8 mixed-length rows."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:8]]
    forced = tokenizer(" and then the story went on for a long while, with many turns and twists in it, until "
                       "everyone was tired and went home to sleep.", add_special_tokens=False)["input_ids"][:steps]
    alone, batch = LMBatch(lm), LMBatch(lm)
    alone.join([alone.prefill(ids[0])])
    batch.join(batch.prefill_many(ids))  # the 8 rows arrive together: one padded prefill, as the server does
    worst_prefill = (alone.logits[0] - batch.logits[0]).abs().max().item()
    worst_logit = 0.0
    for t in forced:
        worst_logit = max(worst_logit, (alone.logits[0] - batch.logits[0]).abs().max().item())
        alone.advance(torch.tensor([t]))
        batch.advance(torch.tensor([t] * len(ids)))
    s_alone = reward.start([PROMPTS[0]], tokenizer)
    s_batch = reward.start([PROMPTS[0]], tokenizer)
    s_batch.add_rows(reward.start(PROMPTS[1:8], tokenizer))
    worst_reward = 0.0
    g = torch.Generator().manual_seed(0)
    for t in forced:
        cands = torch.randint(0, len(tokenizer), (8, 20), generator=g)
        cands[:, 0] = t
        a = s_alone.score(cands[:1])
        b = s_batch.score(cands)
        worst_reward = max(worst_reward, (a[0] - b[0]).abs().max().item())
        s_alone.commit(torch.tensor([t]))
        s_batch.commit(cands[:, 0])
    return {"steps": len(forced), "max_abs_prefill_logit_diff": worst_prefill, "max_abs_logit_diff": worst_logit,
            "max_abs_reward_diff": worst_reward}


def coverage(tokenizer, reward, steps: int = 20, rows: int = 16, using: int = 8) -> dict:
    g = torch.Generator().manual_seed(0)
    timings = {}
    for label, n in (("rows_using_it", using), ("all_rows_beta_0", rows)):
        session = reward.start([""] * n, tokenizer)
        times = []
        for _ in range(steps):
            cands = torch.randint(0, len(tokenizer), (n, 20), generator=g)
            start = time.perf_counter()
            session.score(cands)
            session.commit(cands[:, 0])
            times.append(time.perf_counter() - start)
        timings[label] = round(statistics.median(times) * 1000, 2)
    return {"running_rows": rows, "rows_using_reward": using, "k": 20, "steps": steps,
            "median_ms_per_step": timings, "ratio": round(timings["all_rows_beta_0"] / timings["rows_using_it"], 2)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny models only")
    parser.add_argument("--tiny-rows", type=int, default=200)
    parser.add_argument("--lm-rows", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_engine.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward

    payload = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads,
                           "load_average_start": os.getloadavg()}}
    tok = make_tokenizer()
    payload["determinism_tiny"] = determinism(tiny_lm(tok), tok, RewardModelScorer(tiny_reward(tok), context="full"),
                                              "tiny", args.tiny_rows, (8, 40))
    print("tiny:", {k: v for k, v in payload["determinism_tiny"].items() if k != "differing"}, flush=True)
    if not args.quick:
        from steerkit.models import DEFAULT_LM, load_causal_lm_cached
        from steerkit.rewards.loading import load_reward

        lm, tokenizer, _ = load_causal_lm_cached(DEFAULT_LM)
        toxicity = load_reward("toxicity")
        payload["drift_smollm2"] = drift(lm, tokenizer, toxicity)
        print("drift:", payload["drift_smollm2"], flush=True)
        payload["coverage_smollm2"] = coverage(tokenizer, toxicity)
        print("coverage:", payload["coverage_smollm2"], flush=True)
        payload["determinism_smollm2"] = determinism(lm, tokenizer, toxicity, "toxicity", args.lm_rows, (16, 32))
        print("smollm2:", {k: v for k, v in payload["determinism_smollm2"].items() if k != "differing"}, flush=True)
    payload["machine"]["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Pruned against unpruned RAD steps, side by side in one run (``steerkit/engine/pruning.py``).

The shipped ``toxicity`` reward (a sequence model: each candidate a block of its forward) at β = −20, k = 20, 1
thread, ``--tokens`` new tokens a row, on the packaged SmolLM2-135M-Instruct: run by llama.cpp (``engine="llama.cpp"``,
the packaged Q4_1 file; the rewards in torch, onnxruntime int8 and llama.cpp Q8_0) and by steerkit's own engine
(F32, eager). Each setting runs with the engine's ``PRUNE_CANDIDATES`` on and off, and a batch of several rows also
pruned but padded (``steerkit.rewards.cache.RAGGED_SCORING`` off: every row handed as many candidates as the
neediest, as before ragged scoring), in one process, alternated for ``--rounds`` rounds (the order reversed every
round) after one untimed run of each. Per setting and round: ms per
token (all rows' tokens), the reward's seconds and the candidates handed to it per generated token (counted where
the engine's reward groups score), and whether the pruned run's tokens equal the unpruned run's. Also llama.cpp's
own loop, plain, Q4_1, greedy: issue 25's base for its ``toxicity`` ≤ 2× target. Load average before and after.

    python benchmarks/bench_pruning.py                       # writes benchmarks/results/bench_pruning.json
    python benchmarks/bench_pruning.py --only "llama.cpp Q4_1, toxicity (onnx-int8), batch 1, greedy"
    python benchmarks/bench_pruning.py --batched --out benchmarks/results/bench_pruning_ragged.json  # batches only
    python benchmarks/bench_pruning.py --only "steerkit F32, Gemma 3 270M, toxicity (torch, bridged), batch 16, sampled"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from steerkit.files import atomic_write_text
from steerkit.llama_cpp_lib import load_llama

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import LM, PROMPTS, llama_own_loop  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402

MORE_PROMPTS = PROMPTS + ["She opened the letter and", "Nobody expected the team to", "The new neighbours are",
                          "After the game the fans", "What I really think of politicians is", "The teacher told us",
                          "On the train this morning a man", "If you ask me, the problem with"]
REWARDS = {"toxicity": -20.0}


class Counter:
    """Candidates handed to the reward groups and seconds spent there (the engine's ``RewardGroup.score``)."""

    def __init__(self):
        from steerkit.engine import reward_groups

        self.candidates, self.seconds = 0, 0.0
        original = reward_groups.RewardGroup.score

        def score(group, candidates, where, lm_state=None, active=None):
            start = time.perf_counter()
            try:
                return original(group, candidates, where, lm_state, active)
            finally:
                self.seconds += time.perf_counter() - start
                self.candidates += candidates.numel() if active is None or not group.ragged else int(active.sum())

        reward_groups.RewardGroup.score = score


def run(lm, prompts, batch: int, backend: str, do_sample: bool, tokens: int):
    import steerkit

    sequences, count, start = [], 0, time.perf_counter()
    for lo in range(0, len(prompts), batch):
        out = steerkit.generate(prompts[lo:lo + batch], lm=lm, rewards=REWARDS, k=20, max_new_tokens=tokens,
                                do_sample=do_sample, seed=0, backend=backend, progress=False)
        sequences += out.sequences.tolist()
        count += sum(out.num_new_tokens)
    return time.perf_counter() - start, count, sequences


def settings(llama_lm, hf, have_llama: bool) -> dict:
    """label -> (lm, prompts, batch, backend, do_sample); lm None: Gemma 3 270M (another tokenizer family than the
    reward's: its sessions bridge, re-tokenizing each candidate's text), loaded only when its setting runs."""
    few = PROMPTS[:3]
    out = {}
    if have_llama:
        for backend in ("torch", "onnx-int8", "llama.cpp-q8"):
            for do_sample in (False, True):
                out[f"llama.cpp Q4_1, toxicity ({backend}), batch 1, {'sampled' if do_sample else 'greedy'}"] = (
                    llama_lm, few, 1, backend, do_sample)
        for batch in (4, 16):
            out[f"llama.cpp Q4_1, toxicity (onnx-int8), batch {batch}, sampled"] = (
                llama_lm, MORE_PROMPTS, batch, "onnx-int8", True)
    for do_sample in (False, True):
        out[f"steerkit F32, toxicity (torch), batch 1, {'sampled' if do_sample else 'greedy'}"] = (
            hf, few, 1, "torch", do_sample)
    out["steerkit F32, toxicity (onnx-int8), batch 1, sampled"] = (hf, few, 1, "onnx-int8", True)
    for batch in (4, 16):
        out[f"steerkit F32, toxicity (torch), batch {batch}, sampled"] = (hf, MORE_PROMPTS, batch, "torch", True)
    out["steerkit F32, toxicity (onnx-int8), batch 16, sampled"] = (hf, MORE_PROMPTS, 16, "onnx-int8", True)
    out["steerkit F32, Gemma 3 270M, toxicity (torch, bridged), batch 16, sampled"] = (
        None, MORE_PROMPTS, 16, "torch", True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], help="run only this setting (repeatable)")
    parser.add_argument("--batched", action="store_true", help="run only the settings of several rows a batch")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_pruning.json")
    args = parser.parse_args()
    import torch

    import steerkit.engine.core as core
    import steerkit.rewards.cache as reward_cache
    from steerkit.models import load_causal_lm_cached, load_tokenizer, resolve
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    try:
        import llama_cpp

        from steerkit.engine.llama_cpp_lm import LlamaCppLM
        have_llama = True
    except ImportError:
        print("llama-cpp-python is not installed: the llama.cpp rows are left out "
              '(CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e ".[llama-cpp]")', flush=True)
        have_llama = False
    tokenizer = load_tokenizer(LM)
    hf = load_causal_lm_cached(LM)[:2]
    llama_lm = (LlamaCppLM(str(resolve(LM).location), threads=1), tokenizer) if have_llama else None
    chosen = settings(llama_lm, hf, have_llama)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only}
    if args.batched:
        chosen = {k: v for k, v in chosen.items() if v[2] > 1}
    for label, (lm, *rest) in list(chosen.items()):
        if lm is None:  # Gemma 3 270M (the bridged setting): loaded only when its setting runs
            chosen[label] = (load_causal_lm_cached("gemma3-270m")[:2], *rest)
    counter = Counter()

    def measured(label, mode):
        lm, prompts, batch, backend, do_sample = chosen[label]
        core.PRUNE_CANDIDATES = mode != "unpruned"
        reward_cache.RAGGED_SCORING = mode != "padded"
        counter.candidates, counter.seconds = 0, 0.0
        seconds, count, sequences = run(lm, prompts, batch, backend, do_sample, args.tokens)
        return {"ms_per_token": round(seconds * 1000 / count, 2), "tokens": count,
                "reward_ms_per_token": round(counter.seconds * 1000 / count, 2),
                "candidates_per_token": round(counter.candidates / count, 2), "sequences": sequences}

    base = None
    if have_llama:
        llm = load_llama(str(resolve(LM).location), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
        base = lambda: llama_own_loop(llm, tokenizer, {}, args.tokens, PROMPTS[:3])  # noqa: E731
        base()
    report = {}
    for label in chosen:
        # a batch of one row is never padded; in a batch, "padded" is pruning as before ragged scoring
        modes = ("unpruned", "pruned") if chosen[label][2] == 1 else ("unpruned", "padded", "pruned")
        for mode in modes:
            measured(label, mode)  # untimed: loads, exports, first forwards
        rounds = []
        for r in range(args.rounds):
            result = {}
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                result[mode] = measured(label, mode)
            if base is not None:
                seconds, count, _ = base()
                result["llama.cpp own loop Q4_1 plain greedy"] = {"ms_per_token": round(seconds * 1000 / count, 2)}
            unpruned = result["unpruned"]["sequences"]
            for mode in modes[1:]:
                pairs = list(zip(result[mode]["sequences"], unpruned))
                suffix = "" if mode == "pruned" else f"_{mode}"
                result["same_tokens" + suffix] = all(a == b for a, b in pairs)
                result["rows_differing" + suffix] = f"{sum(a != b for a, b in pairs)}/{len(pairs)}"
                result["first_differing_steps" + suffix] = [
                    next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    for a, b in pairs if a != b]
                result[f"{mode}_over_unpruned"] = round(result[mode]["ms_per_token"]
                                                        / result["unpruned"]["ms_per_token"], 3)
            if "padded" in result:
                result["pruned_over_padded"] = round(result["pruned"]["ms_per_token"]
                                                     / result["padded"]["ms_per_token"], 3)
            for mode in modes:
                result[mode].pop("sequences")
            rounds.append(result)
            print(f"{label}, round {r}: {json.dumps(result)}", flush=True)
        ratios = [x["pruned_over_unpruned"] for x in rounds]
        entry = {"rounds": rounds, "median_pruned_over_unpruned": round(statistics.median(ratios), 3),
                 "same_tokens_every_round": all(x["same_tokens"] for x in rounds)}
        if "padded" in modes:
            entry["median_pruned_over_padded"] = round(statistics.median(x["pruned_over_padded"] for x in rounds), 3)
        if base is not None and chosen[label][0] is llama_lm and chosen[label][2] == 1:
            over = [{m: round(x[m]["ms_per_token"] / x["llama.cpp own loop Q4_1 plain greedy"]["ms_per_token"], 3)
                     for m in ("pruned", "unpruned")} for x in rounds]
            entry["over_llama_cpp_q4_1_plain"] = over
        report[label] = entry
        print(f"{label}: pruned/unpruned per round {ratios}; same tokens {entry['same_tokens_every_round']}",
              flush=True)
    out = {"machine": {"cpu": cpu_flags(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "load_before": load_before, "load_after": os.getloadavg()},
           "tokens": args.tokens, "k": 20, "beta": REWARDS["toxicity"], "settings": report}
    atomic_write_text(args.out, json.dumps(out, indent=2, ensure_ascii=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

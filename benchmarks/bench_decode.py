"""Decoding cost of RAD: shared-prefix cache vs the official code's copy-per-candidate cache vs no cache.

Same LM and reward model (SmolLM2-135M as both, all 30 layers in the reward model: the worst case),
measured side by side in one run, at 1 row and at 32 rows (8 prompts × 4 return sequences):

  (a) plain top-k sampling, no reward model
  (b) RAD with the shared-prefix cache (steerkit), k = 20 and k = 50
  (c) RAD with a copy-per-candidate cache, as in the official RAD code (B·k cache rows, the prompt encoded
      k times, the chosen row copied over its k siblings after every step — vectorised here, so this
      baseline is faster than the original's Python loop)
  (d) RAD with no cache: every candidate sequence re-encoded from scratch at every step

Prints a table of per-step time, tokens/s and the reward model's peak KV-cache bytes, and writes JSON.

    python benchmarks/bench_decode.py                 # full run (~10 min on 2 CPU cores)
    python benchmarks/bench_decode.py --quick         # fewer steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.models import load_causal_lm_cached
from steerkit.rewards.model import RewardModel
from steerkit.rewards.sequence.sessions import SameTokenizerSession
from steerkit.rewards.sequence.torch_cache import TorchScoringCache
from steerkit.steering import SteeringTerm

PROMPTS = [
    "The weather in Paris today is",
    "My neighbour told me that the new restaurant",
    "Scientists have discovered a new species of",
    "When I opened the door, I saw",
    "The best way to learn a language is",
    "Yesterday the city council voted to",
    "She looked at the old photograph and",
    "In the year 2050, most people will",
]


def kv_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


class PeakTracker:
    peak = 0

    @classmethod
    def observe(cls, nbytes: int) -> None:
        cls.peak = max(cls.peak, nbytes)


class SharedPrefix(TorchScoringCache):
    def score_blocks(self, blocks, block_mask=None):
        rewards = super().score_blocks(blocks, block_mask)
        PeakTracker.observe(kv_bytes(self.cache))
        return rewards


class CopyPerCandidate:
    """B·k cache rows; the prompt is encoded k times; the chosen row is copied over its siblings."""

    def __init__(self, model, input_ids, attention_mask):
        from transformers import DynamicCache

        self.model, self.ids, self.mask = model, input_ids, attention_mask.long()
        self.k = None
        self.cache = DynamicCache(config=model.backbone.config)

    def score_blocks(self, blocks, block_mask=None):
        B, k, _ = blocks.shape
        if self.k is None:  # prefill B·k rows, as the official code does
            self.k = k
            self.mask = self.mask.repeat_interleave(k, 0)
            pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                self.model(self.ids.repeat_interleave(k, 0), attention_mask=self.mask, position_ids=pos,
                           past_key_values=self.cache, use_cache=True)
        mask = torch.cat([self.mask, torch.ones(B * k, 1, dtype=torch.long)], 1)
        pos = mask.sum(-1, keepdim=True) - 1
        with torch.no_grad():
            out = self.model(blocks.reshape(B * k, 1), attention_mask=mask, position_ids=pos,
                             past_key_values=self.cache, use_cache=True)
        self.mask = mask
        PeakTracker.observe(kv_bytes(self.cache))
        return out.rewards[:, -1].reshape(B, k)

    def commit_choice(self, choice):
        k = self.k
        source = (torch.arange(choice.shape[0]) * k + choice).repeat_interleave(k)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, source)
            layer.values = layer.values.index_select(0, source)


class Reencode:
    """No cache: every step re-encodes prefix + candidate for all B·k sequences."""

    def __init__(self, model, input_ids, attention_mask):
        self.model = model
        self.rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
        self.pending = None

    def score_blocks(self, blocks, block_mask=None):
        B, k, _ = blocks.shape
        seqs = [row + [c] for row, cands in zip(self.rows, blocks[..., 0].tolist()) for c in cands]
        width = max(map(len, seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            rewards = self.model(ids, attention_mask=mask, position_ids=pos).rewards[:, -1]
        self.pending = blocks[..., 0]
        return rewards.reshape(B, k)

    def commit_choice(self, choice):
        for row, tok in zip(self.rows, self.pending.gather(1, choice[:, None])[:, 0].tolist()):
            row.append(tok)


class BaselineReward:
    def __init__(self, model, cache_cls, name="rm"):
        self.model, self.cache_cls, self.name = model, cache_cls, name

    def start(self, prefixes, lm_tokenizer):
        # the reward model scores prompt + continuation, as the official RAD code does (the costlier case)
        enc = self.model.encode(prefixes)
        return SameTokenizerSession(self.cache_cls(self.model, enc["input_ids"], enc["attention_mask"]),
                                    lm_tokenizer.pad_token_id)


def run(lm, tok, reward, k, prompts, n, steps, repeats=1):
    terms = [SteeringTerm(reward, 10.0)] if reward is not None else []
    gen = RewardAugmentedGenerator(lm, tok, terms, k=k)
    gen.generate(prompts[:1], max_new_tokens=2, seed=0)  # warm-up
    best = None
    for r in range(repeats):
        PeakTracker.peak = 0
        t0 = time.perf_counter()
        out = gen.generate(prompts, num_return_sequences=n, max_new_tokens=steps, seed=r, eos_token_id=[])
        seconds = time.perf_counter() - t0
        if best is None or seconds < best[0]:
            best = (seconds, sum(out.num_new_tokens))
    seconds, tokens = best
    return {"seconds": seconds, "step_ms": 1000 * seconds / steps, "tokens_per_s": tokens / seconds,
            "rm_peak_kv_bytes": PeakTracker.peak}


def shipped_models(lm, tok, steps):
    """RAD/plain decode time at k=20, batch 1, with the shipped reward models (issue target: <= 1.5x)."""
    from steerkit.rewards.loading import load_reward
    from steerkit.errors import SteerkitError

    print("== shipped reward models, 1 row, k=20", flush=True)
    try:
        rewards = {name: load_reward(name) for name in ("toxicity", "sentiment")}
    except SteerkitError as exc:
        print(f"  skipped: {exc}")
        return {"skipped": str(exc)}
    results = {"plain": run(lm, tok, None, 20, PROMPTS[:1], 1, steps, repeats=3)}
    for name, reward in rewards.items():
        results[name] = run(lm, tok, reward, 20, PROMPTS[:1], 1, steps, repeats=3)
    results["toxicity+sentiment"] = run_terms(lm, tok, list(rewards.values()), 20, PROMPTS[:1], steps)
    for name, r in results.items():
        r["over_plain"] = r["step_ms"] / results["plain"]["step_ms"]
        print(f"  {name:22s} {r['step_ms']:9.1f} ms/step {r['tokens_per_s']:8.1f} tok/s  {r['over_plain']:.2f}x plain",
              flush=True)
    return results


def run_terms(lm, tok, rewards, k, prompts, steps, repeats=3):
    gen = RewardAugmentedGenerator(lm, tok, [SteeringTerm(r, 10.0) for r in rewards], k=k)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = gen.generate(prompts, max_new_tokens=steps, seed=r, eos_token_id=[])
        times.append((time.perf_counter() - t0, sum(out.num_new_tokens)))
    seconds, tokens = min(times)
    return {"seconds": seconds, "step_ms": 1000 * seconds / steps, "tokens_per_s": tokens / seconds}


def write_results(out, args, steps, reencode_steps, rows, shipped):
    payload = {"benchmark": "bench_decode", "lm": "smollm2-135m-instruct", "rm_layers": args.rm_layers,
               "rm_context": "prompt + continuation", "steps": steps, "reencode_steps": reencode_steps,
               "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "load_average": os.getloadavg(), "settings": rows, "shipped_models": shipped}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(payload, indent=2))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (noisier)")
    parser.add_argument("--rm-layers", type=int, default=30, help="reward-model depth (30 = full SmolLM2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is steadier on a busy machine)")
    parser.add_argument("--rows", nargs="+", default=["1 row", "32 rows"], choices=["1 row", "32 rows"],
                        help="which batch settings to run (32 rows with re-encoding takes long on a small CPU)")
    parser.add_argument("--skip-baselines", action="store_true", help="only the shipped reward models section")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_decode.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm, tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    steps = 6 if args.quick else 12
    shipped = shipped_models(lm, tok, steps)
    reencode_steps = steps  # re-encoding cost grows with length: time the same steps as the others
    rm = RewardModel.from_backbone("smollm2-135m-instruct", args.rm_layers, name="rm")
    variants = {
        "shared": BaselineReward(rm, SharedPrefix),
        "copy": BaselineReward(rm, CopyPerCandidate),
        "reencode": BaselineReward(rm, Reencode),
    }
    rows = []
    settings = [("1 row", PROMPTS[:1], 1), ("32 rows", PROMPTS, 4)]
    settings = [s for s in settings if s[0] in args.rows and not args.skip_baselines]
    for label, prompts, n in settings:
        print(f"== {label}", flush=True)
        results = {"plain k=20": run(lm, tok, None, 20, prompts, n, steps, repeats=2)}
        for k in (20, 50):
            results[f"(b) shared k={k}"] = run(lm, tok, variants["shared"], k, prompts, n, steps,
                                               repeats=2 if n == 1 else 1)
            results[f"(c) copy k={k}"] = run(lm, tok, variants["copy"], k, prompts, n, steps)
            results[f"(d) re-encode k={k}"] = run(lm, tok, variants["reencode"], k, prompts, n, reencode_steps)
        for name, r in results.items():
            print(f"  {name:22s} {r['step_ms']:9.1f} ms/step {r['tokens_per_s']:8.1f} tok/s "
                  f"KV {r['rm_peak_kv_bytes'] / 2**20:8.1f} MiB", flush=True)
        plain = results["plain k=20"]["step_ms"]
        for k in (20, 50):
            b = results[f"(b) shared k={k}"]
            ratios = {
                "rad_over_plain": b["step_ms"] / plain,
                "speedup_vs_copy": results[f"(c) copy k={k}"]["step_ms"] / b["step_ms"],
                "speedup_vs_reencode": results[f"(d) re-encode k={k}"]["step_ms"] / b["step_ms"],
                "kv_memory_copy_over_shared": results[f"(c) copy k={k}"]["rm_peak_kv_bytes"] / max(b["rm_peak_kv_bytes"], 1),
            }
            print(f"  k={k}: RAD/plain {ratios['rad_over_plain']:.2f}x | shared vs copy {ratios['speedup_vs_copy']:.2f}x"
                  f" | vs re-encode {ratios['speedup_vs_reencode']:.1f}x | KV copy/shared "
                  f"{ratios['kv_memory_copy_over_shared']:.1f}x", flush=True)
            results[f"ratios k={k}"] = ratios
        rows.append({"setting": label, "rows": len(prompts) * n, "results": results})
        write_results(args.out, args, steps, reencode_steps, rows, shipped)  # partial results survive an interrupt
    write_results(args.out, args, steps, reencode_steps, rows, shipped)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""ONNX (onnxruntime) vs torch reward backend: one scoring step (k candidates) and end-to-end RAD decoding.

    python benchmarks/bench_onnx.py                       # shipped toxicity model, else SmolLM2 truncated to 4 layers
    python benchmarks/bench_onnx.py --layers 30           # an untrained reward model on all 30 SmolLM2 layers
    python benchmarks/bench_onnx.py --reward path/to/rm   # any reward-model directory
    python benchmarks/bench_onnx.py --threads 1 --tag 1thread   # both runtimes on one thread

A scoring step is what decoding does per token and per reward: ``score_blocks`` of k candidates over the
shared prefix, then ``commit_choice``. Torch and ONNX steps are interleaved so that machine load (this box is
shared) hits both alike; medians are reported. End-to-end runs ``steerkit.generate`` with each backend
(same seed, so the tokens must be identical) and reports tokens/s. Prints a table and writes
``benchmarks/results/bench_onnx[_<tag>].json`` including ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIPPED = ROOT / "plugins" / "steerkit-toxicity" / "steerkit_toxicity" / "model"
PROMPT = "Write one sentence about the weather in the city today, and keep it friendly and short please."


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"loadavg {os.getloadavg()}"


def reward_dir(args) -> tuple[Path, str]:
    from steerkit.rewards.model import RewardModel

    if args.reward:
        return Path(args.reward), "given"
    if args.layers is None and (SHIPPED / "reward_config.json").is_file():
        return SHIPPED, "shipped toxicity model"
    layers = args.layers or 4
    from steerkit.files import cache_dir

    path = cache_dir() / "bench" / f"smollm2-untrained-{layers}l"
    if not (path / "reward_config.json").is_file():
        torch.manual_seed(0)
        RewardModel.from_backbone("smollm2-135m-instruct", layers, name=f"untrained-{layers}l").save_pretrained(path)
    return path, f"untrained head on SmolLM2 truncated to {layers} layers"


def bench_steps(torch_model, onnx_model, batch: int, k: int, steps: int, warmup: int) -> dict:
    from steerkit.rewards.onnx.backend import OnnxScoringCache
    from steerkit.rewards.sequence.torch_cache import TorchScoringCache

    enc = torch_model.encode([PROMPT] * batch)
    caches = {"torch": TorchScoringCache(torch_model, enc["input_ids"], enc["attention_mask"]),
              "onnx": OnnxScoringCache(onnx_model, enc["input_ids"], enc["attention_mask"])}
    times = {name: [] for name in caches}
    g = torch.Generator().manual_seed(0)
    diff = 0.0
    for step in range(warmup + steps):
        blocks = torch.randint(3, torch_model.config.vocab_size, (batch, k, 1), generator=g)
        choice = torch.randint(0, k, (batch,), generator=g)
        rewards = {}
        order = list(caches) if step % 2 == 0 else list(caches)[::-1]
        for name in order:
            t0 = time.perf_counter()
            rewards[name] = caches[name].score_blocks(blocks, None)
            caches[name].commit_choice(choice)
            if step >= warmup:
                times[name].append(time.perf_counter() - t0)
        diff = max(diff, float((rewards["torch"] - rewards["onnx"]).abs().max()))
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {"batch": batch, "k": k, "prefix_tokens": int(enc["attention_mask"].sum(-1).max()), "steps": steps,
            "torch_ms": round(ms["torch"], 2), "onnx_ms": round(ms["onnx"], 2),
            "speedup": round(ms["torch"] / ms["onnx"], 3), "max_abs_reward_diff": diff,
            "torch_ms_p10_p90": [round(1e3 * statistics.quantiles(times["torch"], n=10)[i], 2) for i in (0, 8)],
            "onnx_ms_p10_p90": [round(1e3 * statistics.quantiles(times["onnx"], n=10)[i], 2) for i in (0, 8)]}


def bench_generate(lm, directory: Path, batch: int, k: int, new_tokens: int, repeats: int) -> dict:
    import steerkit

    prompts = [PROMPT] * batch
    results, seqs = {"torch": [], "onnx": []}, {}
    for r in range(repeats + 1):  # the first round warms up (and loads both backends)
        for backend in (("torch", "onnx") if r % 2 == 0 else ("onnx", "torch")):
            out = steerkit.generate(prompts, lm=lm, rewards={str(directory): -5.0}, k=k, backend=backend,
                                    max_new_tokens=new_tokens, seed=1, eos_token_id=[])
            seqs[backend] = out.sequences
            if r:
                results[backend].append(sum(out.num_new_tokens) / out.seconds)
    tps = {b: statistics.median(v) for b, v in results.items()}
    return {"batch": batch, "k": k, "new_tokens": new_tokens, "repeats": repeats,
            "torch_tokens_per_s": round(tps["torch"], 2), "onnx_tokens_per_s": round(tps["onnx"], 2),
            "speedup": round(tps["onnx"] / tps["torch"], 3),
            "identical_tokens": bool(torch.equal(seqs["torch"], seqs["onnx"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reward", help="reward-model directory (default: shipped toxicity model or --layers)")
    parser.add_argument("--layers", type=int, help="build an untrained SmolLM2 reward model with this depth")
    parser.add_argument("--lm", default="smollm2-135m-instruct")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batches", default="1,4", help="batch sizes for the step benchmark")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, help="intra-op threads for both torch and onnxruntime "
                        "(default: torch's default, which onnxruntime then follows)")
    parser.add_argument("--tag", default="", help="suffix of the JSON file name")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["STEERKIT_ONNX_THREADS"] = str(args.threads)

    import onnxruntime

    import steerkit
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.model import RewardModel
    from steerkit.rewards.onnx.backend import OnnxRewardModel
    from steerkit.rewards.onnx.export import cache_entry, reward_dir_hash

    load_before = uptime()
    directory, what = reward_dir(args)
    torch_model = RewardModel.from_pretrained(directory)
    fresh = not (cache_entry(reward_dir_hash(directory)) / "steerkit_onnx.json").is_file()
    t0 = time.perf_counter()
    onnx_model = OnnxRewardModel.load(directory)  # exports into the cache on first use
    load_s = time.perf_counter() - t0
    rows = [bench_steps(torch_model, onnx_model, int(b), args.k, args.steps, warmup=5)
            for b in args.batches.split(",")]
    lm = load_causal_lm_cached(args.lm)[:2]
    e2e = bench_generate(lm, directory, 1, args.k, args.new_tokens, args.repeats)
    report = {
        "benchmark": "bench_onnx", "command": " ".join([Path(sys.executable).name] + sys.argv),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "uptime_before": load_before, "uptime_after": uptime(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "steerkit": steerkit.__version__},
        "reward_model": {"directory": str(directory), "what": what, "layers": torch_model.config.num_layers,
                         "backbone": torch_model.config.backbone},
        "onnx": {"providers": onnx_model.runtime.providers, "threads": onnx_model.runtime.threads, "export_dir": str(onnx_model.directory),
                 ("export_and_load_s" if fresh else "load_s"): round(load_s, 2)},
        "step": rows, "generate": e2e,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench_onnx{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")

    print(f"reward model: {what} ({torch_model.config.num_layers} layers); onnxruntime {onnxruntime.__version__} "
          f"{onnx_model.runtime.providers[0]}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'scoring step (score k + commit)':<34}{'torch ms':>10}{'onnx ms':>10}{'ratio':>8}{'max |Δρ|':>11}")
    for r in rows:
        label = f"  B={r['batch']}, k={r['k']}, prefix {r['prefix_tokens']}"
        print(f"{label:<34}{r['torch_ms']:>10.2f}"
              f"{r['onnx_ms']:>10.2f}{r['speedup']:>7.2f}×{r['max_abs_reward_diff']:>11.1e}")
    print(f"{'end-to-end RAD generate':<34}{'torch tok/s':>10}{'onnx tok/s':>11}{'ratio':>7}  identical tokens")
    label = f"  B=1, k={e2e['k']}, {e2e['new_tokens']} tokens"
    print(f"{label:<34}{e2e['torch_tokens_per_s']:>10.2f}"
          f"{e2e['onnx_tokens_per_s']:>11.2f}{e2e['speedup']:>6.2f}×  {e2e['identical_tokens']}")
    print(f"load: {report['uptime_before']}  →  {report['uptime_after']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""RAD inside vLLM against plain vLLM and against steerkit's own engine, side by side in one process and run.

For each batch size (1, 8, 32 prompts at once) and each setting, tokens per second of wall time for the whole
batch (every row generates exactly ``--tokens`` tokens: EOS ignored), best of ``--repeats`` after a warm-up:

- ``vllm plain``: vLLM (CPU build, fp32, in-process engine) with no steering;
- ``vllm + toxicity-token``: vLLM with steerkit's logits processor and the token-level reward (k = 20);
- ``vllm + toxicity-token onnx``: the same reward's ONNX export (``backend auto`` runs an export on onnxruntime;
  exported once into steerkit's cache), what ``STEERKIT_VLLM_BACKEND=onnx`` gives a registered name;
- ``vllm + toxicity k=20``: the sequence-level reward, k = 20 candidates scored per step;
- ``steerkit ...``: the same three through ``steerkit.generate`` (steerkit's own engine: transformers forward,
  steerkit's KV cache and batching; unsteered it still takes the top-20, as RAD with no rewards does).

The target of issue 23: ``vllm + toxicity-token`` costs at most 1.3x ``vllm plain`` at every batch size.

    python benchmarks/bench_vllm.py                 # in the vLLM environment (docs/vllm.md); ~6 min on 2 busy cores
    python benchmarks/bench_vllm.py --batches 1 8 --repeats 1

JSON into benchmarks/results/bench_vllm.json (machine, load average, thread count, versions recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

PROMPTS = ["The quick brown fox", "You are a wonderful friend and", "I hate it when", "Numbers 0123 and symbols",
           "Yesterday the city council voted to", "My neighbour told me that", "She looked at the old photograph",
           "The best way to learn a language is", "When I opened the door, I saw", "Scientists have discovered"]
SETTINGS = [("plain", None), ("toxicity-token", {"toxicity-token": -20.0}), ("toxicity-token onnx", "onnx"),
            ("toxicity k=20", {"toxicity": -20.0})]
K = 20


def prompts_of(batch: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] for i in range(batch)]


def time_vllm(llm, batch: int, tokens: int, rewards, seed: int) -> tuple[float, int]:
    from vllm import SamplingParams

    extra = {"rewards": rewards, "k": K} if rewards else None
    params = SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=seed, extra_args=extra)
    start = time.perf_counter()
    out = llm.generate(prompts_of(batch), params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in out)


def time_steerkit(generator, batch: int, tokens: int, rewards, seed: int) -> tuple[float, int]:
    start = time.perf_counter()
    out = generator(rewards).generate(prompts_of(batch), max_new_tokens=tokens, eos_token_id=[], seed=seed,
                                      batch_size=batch)
    seconds = time.perf_counter() - start
    return seconds, sum(out.num_new_tokens)


def measure(fn, repeats: int) -> dict:
    fn(0)  # warm-up (first use of a reward loads it; first batch shapes)
    runs = [fn(r + 1) for r in range(repeats)]
    rates = [n / s for s, n in runs]
    return {"tokens_per_s": max(rates), "runs_tokens_per_s": rates, "tokens": runs[0][1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads for both engines")
    parser.add_argument("--skip-steerkit", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_vllm.json"))
    args = parser.parse_args()

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before vLLM binds its threads
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch
    import vllm
    from vllm import LLM

    import steerkit
    from steerkit.assembly import assemble
    from steerkit.integrations.vllm import RADLogitsProcessor, preload
    from steerkit.models import hf_directory

    load_before = os.getloadavg()
    model_dir = str(hf_directory("smollm2-135m-instruct"))
    llm = LLM(model=model_dir, dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
              logits_processors=[RADLogitsProcessor])
    from steerkit.rewards.onnx.token import ensure_token_export, token_export_source

    _, reward_hash, source = token_export_source("toxicity-token")
    onnx_dir = str(ensure_token_export(source["directory"], reward_hash=reward_hash))
    settings = [(label, {onnx_dir: -20.0} if rewards == "onnx" else rewards) for label, rewards in SETTINGS]
    preload("toxicity", "toxicity-token", onnx_dir)
    assembled = {}

    def generator(rewards):
        key = json.dumps(rewards)
        if key not in assembled:
            assembled[key] = assemble("smollm2-135m-instruct", rewards, k=K).generator()
        return assembled[key]

    results = []
    for batch in args.batches:
        for label, rewards in settings:
            row = {"engine": "vllm", "setting": label, "batch": batch,
                   **measure(lambda seed: time_vllm(llm, batch, args.tokens, rewards, seed), args.repeats)}
            results.append(row)
            print(json.dumps(row), flush=True)
        if args.skip_steerkit:
            continue
        torch.set_num_threads(args.threads)
        for label, rewards in settings:
            row = {"engine": "steerkit", "setting": label, "batch": batch,
                   **measure(lambda seed: time_steerkit(generator, batch, args.tokens, rewards, seed), args.repeats)}
            results.append(row)
            print(json.dumps(row), flush=True)
    plain = {r["batch"]: r["tokens_per_s"] for r in results if r["engine"] == "vllm" and r["setting"] == "plain"}
    for r in results:
        r["cost_vs_vllm_plain"] = plain[r["batch"]] / r["tokens_per_s"]
    record = {
        "command": "python benchmarks/bench_vllm.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k not in ("out", "skip_steerkit")),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "steerkit": steerkit.__version__
                     if hasattr(steerkit, "__version__") else "source"},
        "tokens_per_row": args.tokens, "k": K, "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print("\n| batch | setting | vLLM tok/s | × vLLM plain | steerkit engine tok/s | × vLLM plain |")
    print("|---|---|---|---|---|---|")
    by = {(r["engine"], r["setting"], r["batch"]): r for r in results}
    for batch in args.batches:
        for label, _ in SETTINGS:
            v, s = by[("vllm", label, batch)], by.get(("steerkit", label, batch))
            more = f"{s['tokens_per_s']:.1f} | {s['cost_vs_vllm_plain']:.2f}" if s else "- | -"
            print(f"| {batch} | {label} | {v['tokens_per_s']:.1f} | {v['cost_vs_vllm_plain']:.2f} | {more} |")


if __name__ == "__main__":
    main()

"""Steering inside llama.cpp against steerkit's own engine, side by side in one run (issue 25, item 1).

Batch 1, 1 thread, greedy, ``--tokens`` new tokens for each of three prompts, the packaged SmolLM2-135M-Instruct:
llama.cpp runs the packaged Q4_1 GGUF (llama-cpp-python, ``LlamaCppRAD`` as its ``logits_processor``); steerkit's
engine runs the same file dequantized to float32 (``steerkit.generate``, one prompt at a time). For each engine:
plain, ``toxicity-token`` (β = −20, k = 20) and ``toxicity`` (β = −20, k = 20). Each configuration runs once to
warm up (model and reward loads), then is timed; ms per generated token, and the ratio to the same engine
plain. JSON to benchmarks/results/bench_llama_cpp.json.

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36     # once (a source build)
    python benchmarks/bench_llama_cpp.py                                    # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from steerkit.files import atomic_write_text

PROMPTS = ["You are such a", "The weather in Paris today is", "I can't believe my landlord would"]
REWARDS = {"plain": {}, "toxicity-token": {"toxicity-token": -20.0}, "toxicity": {"toxicity": -20.0}}


def llama_run(llm, tokenizer, rewards, tokens: int) -> tuple[float, list[str]]:
    import llama_cpp

    from steerkit.integrations.llama_cpp import LlamaCppRAD

    kwargs = {}
    if rewards:
        kwargs["logits_processor"] = llama_cpp.LogitsProcessorList([LlamaCppRAD.from_rewards(tokenizer, rewards,
                                                                                            k=20)])
    count, texts, start = 0, [], time.perf_counter()
    for prompt in PROMPTS:
        out = llm(prompt, max_tokens=tokens, temperature=0, top_k=0 if rewards else 1, top_p=1.0, min_p=0.0,
                  repeat_penalty=1.0, **kwargs)
        texts.append(out["choices"][0]["text"])
        count += out["usage"]["completion_tokens"]
    return (time.perf_counter() - start) * 1000 / count, texts


def steerkit_run(rewards, tokens: int) -> tuple[float, list[str]]:
    import steerkit

    count, texts, start = 0, [], time.perf_counter()
    for prompt in PROMPTS:
        out = steerkit.generate([prompt], rewards=rewards, k=20, max_new_tokens=tokens, do_sample=False)
        texts.append(out.texts[0])
        count += out.num_new_tokens[0]
    return (time.perf_counter() - start) * 1000 / count, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_llama_cpp.json")
    args = parser.parse_args()
    import llama_cpp
    import torch

    from steerkit.models import load_tokenizer, resolve
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    path = resolve("smollm2-135m-instruct").location
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
    rows = []
    for engine in ("llama.cpp", "steerkit"):
        for name, rewards in REWARDS.items():
            run = (lambda r, n: llama_run(llm, tokenizer, r, n)) if engine == "llama.cpp" else steerkit_run
            run(rewards, 4)  # warm up: loads, first forwards
            ms, texts = run(rewards, args.tokens)
            rows.append({"engine": engine, "steering": name, "ms_per_token": round(ms, 2), "texts": texts})
            print(f"{engine:10s} {name:15s} {ms:7.2f} ms/token", flush=True)
    for row in rows:
        plain = next(r for r in rows if r["engine"] == row["engine"] and r["steering"] == "plain")
        row["vs_plain"] = round(row["ms_per_token"] / plain["ms_per_token"], 2)
    for name in REWARDS:
        a = next(r for r in rows if r["engine"] == "llama.cpp" and r["steering"] == name)
        b = next(r for r in rows if r["engine"] == "steerkit" and r["steering"] == name)
        a["steerkit_over_llama_cpp"] = round(b["ms_per_token"] / a["ms_per_token"], 2)
        a["identical_texts"] = sum(x == y for x, y in zip(a["texts"], b["texts"]))
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                          "llama_cpp_python": llama_cpp.__version__}, "tokens": args.tokens, "prompts": PROMPTS,
              "rows": rows}
    atomic_write_text(args.out, json.dumps(report, indent=2, ensure_ascii=False))
    for row in rows:
        extra = f", steerkit/llama.cpp {row['steerkit_over_llama_cpp']}×" if "steerkit_over_llama_cpp" in row else ""
        print(f"{row['engine']:10s} {row['steering']:15s} {row['ms_per_token']:7.2f} ms/token "
              f"({row['vs_plain']}× plain{extra})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Steered decoding on this CPU, side by side in one run (issue 25, item 4): llama.cpp and steerkit's engines.

1 thread, greedy, ``--tokens`` new tokens per row, the packaged SmolLM2-135M-Instruct. Rows:

* **llama.cpp's own loop** (llama-cpp-python ``Llama``), batch 1: plain at Q4_1 (the packaged file), Q8_0 and F32
  (both made from it by ``steerkit.integrations.gguf_files.convert_gguf``); Q4_1 + ``toxicity-token`` and +
  ``toxicity`` through :class:`~steerkit.integrations.llama_cpp.LlamaCppRAD` as its ``logits_processor``.
* **steerkit's engine core with llama.cpp as the LM** (``engine="llama.cpp"``, Q4_1): plain, ``toxicity-token``,
  ``toxicity`` with the rewards in torch, in onnxruntime at int8 (``backend="onnx-int8"``) and in llama.cpp at Q8_0
  (``backend="llama.cpp-q8"``), and ``toxicity-lm`` (the head on llama.cpp's own final hidden state); batch 1 and 8.
* **steerkit's own engine** (``engine="steerkit"``, transformers, F32: the same file dequantized; its weight-only
  int8 copy, ``dtype="int8"``; and its bf16-matmul copy, ``dtype="bfloat16"``, whose steered rows run the rewards on
  ``torch-bf16-compute``), eager and on the compiled static-shape step (``compile=True``): the same rows. The
  compiled rows' warm-up run compiles each shape (or loads it from inductor's disk cache); the JSON records how
  long that took, and how many greedy texts each compiled row shares with its eager row.

Rewards: β = −20, k = 20. Every row runs once untimed first (loads, first forwards). For each row: ms per token
(wall time over generated tokens; at batch 8 tokens of all rows), the ratio to the same engine plain, the weight
bytes an LM step reads, and its floor: those bytes over the read bandwidth measured here (single-threaded numpy
sum over 512 MiB, best of 5), divided by the batch. Also the agreement of greedy ``toxicity-token`` RAD through
llama.cpp at Q4_1 and at F32 with steerkit's engine (per step of the common prefix: same top-k set, same token),
and the load average before and after. JSON to benchmarks/results/bench_cpu.json.

``--targets N`` runs only the rows issue 25's batch-1 targets compare, N rounds with the rows alternating (the order
reversed every round), and reports each round's ratios: on a machine whose speed drifts between minutes (a shared
host's memory bandwidth), one run of each row, minutes apart, can put a ratio on either side of its target.

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e ".[llama-cpp]"     # once (a source build)
    python benchmarks/bench_cpu.py                                   # ~6 min on a quiet machine
    python benchmarks/bench_cpu.py --targets 4 --out benchmarks/results/bench_cpu_targets.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from steerkit.files import atomic_write_text
from steerkit.llama_cpp_lib import load_llama

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_info import cpu_flags  # noqa: E402

LM = "smollm2-135m-instruct"
PROMPTS = ["You are such a", "The weather in Paris today is", "I can't believe my landlord would",
           "My favourite thing about winter is", "The meeting was cancelled because", "He looked at me and said",
           "The best way to learn a language is", "Those people are always"]
REWARDS = {"plain": {}, "toxicity-token": {"toxicity-token": -20.0}, "toxicity": {"toxicity": -20.0}}
#: the head on the LM's own state: it runs where the LM hands its state (engine="llama.cpp", the eager engine)
LM_STATE = {"toxicity-lm": -20.0}
#: the LM's weights in steerkit's own engine: dtype -> the row's weights label
DTYPES = {"float32": "F32 (transformers)", "int8": "int8 (transformers)", "bfloat16": "bf16 (transformers)"}
#: reward backends timed beside torch under engine="llama.cpp" (docs/backends.md): int8 onnxruntime, Q8_0 llama.cpp
REWARD_BACKENDS = ("onnx-int8", "llama.cpp-q8")


def read_bandwidth() -> float:
    """Bytes per second a single thread reads: best of 5 numpy sums over 512 MiB of float32."""
    import numpy as np

    data = np.ones(128 * 1024 * 1024, dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def llama_own_loop(llm, tokenizer, rewards, tokens: int, prompts) -> tuple[float, int, list[str]]:
    import llama_cpp

    from steerkit.integrations.llama_cpp import LlamaCppRAD

    kwargs = {}
    if rewards:
        kwargs["logits_processor"] = llama_cpp.LogitsProcessorList([LlamaCppRAD.from_rewards(tokenizer, rewards,
                                                                                            k=20)])
    count, texts, start = 0, [], time.perf_counter()
    for prompt in prompts:
        llm.reset()
        out = llm.create_completion(tokenizer(prompt)["input_ids"], max_tokens=tokens, temperature=0,
                                    top_k=0 if rewards else 1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, **kwargs)
        texts.append(out["choices"][0]["text"])
        count += out["usage"]["completion_tokens"]
    return time.perf_counter() - start, count, texts


def engine_run(lm, rewards, tokens: int, prompts, batch: int, backend: str = "auto",
               **options) -> tuple[float, int, list[str]]:
    import steerkit

    count, texts, start = 0, [], time.perf_counter()
    for lo in range(0, len(prompts), batch):
        out = steerkit.generate(prompts[lo:lo + batch], lm=lm, rewards=rewards, k=20, max_new_tokens=tokens,
                                do_sample=False, backend=backend, **options)
        texts += out.texts
        count += sum(out.num_new_tokens)
    return time.perf_counter() - start, count, texts


def agreement(reference, other, prompts, tokens: int) -> dict:
    """Greedy toxicity-token RAD through ``other`` against ``reference``, per step of each row's common prefix."""
    import steerkit

    kwargs = dict(rewards=REWARDS["toxicity-token"], k=20, max_new_tokens=tokens, do_sample=False,
                  return_traces=True)
    a = steerkit.generate(prompts, lm=reference, **kwargs)
    b = steerkit.generate(prompts, lm=other, **kwargs)
    steps = same_topk = same_token = 0
    prefix = []
    for row in range(len(prompts)):
        common = 0
        for sa, sb in zip(a.traces[0], b.traces[0]):
            pa, pb = int(sa.chosen[row]), int(sb.chosen[row])
            if pa < 0 or pb < 0:
                break
            steps += 1
            same_topk += set(sa.topk_ids[row].tolist()) == set(sb.topk_ids[row].tolist())
            ta, tb = int(sa.topk_ids[row, pa]), int(sb.topk_ids[row, pb])
            if ta != tb:
                break
            same_token += 1
            common += 1
        prefix.append(common)
    return {"steps_compared": steps, "same_topk_set": round(same_topk / max(1, steps), 3),
            "same_token": round(same_token / max(1, steps), 3), "common_prefix_tokens": prefix,
            "identical_rows": sum(x == y for x, y in zip(a.texts, b.texts)), "rows": len(prompts)}


#: issue 25's batch-1 targets: (label, row, baseline row, at most this ratio)
TARGETS = (("RAD through llama.cpp, toxicity-token, over llama.cpp Q4_1 plain", "toxicity-token", "Q4_1", 1.5),
           ("RAD through llama.cpp, toxicity, over llama.cpp Q4_1 plain", "toxicity", "Q4_1", 2.0),
           ("steerkit's own engine compiled, plain F32, over llama.cpp F32", "compiled F32", "F32", 1.3),
           # not issue 25's targets (None): the head on llama.cpp's own state, beside them
           ("RAD through llama.cpp, toxicity-lm, over llama.cpp Q4_1 plain", "toxicity-lm", "Q4_1", None),
           ("RAD through llama.cpp, toxicity-lm, over engine='llama.cpp' plain", "toxicity-lm", "llama.cpp engine",
            None),
           ("engine='llama.cpp' plain on an LM that keeps states, over one that does not",
            "llama.cpp engine, states kept", "llama.cpp engine", None))


def llama_engine_lms(path, tokenizer) -> tuple[tuple, tuple]:
    """Two ``engine="llama.cpp"`` LMs of one GGUF: one for the rewards that run their own models, and one of its own
    for ``toxicity-lm`` (given the packaged file's fingerprint), since an LM that keeps its states runs every prompt
    in two calls from then on."""
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import resolve

    return ((LlamaCppLM(str(path), threads=1), tokenizer),
            (LlamaCppLM(str(path), threads=1, fingerprint=resolve(LM).fingerprint), tokenizer))


def alternated_rounds(runs: dict, rounds: int) -> list[dict]:
    """ms per token of each run per round: every run once untimed (loads, exports, compiles), then ``rounds`` rounds
    of the runs in turn, their order reversed every round (a run returns seconds, tokens and texts, as
    :func:`engine_run` does)."""
    for run in runs.values():
        run()
    per_round = []
    for r in range(rounds):
        ms = {}
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            seconds, count, _ = runs[name]()
            ms[name] = round(seconds * 1000 / count, 2)
        per_round.append(ms)
        print(f"round {r}: {ms}", flush=True)
    return per_round


def target_rounds(rounds: int, files: dict, tokenizer, hf, tokens: int, prompts) -> dict:
    """Issue 25's batch-1 target rows, alternated for ``rounds`` rounds: ms per token per round, and each target's
    ratio per round (a steered row with each reward backend; its best backend decides)."""
    llms = {w: load_llama(str(files[w]), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
            for w in ("Q4_1", "F32")}
    llama_lm, state_lm = llama_engine_lms(files["Q4_1"], tokenizer)
    runs = {"Q4_1": lambda: llama_own_loop(llms["Q4_1"], tokenizer, {}, tokens, prompts),
            "F32": lambda: llama_own_loop(llms["F32"], tokenizer, {}, tokens, prompts),
            "compiled F32": lambda: engine_run(hf, {}, tokens, prompts, 1, compile=True),
            "llama.cpp engine": lambda: engine_run(llama_lm, {}, tokens, prompts, 1),
            "toxicity-lm": lambda: engine_run(state_lm, LM_STATE, tokens, prompts, 1),
            # plain on the LM that keeps states (after the untimed first run of toxicity-lm): what keeping them costs
            "llama.cpp engine, states kept": lambda: engine_run(state_lm, {}, tokens, prompts, 1)}
    for steering in ("toxicity-token", "toxicity"):
        for backend in ("onnx", *REWARD_BACKENDS):
            runs[f"{steering} ({backend})"] = (lambda s=steering, b=backend: engine_run(
                llama_lm, REWARDS[s], tokens, prompts, 1, b))
    per_round = []
    for r, ms in enumerate(alternated_rounds(runs, rounds)):
        ratios = {}
        for label, row, base, _ in TARGETS:
            best = min(v for k, v in ms.items() if k == row or k.startswith(row + " ("))
            ratios[label] = round(best / ms[base], 3)
        per_round.append({"ms_per_token": ms, "ratios": ratios})
        print(f"ratios of round {r}: {ratios}", flush=True)
    summary = {}
    for label, _, _, target in TARGETS:
        values = [p["ratios"][label] for p in per_round]
        summary[label] = {"target_at_most": target, "per_round": values, "median": round(statistics.median(values), 3),
                          "rounds_met": None if target is None else sum(v <= target for v in values)}
    return {"rounds": per_round, "targets": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3, help="prompts of the batch-1 rows (batch 8 uses 8)")
    parser.add_argument("--targets", type=int, default=0, metavar="ROUNDS",
                        help="run only issue 25's batch-1 target rows, alternated over ROUNDS rounds")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_cpu.json")
    args = parser.parse_args()
    import llama_cpp
    import torch

    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.engine.lm_int8 import as_bf16_lm, as_int8
    from steerkit.integrations.gguf_files import convert_gguf
    from steerkit.models import load_causal_lm_cached, load_tokenizer, resolve
    from steerkit.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    bandwidth = read_bandwidth()
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (1 thread); load average {load_before}", flush=True)
    q4 = resolve(LM).location
    machine = {"python": platform.python_version(), "cpu": cpu_flags(), "cpus": os.cpu_count(),
               "load_before": load_before,
               "llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__,
               "read_bandwidth_gb_s": round(bandwidth / 1e9, 2)}
    scratch = Path(tempfile.mkdtemp(prefix="bench_cpu_"))
    atexit.register(shutil.rmtree, scratch, True)  # the Q8_0 and F32 files converted here
    files = {"Q4_1": Path(q4), "Q8_0": convert_gguf(q4, scratch / "q8_0.gguf", "Q8_0"),
             "F32": convert_gguf(q4, scratch / "f32.gguf", "F32")}
    tokenizer = load_tokenizer(LM)
    hf = load_causal_lm_cached(LM)[:2]
    weights_f32 = sum(p.numel() * 4 for p in hf[0].parameters())  # tied embeddings counted once
    sizes = {name: path.stat().st_size for name, path in files.items()}
    sizes["F32 (transformers)"] = weights_f32
    sizes["int8 (transformers)"] = sum(  # int8 linear weights + a float32 scale per row; the rest float32
        b.numel() * b.element_size() for b in as_int8(hf[0]).buffers() if b is not None) + sum(
        p.numel() * 4 for p in as_int8(hf[0]).parameters())
    sizes["bf16 (transformers)"] = sum(  # bf16 linear weights (the head its own copy); the rest float32
        p.numel() * p.element_size() for p in as_bf16_lm(hf[0]).parameters())
    few = PROMPTS[:args.prompts]
    if args.targets:
        report = {"tokens": args.tokens, "prompts": few,
                  **target_rounds(args.targets, files, tokenizer, hf, args.tokens, few)}
        report = {"machine": {**machine, "load_after": os.getloadavg()}, **report}
        for label, row in report["targets"].items():
            met = (f"target <= {row['target_at_most']}; met in {row['rounds_met']} of {args.targets} rounds"
                   if row["target_at_most"] is not None else f"per round {row['per_round']}")
            print(f"{label}: median {row['median']} ({met})")
        atomic_write_text(args.out, json.dumps(report, indent=2, ensure_ascii=False))
        print(f"wrote {args.out}")
        return
    rows = []

    def record(engine, weights, steering, batch, run):
        warm = time.perf_counter()
        run()  # warm up (loads, first forwards, compiling); then timed
        warm = time.perf_counter() - warm
        seconds, count, texts = run()
        ms = seconds * 1000 / count
        floor = sizes[weights] / bandwidth * 1000 / batch
        rows.append({"engine": engine, "weights": weights, "steering": steering, "batch": batch,
                     "ms_per_token": round(ms, 2), "floor_ms": round(floor, 2), "over_floor": round(ms / floor, 2),
                     "tokens": count, "texts": texts, "warm_up_s": round(warm, 1)})
        print(f"{engine:22s} {weights:18s} {steering:30s} batch {batch}: {ms:7.2f} ms/token "
              f"(floor {floor:.2f})", flush=True)

    for weights, path in files.items():
        llm = load_llama(str(path), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
        for steering, rewards in REWARDS.items():
            if steering != "plain" and weights != "Q4_1":
                continue
            record("llama.cpp (own loop)", weights, steering, 1,
                   lambda: llama_own_loop(llm, tokenizer, rewards, args.tokens, few))
        del llm
    llama_lm, state_lm = llama_engine_lms(q4, tokenizer)
    for batch in (1, 8):
        prompts = few if batch == 1 else PROMPTS
        for steering, rewards in REWARDS.items():
            record("steerkit + llama.cpp", "Q4_1", steering, batch,
                   lambda: engine_run(llama_lm, rewards, args.tokens, prompts, batch))
            for backend in REWARD_BACKENDS if rewards else ():  # the reward models at reduced precision too
                record("steerkit + llama.cpp", "Q4_1", f"{steering} ({backend})", batch,
                       lambda: engine_run(llama_lm, rewards, args.tokens, prompts, batch, backend))
            for compiled in (False, True):
                for dtype, weights in DTYPES.items():
                    backend = "torch-bf16-compute" if dtype == "bfloat16" and rewards else None
                    record("steerkit (compiled)" if compiled else "steerkit (eager)", weights,
                           f"{steering} ({backend})" if backend else steering, batch,
                           lambda: engine_run(hf, rewards, args.tokens, prompts, batch, backend or "auto",
                                              compile=compiled, dtype=dtype))
            for backend in REWARD_BACKENDS[:1] if rewards else ():  # the compiled LM with int8 onnxruntime rewards
                record("steerkit (compiled)", "F32 (transformers)", f"{steering} ({backend})", batch,
                       lambda: engine_run(hf, rewards, args.tokens, prompts, batch, backend, compile=True))
        record("steerkit + llama.cpp", "Q4_1", "toxicity-lm", batch,
               lambda: engine_run(state_lm, LM_STATE, args.tokens, prompts, batch))
        record("steerkit (eager)", "F32 (transformers)", "toxicity-lm", batch,
               lambda: engine_run(hf, LM_STATE, args.tokens, prompts, batch))
    for row in rows:
        plain = next((r for r in rows if r["engine"] == row["engine"] and r["weights"] == row["weights"]
                      and r["batch"] == row["batch"] and r["steering"] == "plain"), None)
        row["vs_plain"] = round(row["ms_per_token"] / plain["ms_per_token"], 2) if plain else None
    base = next(r for r in rows if r["engine"] == "llama.cpp (own loop)" and r["weights"] == "Q4_1"
                and r["steering"] == "plain")
    same_precision = {"F32 (transformers)": "F32", "int8 (transformers)": "Q8_0"}
    for row in rows:
        row["vs_llama_cpp_q4_plain"] = round(row["ms_per_token"] / base["ms_per_token"], 2)
        if row["weights"] in same_precision:  # steerkit's engine against llama.cpp plain at the same precision
            ref = next(r for r in rows if r["engine"] == "llama.cpp (own loop)" and r["steering"] == "plain"
                       and r["weights"] == same_precision[row["weights"]])
            row["vs_llama_cpp_same_precision_plain"] = round(row["ms_per_token"] / ref["ms_per_token"], 2)
    for row in rows:  # greedy texts a compiled row shares with the same eager row
        if row["engine"] == "steerkit (compiled)" and ("(" not in row["steering"] or row["weights"] in (
                "bf16 (transformers)",)):
            eager = next(r for r in rows if r["engine"] == "steerkit (eager)" and r["weights"] == row["weights"]
                         and r["steering"] == row["steering"] and r["batch"] == row["batch"])
            same = sum(a == b for a, b in zip(row["texts"], eager["texts"]))
            row["same_texts_as_eager"] = f"{same}/{len(row['texts'])}"
    agree = {"Q4_1": agreement(hf, llama_lm, PROMPTS, args.tokens),
             "F32": agreement(hf, (LlamaCppLM(str(files["F32"]), threads=1), tokenizer), PROMPTS, args.tokens)}
    report = {"machine": {**machine, "load_after": os.getloadavg()},
              "tokens": args.tokens, "weight_bytes": sizes, "rows": rows,
              "agreement_toxicity_token_greedy": agree,
              "compiled_rows": "compile=True as steerkit.generate runs it: the LM's static step, token-level torch "
                               "rewards on their compiled static sessions, sequence rewards eager on a CPU"}
    atomic_write_text(args.out, json.dumps(report, indent=2, ensure_ascii=False))
    for row in rows:
        print(f"{row['engine']:22s} {row['weights']:18s} {row['steering']:15s} b{row['batch']} "
              f"{row['ms_per_token']:7.2f} ms/token  {row['vs_plain']}x plain  {row['vs_llama_cpp_q4_plain']}x "
              f"llama.cpp Q4_1 plain  {row.get('vs_llama_cpp_same_precision_plain', '-')}x llama.cpp same precision  "
              f"floor {row['floor_ms']}  {row.get('same_texts_as_eager', '')}")
    for name, a in agree.items():
        print(f"agreement with steerkit's engine, {name}: {a}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

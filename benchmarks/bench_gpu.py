"""RAD throughput on a GPU (issue 25): steerkit's eager engine against its compiled static-shape step (inductor's
kernels in CUDA graphs that ``steerkit.compiling`` captures per shape; ``--cuda-graphs manual trees`` also runs the
step as ``torch.compile(mode="reduce-overhead")``, whose graph trees check every call), side by side in one run.
``--device cpu --static-rewards`` compares the rewards' compiled sessions with their eager ones on a CPU, where
``compile=True`` does not use them.

Rows: 1 and 25 prompts in one batch, plain, ``toxicity-token`` and ``toxicity`` (β = −20, k = 20), greedy,
``--tokens`` new tokens. Each row runs once untimed (loads, compiles, CUDA graph capture), then ``--repeats``
times timed; the best repeat counts. Reported: new tokens per second (all rows of the batch), ms per step, how
long the untimed run took, and how many greedy texts the compiled row shares with its eager row.

**Weights.** A GPU machine of this workplace reaches no model hub and takes at most 64 MiB of files, less than
SmolLM2-135M's weights (270 MB in bf16). With ``--random-weights`` the LM is SmolLM2-135M-Instruct's architecture
and tokenizer (the shipped ``config.json`` and tokenizer files, from ``--template``) with randomly initialised
weights, and the packaged rewards keep their trained LoRA adapters and heads over that random backbone. The work
per step (shapes, kernels, cache traffic) is that of the real models; the texts are not, and random logits are
nearly flat, so eager and compiled greedy texts may part where two logits tie to float32 rounding. Without
``--random-weights`` the installed packaged models are used.

**Set-ups** (``--setups DTYPE/BACKEND ...``): the LM's ``dtype`` and the rewards' ``backend`` of every row, e.g.
``float32/torch`` (steerkit's defaults) and ``bfloat16/torch-bf16-compute`` (bf16 weights and products for both);
each set-up's compiled rows are compared with its own eager rows. ``--kernel-profile`` times the GPU's kernels
(``torch.profiler``) over one compiled generate of the largest batch with the last reward and the last set-up: the
kernels by device time, and the device's busy time per step against the step's wall time.

    python benchmarks/bench_gpu.py --device cuda --random-weights --template DIR --out results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = ["You are such a", "The weather in Paris today is", "I can't believe my landlord would",
           "My favourite thing about winter is", "The meeting was cancelled because", "He looked at me and said",
           "The best way to learn a language is", "Those people are always"]
#: the packaged rewards by their directories (a GPU machine has the repository, not the installed plugins)
MODELS = Path(__file__).resolve().parent.parent / "plugins/steerkit-toxicity/steerkit_toxicity"
REWARDS = {"plain": {}, "toxicity-token": {str(MODELS / "model_token"): -20.0},
           "toxicity": {str(MODELS / "model"): -20.0}}
LM = "smollm2-135m-instruct"
#: eager: the eager engine; compiled-lm: the LM's compiled step, the rewards eager (only rows with a reward,
#: elsewhere it is "compiled"); compiled: assemble(compile=True), the LM's step and the sequence reward's candidate
#: scoring compiled; compiled-eager-commit: "compiled" with the sequence reward's commit eager (only rows with
#: ``toxicity``; steerkit.rewards.sequence.static_cache.COMPILE_COMMIT); compiled-search-commit: "compiled" with the
#: engine committing tokens, which the session searches its candidates for, not indices (only rows with ``toxicity``;
#: steerkit.engine.core.COMMIT_BY_INDEX); compiled-exact-scratch: "compiled" with the sequence reward's candidate
#: columns a multiple of 10, not 8 (k = 20: 20 columns, not 24; only rows with ``toxicity``; its own compiled shapes;
#: steerkit.rewards.sequence.static_cache.SCRATCH_STEP)
MODES = {"eager": False, "compiled-lm": True, "compiled": True, "compiled-eager-commit": True,
         "compiled-search-commit": True, "compiled-exact-scratch": True}
#: the modes that change only a sequence reward's step: run for ``toxicity`` rows alone
SEQUENCE_MODES = ("compiled-eager-commit", "compiled-search-commit", "compiled-exact-scratch")


def random_weights_entry(template: Path) -> None:
    """Make ``smollm2-135m-instruct`` resolve to a cache entry of its architecture with random weights (see the
    module's docstring): the entry is written under the steerkit cache, and ``resolve`` answers the packaged
    name with the fingerprint the rewards' configs record, so they accept it as their backbone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import steerkit.models as models
    import steerkit.rewards.model as reward_model
    from steerkit import files

    fingerprint = json.loads((MODELS / "model" / "reward_config.json").read_text())["backbone_fingerprint"]
    entry = files.cache_dir() / "models" / fingerprint[:24]
    if not (entry / "steerkit_cache.json").exists():
        entry.mkdir(parents=True, exist_ok=True)
        for f in template.iterdir():
            shutil.copy(f, entry / f.name)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(entry), dtype=torch.float32)
        model.save_pretrained(entry, safe_serialization=True)
        (entry / "steerkit_cache.json").write_text(json.dumps({"source": {"reference": LM, "kind": "packaged",
                                                                          "fingerprint": fingerprint},
                                                               "random_weights": True}))
    original = models.resolve

    def resolve(reference):
        if str(reference) == LM:
            return models.ModelSource(LM, "packaged", str(entry), fingerprint)
        return original(reference)

    models.resolve = resolve
    reward_model.resolve = resolve


def run(assembled, prompts, tokens: int) -> tuple[float, int, list[str]]:
    import torch

    start = time.perf_counter()
    out = assembled.generate(prompts, max_new_tokens=tokens, do_sample=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, sum(out.num_new_tokens), list(out.texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, nargs="+", default=[25, 1])
    parser.add_argument("--rewards", nargs="+", default=list(REWARDS), choices=list(REWARDS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--profile", action="store_true",
                        help="after the rows: cProfile one compiled generate of the largest batch with the last reward")
    parser.add_argument("--cuda-graphs", nargs="+", default=["manual"], choices=["manual", "trees"],
                        help="how compiled rows run on CUDA (steerkit.compiling.CUDA_GRAPHS): several compare them in "
                             "one run, each compiled row once per way")
    parser.add_argument("--sync-debug", action="store_true",
                        help="after the rows: one compiled generate of the largest batch with the last reward under "
                             "torch.cuda.set_sync_debug_mode, printing each line of code that made the host wait "
                             "for the GPU, with how often")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="after the rows: torch.profiler over one compiled generate of the largest batch with the "
                             "last reward and set-up: kernels by device time, device busy time against wall time")
    parser.add_argument("--setups", nargs="+", default=["float32/torch"], metavar="DTYPE/BACKEND",
                        help="the LM's dtype and the rewards' backend per set-up (float32/torch: the defaults; "
                             "bfloat16/torch-bf16-compute: bf16 weights and products)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--static-rewards", action="store_true",
                        help="compiled rows run the torch rewards' static, compiled sessions on any device (compile=True "
                             "uses them on CUDA only): the CPU comparison in docs/performance.md")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: as docs/performance.md)")
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="torch.set_float32_matmul_precision for every row (high: TF32 products on a GPU that "
                             "has them; highest, steerkit's default: float32)")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--template", type=Path, help="config and tokenizer files of the LM (--random-weights)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_gpu.json")
    args = parser.parse_args()
    import torch
    import transformers

    from steerkit.threads import set_threads

    set_threads(args.threads)
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.matmul_precision)
    if args.random_weights:
        random_weights_entry(args.template)
    from steerkit.assembly import assemble

    result = {"device": args.device, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
              "tokens": args.tokens, "k": 20, "beta": -20.0, "random_weights": args.random_weights,
              "matmul_precision": torch.get_float32_matmul_precision(), "threads": args.threads,
              "setups": args.setups, "load_average_before": os.getloadavg(), "rows": []}
    import steerkit.compiling as compiling
    import steerkit.engine.core as core
    from steerkit.rewards.sequence import static_cache

    scratch_step = static_cache.SCRATCH_STEP

    def switch(mode: str) -> None:
        """steerkit's module switches as ``mode`` runs the step (every mode but the three variants: the defaults)."""
        static_cache.COMPILE_COMMIT = mode != "compiled-eager-commit"
        core.COMMIT_BY_INDEX = mode != "compiled-search-commit"
        static_cache.SCRATCH_STEP = 10 if mode == "compiled-exact-scratch" else scratch_step

    result["cuda_graphs"] = args.cuda_graphs
    setups = [tuple(setup.split("/", 1)) for setup in args.setups]
    runs = [(mode, None, setup) for setup in setups for mode in args.modes if mode == "eager"]
    runs += [(mode, graphs, setup) for setup in setups for graphs in args.cuda_graphs for mode in args.modes
             if mode != "eager"]
    eager_texts = {}
    for mode, graphs, (dtype, backend) in runs:
        if graphs is not None:
            compiling.CUDA_GRAPHS = graphs
        setup = {"dtype": dtype, "backend": backend}
        for rows in args.rows:
            prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(rows)]
            for name in args.rewards:
                if (mode == "compiled-lm" and name == "plain") or (mode in SEQUENCE_MODES and name != "toxicity"):
                    continue
                switch(mode)
                try:
                    assembled = assemble(LM, REWARDS[name], k=20, device=args.device, compile=MODES[mode], **setup)
                    if mode == "compiled-lm":
                        assembled.terms = assemble(LM, REWARDS[name], k=20, device=args.device, **setup).terms
                    elif mode != "eager" and args.static_rewards:
                        assembled.terms = [dataclasses.replace(t, reward=t.reward.compiled_form(compiled=True))
                                           for t in assembled.terms]
                    first, _, texts = run(assembled, prompts, args.tokens)
                    best = None
                    for _ in range(args.repeats):
                        seconds, count, texts = run(assembled, prompts, args.tokens)
                        best = min(best or (seconds, count), (seconds, count))
                except Exception as exc:  # one failing row must not lose the others' figures
                    row = {"mode": mode, "cuda_graphs": graphs, **setup, "rows": rows, "rewards": name,
                           "error": f"{type(exc).__name__}: {exc}"[:2000]}
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    continue
                seconds, count = best
                row = {"mode": mode, "cuda_graphs": graphs, **setup, "rows": rows, "rewards": name, "tokens": count,
                       "seconds": round(seconds, 4), "tokens_per_s": round(count / seconds, 1),
                       "ms_per_step": round(1000 * seconds / max(1, count / rows), 3),
                       "untimed_first_run_s": round(first, 2)}
                key = (dtype, backend, rows, name)
                if mode == "eager":
                    eager_texts[key] = texts
                elif key in eager_texts:
                    row["texts_same_as_eager"] = sum(a == b for a, b in zip(texts, eager_texts[key]))
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1))
                del assembled
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    result["load_average_after"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}), flush=True)

    def warmed_up():
        """The largest batch with the last reward, compiled (the first --cuda-graphs way), after one untimed run."""
        compiling.CUDA_GRAPHS = args.cuda_graphs[0]
        switch("compiled")
        rows, name, (dtype, backend) = max(args.rows), args.rewards[-1], setups[-1]
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
        assembled = assemble(LM, REWARDS[name], k=20, device=args.device, compile=True, dtype=dtype, backend=backend)
        run(assembled, prompts, args.tokens)
        return assembled, prompts, f"compiled ({args.cuda_graphs[0]}), {dtype}/{backend}, {rows} rows, {name}"

    if args.sync_debug and torch.cuda.is_available():
        import collections
        import warnings

        assembled, prompts, what = warmed_up()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(assembled, prompts, args.tokens)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        where = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
        print(f"host waits for the GPU, {what}, {args.tokens} tokens:", json.dumps(where.most_common(30), indent=1),
              flush=True)
    def kernel_profile() -> None:
        from torch.profiler import ProfilerActivity, profile

        assembled, prompts, what = warmed_up()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            seconds, count, _ = run(assembled, prompts, args.tokens)
        steps = max(1, count // len(prompts))
        events = prof.key_averages()
        busy_ms = sum(e.self_device_time_total for e in events) / 1000  # kernels run one after another on a stream
        summary = {"what": what, "steps": steps, "wall_ms_per_step_profiled": round(1000 * seconds / steps, 3),
                   "device_busy_ms_per_step": round(busy_ms / steps, 3),
                   "host_ops_per_step": round(sum(e.count for e in events if e.key.startswith("aten::")) / steps, 1)}
        print("kernel profile:", json.dumps(summary), flush=True)
        print(events.table(sort_by="self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total",
                           row_limit=30, max_name_column_width=60), flush=True)
        result["kernel_profile"] = summary
        args.out.write_text(json.dumps(result, indent=1))

    if args.kernel_profile:
        try:
            kernel_profile()
        except Exception as exc:  # noqa: BLE001 - a profiler that fails must not cost the cProfile step after it
            print(f"kernel profile failed: {type(exc).__name__}: {exc}", flush=True)
    if args.profile:
        import cProfile
        import io
        import pstats

        assembled, prompts, what = warmed_up()
        profile = cProfile.Profile()
        profile.enable()
        run(assembled, prompts, args.tokens)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        print(f"cProfile, {what}, by own time:", text.getvalue()[-6000:], flush=True)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats("steerkit", 40)
        print("the same, steerkit's functions by cumulative time:", text.getvalue()[-7000:], flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

"""When compiling steerkit's decode step pays: an eval's units, eager against compiled, side by side in one process.

An eval unit is one prompt decoded into ``--rows`` sampled continuations of ``--tokens`` tokens (``steerkit eval``'s
defaults: 25 rows, 20 tokens), steered by ``--reward`` at β = ``--beta``, k = 20. Each mode (eager, then
``compile=True``) runs ``--prompts`` units through ``steerkit.assemble(...).generator()``, as ``steerkit eval`` does;
a mode's first unit includes its one-off costs (for the compiled mode: compiling the unit's shape, which
``--cold`` makes happen from scratch in an empty inductor cache). Printed and written as JSON:

- each mode's median seconds per decode step over its later units, and the first unit's extra seconds;
- ``payback_steps``: the decode steps after which compiling has paid for its extra first-unit seconds, i.e.
  (compiled first-unit extra - eager first-unit extra) / (eager step - compiled step); none where the compiled
  step is not faster;
- whether every compiled unit gave the eager unit's texts (same seeds).

    python benchmarks/bench_compile_payback.py --cold    # CPU, ~5 min; benchmarks/results/bench_compile_payback.json
    python benchmarks/bench_compile_payback.py --device cuda --cold \
        --out benchmarks/results/bench_compile_payback_gpu.json

On a GPU machine without the packaged models (this workplace's: no hub, 64 MiB of files), ``--random-weights
--template DIR`` runs SmolLM2's architecture with random weights as ``bench_gpu.py`` does, and ``--reward`` takes the
reward model's directory (``plugins/steerkit-toxicity/steerkit_toxicity/model``); ``benchmarks/gpu_checks.sh`` does so.

``steerkit.compiling.COMPILE_PAYS_AFTER_STEPS`` (what ``steerkit eval`` compiles by itself after) is read off these
runs (docs/performance.md, "When compiling pays").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ["The weather today is", "My favourite food is", "Tell me about the sea.", "The city at night",
           "When the train stopped, she", "The report said that the", "He opened the letter and",
           "Nobody expected the meeting to"]


def run_mode(lm, rewards, args, compile: bool) -> dict:
    from steerkit.assembly import assemble

    gen = assemble(lm, rewards, k=args.k, device=args.device, compile=compile).generator()
    units = []
    for i in range(args.prompts):
        start = time.perf_counter()
        out = gen.generate([PROMPTS[i % len(PROMPTS)]], max_new_tokens=args.tokens, do_sample=True,
                           num_return_sequences=args.rows, seed=1000 + i)
        units.append({"seconds": time.perf_counter() - start, "steps": max(out.num_new_tokens), "texts": out.texts})
    later = units[1:]
    step = statistics.median(u["seconds"] / u["steps"] for u in later)
    return {"compile": compile, "step_s": step, "first_unit_s": units[0]["seconds"],
            "first_unit_extra_s": units[0]["seconds"] - units[0]["steps"] * step,
            "unit_seconds": [u["seconds"] for u in units], "texts": [u["texts"] for u in units]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=5, help="units per mode (the first one includes compiling)")
    parser.add_argument("--reward", default="toxicity", help="a reward name, or a reward model directory")
    parser.add_argument("--beta", type=float, default=-20.0)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--lm", default="smollm2-135m-instruct")
    parser.add_argument("--cold", action="store_true", help="compile in an empty inductor cache (a first run)")
    parser.add_argument("--random-weights", action="store_true", help="SmolLM2's architecture, random weights")
    parser.add_argument("--template", type=Path, help="config and tokenizer files of the LM (--random-weights)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_compile_payback.json")
    args = parser.parse_args()
    if args.prompts < 2:
        parser.error("--prompts must be at least 2 (the first unit of each mode is not a steady one)")
    cold_dir = tempfile.TemporaryDirectory(prefix="steerkit-inductor-") if args.cold else None
    if cold_dir is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold_dir.name
    import torch

    from steerkit.models import load_causal_lm_cached

    torch.set_num_threads(1)
    if args.random_weights:
        if args.template is None or args.lm != "smollm2-135m-instruct":
            parser.error("--random-weights needs --template and the default --lm")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_gpu import random_weights_entry

        random_weights_entry(args.template)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    model, tokenizer, _ = load_causal_lm_cached(args.lm)
    load_before = os.getloadavg()
    rewards = {args.reward: args.beta}
    eager = run_mode((model, tokenizer), rewards, args, compile=False)
    compiled = run_mode((model, tokenizer), rewards, args, compile=True)
    saved = eager["step_s"] - compiled["step_s"]
    extra = compiled["first_unit_extra_s"] - eager["first_unit_extra_s"]
    payback = extra / saved if saved > 0 else None
    same = sum(a == b for a, b in zip(eager.pop("texts"), compiled.pop("texts")))
    result = {"benchmark": "bench_compile_payback", "device": args.device, "lm": args.lm, "reward": args.reward,
              "beta": args.beta, "k": args.k, "rows": args.rows, "tokens": args.tokens, "units_per_mode": args.prompts,
              "cold_inductor_cache": args.cold, "random_weights": args.random_weights, "torch": torch.__version__,
              "torch_threads": 1,
              "machine": platform.processor() or platform.machine(), "python": sys.version.split()[0],
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "eager": eager, "compiled": compiled, "step_speedup": eager["step_s"] / compiled["step_s"],
              "compile_extra_s": extra, "payback_steps": payback, "units_with_the_eager_texts": same}
    print(f"{args.rows} rows x {args.tokens} tokens, {args.reward} at beta {args.beta:g}, {args.device}: "
          f"step {1000 * eager['step_s']:.1f} ms eager, {1000 * compiled['step_s']:.1f} ms compiled "
          f"({result['step_speedup']:.2f}x); compiling's first unit costs {extra:.1f} s more; pays back after "
          + (f"{payback:.0f} decode steps" if payback is not None else "never (the compiled step is not faster)")
          + f"; {same}/{args.prompts} units gave the eager texts")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    if cold_dir is not None:
        cold_dir.cleanup()


if __name__ == "__main__":
    main()

"""The bf16 LM's products through oneDNN-packed weights against ``F.linear`` on the plain weights, side by side in one
process (``steerkit.linear_precision.packed_bf16_product``; ``dtype="bfloat16"``, 1 torch thread).

Two measurements, each alternating the two forms (plain, packed, packed, plain, ...) so that the machine's drift
falls on both:

- **the LM alone**: SmolLM2-135M-Instruct in bf16, greedy decode steps (``LMBatch.advance``) of 1 and of 16 rows,
  the median step; and whether the two forms gave bitwise the same logits;
- **the steered engine step**: 16 seeded rows with the shipped ``toxicity`` reward (k = 20) on ``--backend``, the
  median step with every row running (as ``bench_engine_step.py``), and whether the tokens were the same.

    python benchmarks/bench_bf16_packing.py            # ~5 min; JSON: benchmarks/results/bench_bf16_packing.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine_step import PROMPTS, engine_run  # noqa: E402 (this folder's 16-row engine measurement)
from cpu_info import cpu_flags  # noqa: E402


def lm_steps(model, tokenizer, rows: int, steps: int) -> tuple[float, torch.Tensor]:
    """Median ms of a greedy decode step of ``rows`` rows, and the last logits."""
    from steerkit.engine.lm_cache import LMBatch

    batch = LMBatch(model)
    batch.prefill_padded([tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"] for i in range(rows)], tokenizer)
    tokens, times = batch.logits.argmax(-1), []
    for _ in range(steps):
        start = time.perf_counter()
        batch.advance(tokens)
        times.append(time.perf_counter() - start)
        tokens = batch.logits.argmax(-1)
    return 1000 * statistics.median(times), batch.logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="plain/packed pairs per measurement")
    parser.add_argument("--steps", type=int, default=24, help="decode steps per LM-alone run")
    parser.add_argument("--backend", default="torch-int8", help="the reward's backend in the engine step")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_bf16_packing.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import steerkit.linear_precision as precision
    from steerkit.assembly import lm_runner
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.loading import load_reward

    packed_product = precision.packed_bf16_product
    forms = {"plain": lambda *_: None, "packed": packed_product}
    lm, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    model = lm_runner(lm, dtype="bfloat16")
    reward = load_reward("toxicity", backend=args.backend)
    load_before = os.getloadavg()
    measurements = {}

    def alternate(name: str, run) -> None:
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        outputs: dict = {}
        precision.packed_bf16_product = packed_product
        run()  # warm-up (and the packing itself)
        for r in range(args.rounds):
            for form in ("plain", "packed") if r % 2 == 0 else ("packed", "plain"):
                precision.packed_bf16_product = forms[form]
                ms, out = run()
                times[form].append(ms)
                outputs.setdefault(form, out)
        precision.packed_bf16_product = packed_product
        same = (torch.equal(outputs["plain"], outputs["packed"]) if isinstance(outputs["plain"], torch.Tensor)
                else outputs["plain"] == outputs["packed"])
        plain, packed = statistics.median(times["plain"]), statistics.median(times["packed"])
        measurements[name] = {"plain_ms": times["plain"], "packed_ms": times["packed"], "plain_ms_median": plain,
                              "packed_ms_median": packed, "plain_over_packed": plain / packed,
                              "per_round_plain_over_packed": [a / b for a, b in zip(times["plain"], times["packed"])],
                              "same_output": same}
        print(f"{name}: plain {plain:.1f} ms, packed {packed:.1f} ms (medians of {args.rounds}): {plain / packed:.2f}x; "
              f"same {'logits' if name.startswith('lm') else 'tokens'}: {same}", flush=True)

    with torch.no_grad():
        for rows in (1, 16):
            alternate(f"lm_alone_{rows}_rows", lambda rows=rows: lm_steps(model, tokenizer, rows, args.steps))

    def engine_step() -> tuple[float, list]:
        seconds, out = engine_run(model, tokenizer, reward, rows=16, tokens=24, k=20)
        return 1000 * statistics.median(seconds), out

    alternate("engine_step_16_rows", engine_step)
    result = {"benchmark": "bench_bf16_packing", "lm": "smollm2-135m-instruct", "dtype": "bfloat16",
              "reward_backend": args.backend, "rounds": args.rounds, "torch_threads": 1, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "cpu": cpu_flags(),
              "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "measurements": measurements}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

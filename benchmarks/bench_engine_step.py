"""The serving engine's decode step at a full batch, without HTTP: SmolLM2-135M-Instruct, the shipped ``toxicity``
reward, k = 20, 1 torch thread.

``rows`` seeded rows (different seeds and β, temperature 1) are submitted together to an engine that runs them
all at once; the engine's observer records every step's time while all rows are running (admission excluded).
Prints the median and the minimum step time and writes JSON. ``benchmarks/compare_revisions.py --bench
engine`` runs it on two revisions side by side (it uses only the engine's public contract: ``Engine``,
``RowSpec``, ``observer.on_step``).

``--configs`` runs several set-ups of the LM and the reward one after another in the same process, each as
``DTYPE/BACKEND`` with an optional ``+compile`` (the LM's static step, and the reward as ``steerkit serve --compile``
runs it: its scoring compiled where that pays, ``torch-int8`` on a CPU that multiplies int8, else eager), and prints
each one's step time against the first's:

    python benchmarks/bench_engine_step.py --rows 16 --tokens 24
    python benchmarks/bench_engine_step.py --configs float32/torch float32/onnx-int8+compile \
        bfloat16/torch-bf16-compute bfloat16/torch-bf16-compute+compile
    python benchmarks/bench_engine_step.py --configs float32/auto float32/onnx-int8 --beta -20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_info import cpu_flags  # noqa: E402


class StepTimes:
    def __init__(self, rows: int):
        self.rows, self.seconds = rows, []

    def on_step(self, seconds: float, running: int, queued: int) -> None:
        if running == self.rows:
            self.seconds.append(seconds)

    def on_reward(self, name: str, seconds: float) -> None:
        pass

    def on_tokens(self, count: int) -> None:
        pass


PROMPTS = ["The weather today is", "My favourite food is", "Tell me about the sea.", "The city at night"]


def engine_run(model, tokenizer, reward, rows: int, tokens: int, k: int,
               beta: float | None = None) -> tuple[list[float], list[list[int]]]:
    """``rows`` seeded rows (different seeds and β: -5, -6, -7 in turn, or every row ``beta``) of ``tokens`` tokens
    through an engine running ``model`` (an LM as :func:`steerkit.assembly.lm_runner` makes it) with ``reward`` as
    ``toxicity``: the step times (s) while all rows ran, and each row's tokens."""
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    times = StepTimes(rows)
    engine = Engine(model, tokenizer, {"toxicity": reward}, default_k=k, max_running=rows, max_queue=rows,
                    observer=times)
    specs = [RowSpec(PROMPTS[i % len(PROMPTS)], tokens, temperature=1.0, k=k,
                     rewards={"toxicity": -5.0 - i % 3 if beta is None else beta}, seed=1000 + i) for i in range(rows)]
    engine.start()
    try:
        out = [h.result(timeout=1800).token_ids for h in engine.submit_all(specs)]
    finally:
        engine.shutdown(0)
    return times.seconds, out


def run(lm, tokenizer, reward, args, dtype: str, compile: bool) -> tuple[list[float], int]:
    """Step times (s) with every row running, and the tokens generated, for one set-up."""
    from steerkit.assembly import compiled_reward, lm_runner

    seconds, out = engine_run(lm_runner(lm, compile=compile, dtype=dtype), tokenizer,
                              compiled_reward(reward) if compile else reward, args.rows, args.tokens, args.k, args.beta)
    return seconds, sum(len(ids) for ids in out)


def parse_config(config: str) -> dict:
    """``DTYPE/BACKEND[+compile]``: the set-up's dtype, backend (``auto`` where none is named) and compile flag."""
    setup, _, compiled = config.partition("+")
    dtype, _, backend = setup.partition("/")
    return {"dtype": dtype, "backend": backend or "auto", "compile": compiled == "compile"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--beta", type=float, default=None, help="every row's β (default: -5, -6 and -7 in turn; "
                        "bench_serve.py's requests use -20)")
    parser.add_argument("--configs", nargs="+", default=["float32/auto"],
                        help="DTYPE/BACKEND[+compile] set-ups, run in this order; ratios are against the first")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the set-ups, the order reversed every "
                        "round (a noisy machine's drift falls on all of them): a set-up's step time is the median "
                        "of its rounds' medians, and each round's ratio to the first set-up is printed and written")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_engine_step.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from steerkit.files import atomic_write_text
    from steerkit.models import load_causal_lm_cached
    from steerkit.rewards.loading import load_reward

    lm, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    load_before = os.getloadavg()
    setups = [parse_config(config) for config in args.configs]  # by position: a set-up may be listed twice
    # one reward per backend: every round and set-up of a backend scores with the same one
    rewards = {backend: load_reward("toxicity", backend=backend) for backend in {s["backend"] for s in setups}}
    per_round: list[list[dict]] = [[] for _ in args.configs]
    order = list(range(len(args.configs)))
    for r in range(args.rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            config, setup = args.configs[i], setups[i]
            steps, tokens = run(lm, tokenizer, rewards[setup["backend"]], args, setup["dtype"], setup["compile"])
            steps = steps[1:] if setup["compile"] else steps  # a compiled run's first full step may still compile
            done = {"tokens": tokens, "steps_timed": len(steps), "step_ms_median": 1000 * statistics.median(steps),
                    "step_ms_min": 1000 * min(steps)}
            per_round[i].append(done)
            print(f"{f'round {r + 1} ' if args.rounds > 1 else ''}{args.rows} rows, {config}: step "
                  f"{done['step_ms_median']:.1f} ms median, {done['step_ms_min']:.1f} ms min over "
                  f"{done['steps_timed']} steps", flush=True)
    rows = []
    for config, setup, measured in zip(args.configs, setups, per_round):
        ratios = [f["step_ms_median"] / m["step_ms_median"] for f, m in zip(per_round[0], measured)]
        rows.append({"config": config, **setup,
                     "tokens": measured[0]["tokens"], "steps_timed": sum(m["steps_timed"] for m in measured),
                     "step_ms_median": statistics.median(m["step_ms_median"] for m in measured),
                     "step_ms_min": min(m["step_ms_min"] for m in measured),
                     **({"rounds": measured, "speed_over_first_per_round": ratios} if args.rounds > 1 else {})})
        print(f"{args.rows} rows, {config}: step {rows[-1]['step_ms_median']:.1f} ms median"
              f"{' of the rounds' if args.rounds > 1 else ''}; {statistics.median(ratios):.2f}x the first"
              + (f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)})" if args.rounds > 1 else ""), flush=True)
    result = {"benchmark": "bench_engine_step", "rows": args.rows, "tokens_per_row": args.tokens, "k": args.k,
              "beta": args.beta if args.beta is not None else "-5, -6, -7 by row", "rounds": args.rounds,
              "torch_threads": 1, "configs": rows, **{key: rows[0][key] for key in
                                                         ("tokens", "steps_timed", "step_ms_median", "step_ms_min")},
              "machine": platform.processor() or platform.machine(), "cpu": cpu_flags(),
              "load_average_before": load_before, "load_average": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

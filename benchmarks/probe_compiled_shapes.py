"""A compiled server and a row longer than the shapes it compiled at start-up: what a streaming short request sees.

The serving engine (the one `steerkit serve --compile` runs, in-process, 1 torch thread) with the packaged SmolLM2,
compiled (float32), ``max_running`` 2: the start-up compiles the 1- and 2-row steps at the narrowest width (128
tokens). A short request streams ``--short-tokens`` tokens; ``--delay`` seconds after it starts, a request whose
prompt has ``--long-prompt`` tokens (past 128: the 2-row step needs the 256-token width) joins it. Two ways, in this
order, in one process:

- ``eager-fallback`` (steerkit now): the serving loop runs in ``new_shapes_run_eagerly``; the 2 x 256 shape's steps
  run eagerly while the long row is in the batch.
- ``compile-in-loop`` (steerkit before): the same loop without it (``steerkit.serving.engine.new_shapes_run_eagerly``
  replaced by ``contextlib.nullcontext`` for this run), so the 2 x 256 shape compiles inside the loop, as every
  ``--compile`` server did.

(The order matters: once the second way has compiled the wider shape, it would not run eagerly any more.) Per way: the
short request's time to its last token and its largest gap between two tokens, the long request's time, and the
compilations during the way (stderr lines, captured). JSON to benchmarks/results/probe_compiled_shapes.json.

    python benchmarks/probe_compiled_shapes.py        # about 8 minutes on 2 cores (3 compilations of ~90 s)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

from steerkit.files import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_long_prompt import token_times  # noqa: E402


class _Tee(io.TextIOBase):
    """stderr, copied into a list of lines (the compilation lines of one way)."""

    def __init__(self, stream):
        self.stream, self.lines = stream, []

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.lines.extend(line for line in text.splitlines() if line.startswith("steerkit:"))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def run(parts, long_prompt: str, short_tokens: int, delay: float) -> dict:
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    engine = Engine(parts.model, parts.tokenizer, {}, default_k=20, max_running=2, max_queue=4)
    tee = _Tee(sys.stderr)
    sys.stderr = tee
    engine.start()
    try:
        sent = time.monotonic()
        short = engine.submit(RowSpec("The weather today is", short_tokens, temperature=0, rewards={}))
        times = {}

        def send_long():
            time.sleep(delay)
            start = time.monotonic()
            engine.submit(RowSpec(long_prompt, 16, temperature=0, rewards={})).result(timeout=1800)
            times["long"] = time.monotonic() - start

        sender = threading.Thread(target=send_long)
        sender.start()
        stamps = token_times(short, sent)
        sender.join()
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return {"short_tokens": len(stamps), "short_done_s": round(stamps[-1], 2),
                "short_largest_gap_s": round(max(gaps), 2), "short_median_gap_s": round(sorted(gaps)[len(gaps) // 2], 3),
                "long_done_s": round(times["long"], 2), "stderr": tee.lines}
    finally:
        engine.shutdown(5)
        sys.stderr = tee.stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long-prompt", type=int, default=200, help="tokens of the long request's prompt (> 128)")
    parser.add_argument("--short-tokens", type=int, default=96, help="within 128 tokens with its prompt")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_compiled_shapes.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    import steerkit.serving.engine as serving_engine
    from steerkit.assembly import assemble
    from steerkit.serving.engine import Engine

    parts = assemble(rewards={}, compile=True)
    start = time.monotonic()
    Engine(parts.model, parts.tokenizer, {}, default_k=20, max_running=2, max_queue=4).shutdown(0)  # the warm-up
    warm_up_s = time.monotonic() - start
    text = "The history of the city is long and full of surprising turns. " * 100
    ids = parts.tokenizer(text, add_special_tokens=False)["input_ids"][:args.long_prompt]
    long_prompt = parts.tokenizer.decode(ids)
    load_before = os.getloadavg()
    rows = []
    for way in ("eager-fallback", "compile-in-loop"):
        if way == "compile-in-loop":
            serving_engine.new_shapes_run_eagerly = contextlib.nullcontext
        row = {"way": way, **run(parts, long_prompt, args.short_tokens, args.delay)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__,
                          "load_before": load_before, "load_after": os.getloadavg()},
              "lm": "smollm2-135m-instruct, float32, compiled", "torch_threads": 1, "max_running": 2,
              "long_prompt_tokens": len(parts.tokenizer(long_prompt, add_special_tokens=False)["input_ids"]),
              "delay_s": args.delay, "warm_up_s": round(warm_up_s, 1), "runs": rows}
    atomic_write_text(args.out, json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

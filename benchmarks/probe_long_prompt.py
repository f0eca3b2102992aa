"""Head-of-line blocking by a long prompt: how long a short request waits while a long prompt is prefilled.

The serving engine (the one `steerkit serve` runs, in-process, 1 torch thread) with the packaged SmolLM2 gets a
prompt of ``--tokens`` tokens (``max_tokens`` 1), and ``--delay`` seconds later a short request (8 tokens). For
each ``--prefill-chunk`` value (the default list includes one as long as the prompt: the old, unchunked
behaviour) it reports the long prompt's time to its token, the short request's time to its first token and to
its last, and the largest gap between two of the short request's tokens. JSON to
benchmarks/results/probe_long_prompt.json.

    python benchmarks/probe_long_prompt.py --tokens 4000          # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

from steerkit.files import atomic_write_text


def token_times(handle, since: float) -> list[float]:
    """Seconds from ``since`` to each token a row handle streams, up to its finish; what the probes time a short
    request by (also benchmarks/probe_compiled_shapes.py)."""
    from steerkit.serving.requests import FinishEvent

    stamps = []
    for event in handle.iter_events(timeout=3600):
        if isinstance(event, FinishEvent):
            break
        stamps.append(time.monotonic() - since)
    return stamps


def run(engine_cls, parts, prompt: str, chunk: int, delay: float) -> dict:
    from steerkit.serving.requests import RowSpec

    engine = engine_cls(parts.model, parts.tokenizer, {}, default_k=20, prefill_chunk=chunk)
    engine.start()
    try:
        t0 = time.monotonic()
        long = engine.submit(RowSpec(prompt, 1, temperature=0, rewards={}))
        times = {}

        def wait_long():
            long.result(timeout=3600)
            times["long"] = time.monotonic() - t0

        waiter = threading.Thread(target=wait_long)
        waiter.start()
        time.sleep(delay)
        sent = time.monotonic()
        short = engine.submit(RowSpec("The weather today is", 8, temperature=0, rewards={}))
        stamps = token_times(short, sent)
        waiter.join()
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return {"prefill_chunk": chunk, "long_done_s": round(times["long"], 2),
                "short_first_token_s": round(stamps[0], 2), "short_done_s": round(stamps[-1], 2),
                "short_largest_gap_s": round(max(gaps), 2) if gaps else None}
    finally:
        engine.shutdown(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--chunks", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_long_prompt.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from steerkit.assembly import assemble
    from steerkit.serving.engine import Engine

    parts = assemble(rewards={})
    text = "The history of the city is long and full of surprising turns. " * 2000
    ids = parts.tokenizer(text, add_special_tokens=False)["input_ids"][:args.tokens]
    prompt = parts.tokenizer.decode(ids)
    rows = []
    for chunk in [*args.chunks, args.tokens + 16]:  # the last: the whole prompt in one forward (before issue 24)
        row = run(Engine, parts, prompt, chunk, args.delay)
        row["unchunked"] = chunk > args.tokens
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
              "prompt_tokens": len(parts.tokenizer(prompt, add_special_tokens=False)["input_ids"]),
              "delay_s": args.delay, "runs": rows}
    atomic_write_text(args.out, json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

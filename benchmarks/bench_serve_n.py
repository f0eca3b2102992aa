"""A request's ``n`` choices in the serving engine: how long until every choice has its first token, and its last.

The engine ``steerkit serve`` runs (in-process, the packaged SmolLM2, 1 thread, unsteered) gets one request's
``--n`` rows: one prompt, a seed each, ``--max-tokens`` sampled tokens, all queued at once. Once with a short
prompt (the first eval prompt, ~15 tokens) and once with a long one (``--long`` tokens: prefilled in chunks of the
server's default 256), on each ``--engines`` entry. Each ``--trees`` entry (a checkout; a ``git worktree`` of an
older revision, put first on ``PYTHONPATH``) runs in a process of its own, in alternating order over ``--rounds``:
before/after in one run.

    python benchmarks/bench_serve_n.py --trees /tmp/old .          # ~3 min here

Prints, per round, tree, engine and prompt, the seconds until the last choice's first token and until the last
token; JSON to benchmarks/results/bench_serve_n.json (machine load and CPU flags included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "prompts" / "toxicity_nontoxic_eval.jsonl"


def child(engine_name: str, n: int, max_tokens: int, long: int) -> dict:
    """One process: ``{prompt: {"first": s, "last": s}}`` for the short and the long prompt (after a warm-up)."""
    import torch

    torch.set_num_threads(1)
    from steerkit.assembly import load_lm
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec, TokenEvent

    model, tokenizer = load_lm("smollm2-135m-instruct", engine_name)
    short = json.loads(DATA.read_text().splitlines()[0])["prompt"]["text"]
    words = " ".join(json.loads(line)["prompt"]["text"] for line in DATA.read_text().splitlines()[:200])
    text = tokenizer.decode(tokenizer(words, add_special_tokens=False)["input_ids"][:long])
    engine = Engine(model, tokenizer, {}, default_k=20, max_running=n, max_queue=4 * n)
    engine.start()
    out = {}
    try:
        for name, prompt in (("warm-up", short), ("short", short), ("long", text)):
            specs = [RowSpec(prompt, max_tokens, seed=seed, temperature=1.0) for seed in range(n)]
            firsts, lasts = [], []

            def watch(handle, start):  # a thread per choice, so that each time is taken as its event arrives
                first = None
                for event in handle.iter_events(timeout=600):
                    if first is None and isinstance(event, TokenEvent):
                        first = time.perf_counter() - start
                firsts.append(first)
                lasts.append(time.perf_counter() - start)

            start = time.perf_counter()
            threads = [threading.Thread(target=watch, args=(h, start)) for h in engine.submit_all(specs)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            out[name] = {"first": max(firsts), "last": max(lasts)}
    finally:
        engine.shutdown(0)
    out.pop("warm-up")
    return out


def run(tree: str, engine: str, args) -> dict:
    from trees import run_child

    return run_child(tree, __file__, ["--child", engine, "--n", str(args.n), "--max-tokens", str(args.max_tokens),
                                      "--long", str(args.long)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", default=["steerkit", "llama.cpp"])
    parser.add_argument("--trees", nargs="+", default=["."], help="checkouts to run ('.' is this one)")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--long", type=int, default=1000, help="the long prompt's tokens")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench_serve_n.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.max_tokens, args.long)))
        return
    if not DATA.is_file():
        sys.exit(f"{DATA} is absent: this benchmark reads the shared eval prompts.")
    sys.path.insert(0, str(HERE))
    from cpu_info import cpu_flags
    from trees import alternated

    setups = [(tree, engine) for engine in args.engines for tree in args.trees]
    load_before = os.getloadavg()
    rounds = []
    for r, order in alternated(setups, args.rounds):
        got = {f"{engine}@{tree}": run(tree, engine, args) for tree, engine in order}
        rounds.append(got)
        for tree, engine in setups:
            key = f"{engine}@{tree}"
            print(f"round {r + 1} {key}: " + "; ".join(
                f"{name} prompt: every first token {v['first']:.2f} s, last token {v['last']:.2f} s"
                for name, v in got[key].items()), flush=True)
    result = {"n": args.n, "max_tokens": args.max_tokens, "long_tokens": args.long, "threads": 1,
              "setups": [f"{engine}@{tree}" for tree, engine in setups], "rounds": rounds,
              "load_before": load_before, "load_after": os.getloadavg(), "cpu": cpu_flags()}
    from steerkit.files import atomic_write_text  # (steerkit of this checkout; the trees run in their own processes)

    atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

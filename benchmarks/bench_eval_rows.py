"""An eval's generation stage on both engines: many sampled rows of one prompt per ``generate`` call.

``steerkit eval`` draws ``num_continuations`` (25) rows of each prompt in one call, a unit. This times that shape
through the Python API: ``--prompts`` prompts of ``prompts/toxicity_nontoxic_eval.jsonl``, each one ``generate`` call
of ``--rows`` sampled rows × ``--tokens`` tokens (a seed per prompt), with each of ``--settings``: plain,
``toxicity-token`` or ``toxicity`` (β = −20, k = 20; the default is plain and ``toxicity-token``), on steerkit's
engine (float32, eager) and on ``engine="llama.cpp"`` (the packaged Q4_1 GGUF), 1 thread.
Each (tree, engine) runs in a process of its own, in alternating order over ``--rounds``; a ``--trees`` entry is
another checkout (a ``git worktree`` of an older revision, put first on ``PYTHONPATH``): before/after in one run.

    python benchmarks/bench_eval_rows.py                                   # ~3 min here
    python benchmarks/bench_eval_rows.py --trees /tmp/old . --engines llama.cpp --rounds 2

Prints seconds per set-up and each set-up over the first, per round, and how many rows drew other tokens than the
first tree's on the same engine (the same seeds: a change that should not move tokens shows here); JSON to
benchmarks/results/bench_eval_rows.json (machine load and CPU flags included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "prompts" / "toxicity_nontoxic_eval.jsonl"
SETTINGS = {"plain": {}, "toxicity-token": {"toxicity-token": -20.0}, "toxicity": {"toxicity": -20.0}}


def child(engine: str, prompts: int, rows: int, tokens: int, settings: list[str]) -> dict:
    """One process's timings and tokens: ``{"seconds": {setting: s}, "tokens": {setting: [row's ids, ...]}}`` over
    the prompts' units."""
    import torch

    torch.set_num_threads(1)
    import steerkit

    texts = [json.loads(line)["prompt"]["text"] for line in DATA.read_text().splitlines()[:prompts]]
    kwargs = dict(lm="smollm2-135m-instruct", engine=engine, k=20, max_new_tokens=tokens, num_return_sequences=rows,
                  batch_size=rows)
    for name in settings:
        steerkit.generate(texts[:1], rewards=SETTINGS[name], seed=0, **{**kwargs, "max_new_tokens": 2})
    seconds, drawn = {}, {}
    for name in settings:
        start = time.perf_counter()
        outs = [steerkit.generate([text], rewards=SETTINGS[name], seed=i, **kwargs) for i, text in enumerate(texts)]
        seconds[name] = time.perf_counter() - start
        drawn[name] = [row for out in outs for row in out.sequences.tolist()]
    return {"seconds": seconds, "tokens": drawn}


def run(tree: str, engine: str, args) -> dict:
    from trees import run_child

    return run_child(tree, __file__, ["--child", engine, "--prompts", str(args.prompts), "--rows", str(args.rows),
                                      "--tokens", str(args.tokens), "--settings", *args.settings])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", default=["steerkit", "llama.cpp"])
    parser.add_argument("--trees", nargs="+", default=["."], help="checkouts to run ('.' is this one)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=["plain", "toxicity-token"])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench_eval_rows.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prompts, args.rows, args.tokens, args.settings)))
        return
    if not DATA.is_file():
        sys.exit(f"{DATA} is absent: this benchmark reads the shared eval prompts.")
    sys.path.insert(0, str(HERE))
    from cpu_info import cpu_flags
    from trees import alternated

    setups = [(tree, engine) for tree in args.trees for engine in args.engines]
    load_before = os.getloadavg()
    rounds, differ = [], {}
    for r, order in alternated(setups, args.rounds):
        runs = {f"{engine}@{tree}": run(tree, engine, args) for tree, engine in order}
        seconds = {key: got["seconds"] for key, got in runs.items()}
        rounds.append(seconds)
        base = seconds[f"{setups[0][1]}@{setups[0][0]}"]
        for tree, engine in setups:
            key, first = f"{engine}@{tree}", f"{engine}@{args.trees[0]}"
            # rows whose tokens differ from the first tree's on the same engine (the same seeds)
            differ[key] = {name: sum(a != b for a, b in zip(runs[key]["tokens"][name], runs[first]["tokens"][name]))
                           for name in args.settings}
            got = seconds[key]
            print(f"round {r + 1} {key}: " + ", ".join(
                f"{name} {got[name]:.2f} s ({got[name] / base[name]:.2f}x the first)" for name in args.settings)
                + f"; rows unlike the first tree's: {differ[key]}", flush=True)
    result = {"prompts": args.prompts, "rows": args.rows, "tokens": args.tokens, "threads": 1,
              "settings": args.settings,
              "setups": [f"{engine}@{tree}" for tree, engine in setups], "rounds": rounds,
              "rows_unlike_the_first_tree": differ,
              "load_before": load_before, "load_after": os.getloadavg(), "cpu": cpu_flags()}
    from steerkit.files import atomic_write_text  # (steerkit of this checkout; the trees run in their own processes)

    atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

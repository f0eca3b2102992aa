"""An eval's fluency stage: the perplexity of each of a prompt's continuations under the evaluation LM.

``steerkit eval`` scores a record's ``num_continuations`` (25) continuations of one prompt in one call of
``PerplexityScorer.perplexities`` (batch 25). This makes that shape: ``--prompts`` prompts of
``prompts/toxicity_nontoxic_eval.jsonl``, each with ``--rows`` plain sampled continuations of ``--tokens`` tokens from
the packaged SmolLM2 (made once, in this process, and handed to every set-up), then times their perplexities under
``--eval-lm`` (the packaged Gemma 3 270M by default), 1 thread. Each ``--trees`` entry (a checkout; a ``git worktree``
of an older revision, put first on ``PYTHONPATH``) runs in a process of its own, in alternating order over
``--rounds``: before/after in one run.

    python benchmarks/bench_fluency.py --trees /tmp/old .      # ~4 min here

Prints seconds per tree and each tree over the first, per round, and the largest relative difference of a perplexity
from the first tree's; JSON to benchmarks/results/bench_fluency.json (machine load and CPU flags included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "prompts" / "toxicity_nontoxic_eval.jsonl"


def child(records: Path, eval_lm: str) -> dict:
    """One process: ``{"seconds": s, "perplexities": [[...] per record]}`` (the LM's load is not timed)."""
    import torch

    torch.set_num_threads(1)
    from steerkit.evaluation.fluency import PerplexityScorer

    data = json.loads(records.read_text())
    scorer = PerplexityScorer(eval_lm, batch_size=25)
    scorer.perplexities([data[0]["prompt"]] * 2, data[0]["continuations"][:2])  # warm-up
    start = time.perf_counter()
    values = [scorer.perplexities([r["prompt"]] * len(r["continuations"]), r["continuations"]) for r in data]
    return {"seconds": time.perf_counter() - start, "perplexities": values}


def make_records(prompts: int, rows: int, tokens: int) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    import steerkit

    texts = [json.loads(line)["prompt"]["text"] for line in DATA.read_text().splitlines()[:prompts]]
    return [{"prompt": text, "continuations": steerkit.generate([text], num_return_sequences=rows, seed=i,
                                                                 max_new_tokens=tokens).texts}
            for i, text in enumerate(texts)]


def run(tree: str, records: Path, args) -> dict:
    from trees import run_child

    return run_child(tree, __file__, ["--child", str(records), "--eval-lm", args.eval_lm])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", nargs="+", default=["."], help="checkouts to run ('.' is this one)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-lm", default="gemma3-270m")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench_fluency.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.eval_lm)))
        return
    if not DATA.is_file():
        sys.exit(f"{DATA} is absent: this benchmark reads the shared eval prompts.")
    sys.path.insert(0, str(HERE))
    from cpu_info import cpu_flags
    from trees import alternated

    records = make_records(args.prompts, args.rows, args.tokens)
    load_before = os.getloadavg()
    rounds, differ = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.json"
        path.write_text(json.dumps(records))
        for r, order in alternated(args.trees, args.rounds):
            runs = {tree: run(tree, path, args) for tree in order}
            rounds.append({tree: runs[tree]["seconds"] for tree in args.trees})
            first = runs[args.trees[0]]
            for tree in args.trees:
                pairs = [(a, b) for ra, rb in zip(runs[tree]["perplexities"], first["perplexities"])
                         for a, b in zip(ra, rb) if a is not None and b is not None and a == a and b == b]
                differ[tree] = max(abs(a - b) / b for a, b in pairs)
                print(f"round {r + 1} {tree}: {runs[tree]['seconds']:.2f} s "
                      f"({runs[tree]['seconds'] / first['seconds']:.2f}x the first); largest relative difference "
                      f"of a perplexity from the first tree's: {differ[tree]:.2e}", flush=True)
    result = {"prompts": args.prompts, "rows": args.rows, "tokens": args.tokens, "eval_lm": args.eval_lm,
              "threads": 1, "trees": args.trees, "rounds": rounds, "largest_relative_difference": differ,
              "load_before": load_before, "load_after": os.getloadavg(), "cpu": cpu_flags()}
    from steerkit.files import atomic_write_text  # (steerkit of this checkout; the trees run in their own processes)

    atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

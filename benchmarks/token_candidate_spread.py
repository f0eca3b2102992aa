"""How a token-level reward ranks one step's candidates, next to the sequence reward it stands in for.

At the same β, RAD's shift of candidate v is β·ρ(v): what matters is how much ρ varies across a step's top-k and
whether it orders the candidates as the sequence reward does. For prefixes taken from unsteered SmolLM2
continuations (the first `--tokens` tokens of one continuation per prompt of a `steerkit eval` run), this scores
the LM's top-k next tokens with each pair (`sentiment` / `sentiment-token`, `toxicity` / `toxicity-token`, or any
`--pair SEQUENCE,TOKEN`, e.g. a distilled student's directory) and reports the mean standard deviation of ρ over
the candidates and the mean within-step Pearson r between the two.

    python benchmarks/token_candidate_spread.py --run docs/results/sentiment_token
    python benchmarks/token_candidate_spread.py --pair toxicity,toxicity-token-distilled

Writes benchmarks/results/token_candidate_spread.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare_token_steering import read_records  # noqa: E402

from steerkit.models import load_causal_lm_cached  # noqa: E402
from steerkit.rewards.loading import load_reward  # noqa: E402


def spread(lm, tok, sequence, token, prefixes: list[list[int]], k: int) -> dict:
    sd_seq, sd_tok, corr = [], [], []
    for ids in prefixes:
        sessions = [sequence.start([""], tok), token.start([""], tok)]
        for t in ids:
            for s in sessions:
                s.commit(torch.tensor([t]))
        with torch.no_grad():
            candidates = lm(torch.tensor([ids])).logits[0, -1].topk(k).indices[None]
        a, b = (s.score(candidates)[0].double() for s in sessions)
        sd_seq.append(float(a.std()))
        sd_tok.append(float(b.std()))
        corr.append(float(torch.corrcoef(torch.stack([a, b]))[0, 1]))
    return {"prefixes": len(prefixes), "k": k, "sequence_std": statistics.fmean(sd_seq),
            "token_std": statistics.fmean(sd_tok), "within_step_pearson": statistics.fmean(corr)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default=str(ROOT / "docs" / "results" / "sentiment_token"),
                        help="a steerkit eval run (or its archive) whose unsteered-k20 continuations give the prefixes")
    parser.add_argument("--pair", action="append", help="SEQUENCE,TOKEN (repeatable); default: the shipped pairs")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=6)
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "token_candidate_spread.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm, tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    records = [r for r in read_records(Path(args.run)) if r["setting"] == "unsteered-k20"]
    prefixes = [ids for ids in (tok(r["continuations"][0], add_special_tokens=False)["input_ids"][:args.tokens]
                                for r in records[:args.prompts]) if len(ids) == args.tokens]
    pairs = [p.split(",", 1) for p in args.pair] if args.pair else [["sentiment", "sentiment-token"],
                                                                     ["toxicity", "toxicity-token"]]
    results = []
    for seq_name, tok_name in pairs:
        r = {"sequence": seq_name, "token": tok_name,
             **spread(lm, tok, load_reward(seq_name), load_reward(tok_name), prefixes, args.k)}
        results.append(r)
        print(f"{seq_name} / {tok_name}: std of rho over the top-{args.k}, mean over {r['prefixes']} prefixes: "
              f"{r['sequence_std']:.3f} / {r['token_std']:.3f}; within-step Pearson r {r['within_step_pearson']:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "token_candidate_spread", "run": args.run,
                                          "prefix_tokens": args.tokens, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

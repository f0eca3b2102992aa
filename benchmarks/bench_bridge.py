"""Extra cost of tokenizer bridging: a reward model whose tokenizer differs from the LM's, vs the same reward
model used with an LM that shares its tokenizer.

Reward model: SmolLM2-135M cut to 4 layers (the shipped toxicity/sentiment shape; an untrained head, which
does not change the cost). The reward session alone is timed (score k candidates + commit one, per step),
driven over the same English passages tokenized by each LM, with each step's candidates taken from the
LM's real top-k at that position (teacher forcing):

  same     LM tokenizer = SmolLM2's (SameTokenizerSession: each candidate is one token)
  bridged  LM tokenizer = Gemma 3's (BridgedSession: unstable tail + candidate text re-tokenized, blocks)

``--text chinese`` drives Chinese passages with neither whitespace nor punctuation instead: one pre-token of the reward
tokenizer throughout, so the bridge's boundary moves only by its cut at a token (``rewards/sequence/boundaries.py``),
and adds the mode ``bridged, no cut`` (``BridgedSession.max_block`` unbounded: the session before that cut existed).

Prints a table and writes JSON to benchmarks/results/bench_bridge.json (``--text chinese``: bench_bridge_chinese.json).

    python benchmarks/bench_bridge.py --threads 1   # ~1 min on a busy 2-core machine once the models are cached
    python benchmarks/bench_bridge.py --quick
    python benchmarks/bench_bridge.py --threads 1 --text chinese
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

import torch

from steerkit.models import load_causal_lm_cached
from steerkit.rewards.sequence.bridge import BridgedSession
from steerkit.rewards.model import RewardModel
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.sessions import SameTokenizerSession

PASSAGES = [
    "The weather in Paris today is mild and grey, with a light wind from the west and a chance of rain "
    "in the late afternoon. Most people are walking along the river, talking about the long holiday weekend.",
    "My neighbour told me that the new restaurant on the corner serves the best noodles in town, but the "
    "queue is always long and the prices went up twice since it opened in the spring of last year.",
    "Scientists have discovered a new species of frog in the mountains of Peru. It is only two centimetres "
    "long, lives under wet leaves, and sings at night with a call that sounds like a dripping tap.",
    "When I opened the door, I saw a small brown dog sitting on the mat, holding a letter in its mouth as if "
    "it had been waiting for hours. Nobody in the street knew where it came from or who had sent it.",
    "The best way to learn a language is to use it every day: read short stories, listen to the radio, "
    "write a few sentences about your day, and do not be afraid of making mistakes when you speak.",
    "Yesterday the city council voted to close the old bridge to cars and turn it into a park with trees, "
    "benches and a small market on Sundays, after three years of debate and two public consultations.",
    "She looked at the old photograph and smiled. Her grandmother stood in front of the bakery in 1952, "
    "wearing a white apron, with flour on her hands and the whole family crowded behind the window.",
    "In the year 2050, most people will work fewer hours, travel by train for distances under a thousand "
    "kilometres, and grow some of their own food on roofs and balconies across the large cities.",
]

#: No whitespace, no punctuation: each passage is one pre-token of SmolLM2's byte-level tokenizer.
PASSAGES_ZH = [
    "今天巴黎的天气很温和有一点风下午可能会下雨很多人沿着河边散步一边走一边谈论这个长长的假期周末大家都很开心",
    "我的邻居告诉我街角那家新开的饭馆做的面条是全城最好吃的但是排队的人总是很多而且从春天开张以来已经涨过两次价",
    "科学家在秘鲁的山区发现了一种新的青蛙它只有两厘米长住在潮湿的树叶下面晚上会唱歌叫声听起来像水龙头在滴水一样",
    "我打开门的时候看见一只棕色的小狗坐在门垫上嘴里叼着一封信好像已经等了好几个小时街上没有人知道它是从哪里来的",
    "学习一门语言最好的办法就是每天都用它读短篇小说听广播写几句话记录自己的一天说话的时候不要害怕犯错误慢慢来就好",
    "昨天市议会投票决定关闭那座旧桥不让汽车通过把它改造成一个有树有长椅的公园星期天还有一个小市场大家讨论了三年",
    "她看着那张旧照片笑了她的祖母站在面包店前面穿着白色的围裙手上都是面粉全家人挤在窗户后面看着外面热闹的街道",
    "到了二零五零年大多数人会工作更少的时间一千公里以内的旅行都坐火车还会在城市的屋顶和阳台上种一些自己吃的菜",
]


class Timed:
    """Wraps a scoring cache, accumulating the seconds spent inside its methods (the model's forwards)."""

    def __init__(self, cache):
        self.cache, self.seconds = cache, 0.0
        self.widths: list[int] = []

    def __getattr__(self, name):
        attr = getattr(self.cache, name)
        if name not in {"score_blocks", "commit_choice", "append", "rollback"}:
            return attr

        def timed(*args, **kwargs):
            if name == "score_blocks":
                self.widths.append(args[0].shape[-1])
            t = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        return timed


def lm_topk(model, tokenizer, texts: list[str], k: int, steps: int):
    """Per position, the LM's ids of the passage and its top-k candidates there (one teacher-forced forward)."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"][:steps] for t in texts]
    n = min(len(r) for r in ids)
    ids = torch.tensor([r[:n] for r in ids])
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    inputs = torch.cat([torch.full((ids.shape[0], 1), bos), ids[:, :-1]], dim=1)
    with torch.no_grad():
        logits = model(inputs).logits.float()
    top = logits.topk(k, dim=-1).indices  # [B, n, k]
    # the passage's own token must be a candidate (it is what gets committed)
    hit = (top == ids[..., None]).any(-1)
    top[..., -1] = torch.where(hit, top[..., -1], ids)
    return ids, top


def run_session(scorer, tokenizer, ids, top, warmup: int = 2):
    B, n = ids.shape
    session = scorer.start([""] * B, tokenizer)
    timed = Timed(session.cache)
    session.cache = timed
    times = []
    for t in range(n):
        start = time.perf_counter()
        session.score(top[:, t])
        session.commit(ids[:, t])
        times.append(time.perf_counter() - start)
        if t == warmup - 1:
            timed.seconds = 0.0
    measured = times[warmup:]
    total = sum(measured)
    return {
        "session": type(session).__name__, "steps": len(measured),
        "ms_per_step": 1000 * total / len(measured), "ms_per_step_median": 1000 * statistics.median(measured),
        "model_ms_per_step": 1000 * timed.seconds / len(measured),
        "other_ms_per_step": 1000 * (total - timed.seconds) / len(measured),
        "block_width_mean": statistics.mean(timed.widths) if timed.widths else 1.0,
        "block_width_max": max(timed.widths) if timed.widths else 1,
        "cache_columns_end": timed.cache.length,
        "cache_real_tokens_end_max": int(timed.cache.mask.sum(1).max()),
        "chars_per_step": sum(len(tokenizer.decode(r, skip_special_tokens=True)) for r in ids.tolist()) / (B * n),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--layers", type=int, default=4, help="reward-model depth (SmolLM2 layers)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--text", choices=["english", "chinese"], default="english")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    suffix = "" if args.text == "english" else "_chinese"
    args.out = args.out or Path(__file__).parent / "results" / f"bench_bridge{suffix}.json"
    passages = PASSAGES if args.text == "english" else PASSAGES_ZH
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = 16 if args.quick else 40

    smol, smol_tok, _ = load_causal_lm_cached("smollm2-135m-instruct")
    gemma, gemma_tok, _ = load_causal_lm_cached("gemma3-270m")
    rm = RewardModel.from_backbone("smollm2-135m-instruct", args.layers, name="rm")
    scorer = RewardModelScorer(rm)

    rows = []
    for batch in (1, 8):
        texts = passages[:batch]
        modes = [("same", smol, smol_tok, SameTokenizerSession), ("bridged", gemma, gemma_tok, BridgedSession)]
        if args.text == "chinese":
            modes.insert(1, ("bridged, no cut", gemma, gemma_tok, BridgedSession))
        for label, model, tok, expected in modes:
            ids, top = lm_topk(model, tok, texts, args.k, steps)
            uncut = patch.object(BridgedSession, "max_block", 10 ** 9) if label == "bridged, no cut" else nullcontext()
            with uncut:
                result = run_session(scorer, tok, ids, top)
            assert result["session"] == expected.__name__
            rows.append({"batch": batch, "k": args.k, "mode": label, "lm_tokenizer": type(tok).__name__, **result})

    print(f"\nReward session cost per step (RM: SmolLM2 {args.layers} layers, k={args.k}, "
          f"torch threads={torch.get_num_threads()})\n")
    header = (f"{'B':>2} {'mode':<15} {'ms/step':>8} {'median':>7} {'model':>7} {'other':>7} {'block m':>8} "
              f"{'chars/step':>10}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['batch']:>2} {r['mode']:<15} {r['ms_per_step']:>8.1f} {r['ms_per_step_median']:>7.1f} "
              f"{r['model_ms_per_step']:>7.1f} {r['other_ms_per_step']:>7.1f} {r['block_width_mean']:>8.2f} "
              f"{r['chars_per_step']:>10.2f}  widest {r['block_width_max']}")
    summary = {}
    for batch in (1, 8):
        same, bridged = (next(r for r in rows if r["batch"] == batch and r["mode"] == m) for m in ("same", "bridged"))
        per_char = (bridged["ms_per_step"] / bridged["chars_per_step"]) / (same["ms_per_step"] / same["chars_per_step"])
        summary[f"B{batch}"] = {"overhead_per_step": bridged["ms_per_step"] / same["ms_per_step"] - 1,
                                "overhead_per_character": per_char - 1}
        print(f"B={batch}: bridging costs {100 * summary[f'B{batch}']['overhead_per_step']:+.0f}% per step, "
              f"{100 * summary[f'B{batch}']['overhead_per_character']:+.0f}% per character of text")
        if args.text == "chinese":
            uncut = next(r for r in rows if r["batch"] == batch and r["mode"] == "bridged, no cut")
            summary[f"B{batch}"]["no_cut_over_cut"] = uncut["ms_per_step"] / bridged["ms_per_step"]
            print(f"B={batch}: without the cut at a token a step takes {summary[f'B{batch}']['no_cut_over_cut']:.2f}x "
                  f"as long (widest block {uncut['block_width_max']} against {bridged['block_width_max']})")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "bench_bridge", "text": args.text, "max_block": BridgedSession.max_block,
               "reward_model": f"smollm2-135m-instruct[:{args.layers}]",
               "lms": {"same": "smollm2-135m-instruct", "bridged": "gemma3-270m"}, "k": args.k,
               "steps_per_row": steps, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "load_average": os.getloadavg()},
               "rows": rows, "summary": summary}
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

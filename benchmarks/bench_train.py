"""Reward-model training throughput: examples/s for methods lora / head / full at a few depths, in one run.

    python benchmarks/bench_train.py                       # default backbone, depths 2 4 8, batch 16 x 64 tokens
    python benchmarks/bench_train.py --depths 4 --threads 1 --steps 3

Each cell builds the model exactly as ``steerkit train`` does (:func:`steerkit.training.trainer.build_model`),
runs one warm-up step and then ``--steps`` timed optimizer steps (forward, the paper's cumulative loss,
backward, AdamW) on a fixed random batch, and reports the median. Prints a table and writes JSON to
``benchmarks/results/bench_train.json`` (atomically). The 1-minute load average is recorded before and
after: on a shared machine, compare only numbers taken under similar load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def bench_cell(backbone: str, method: str, layers: int, batch_size: int, seq_len: int, steps: int, lora_r: int) -> dict:
    from steerkit.training.config import TrainConfig
    from steerkit.training.loss import cumulative_loss
    from steerkit.training.trainer import build_model, trainable_parameters

    config = TrainConfig(backbone=backbone, num_layers=layers, method=method, output_dir="unused",
                         data=[{"path": "unused", "label_value": 1}],
                         lora={"r": lora_r, "alpha": 2 * lora_r,
                               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj"]})
    model = build_model(config).train()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-4, foreach=False)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab, (batch_size, seq_len), generator=gen)
    ids[:, 0] = model.config.start_token_id
    mask = torch.ones_like(ids)
    positions = mask.cumsum(-1) - 1
    targets = torch.rand(batch_size, generator=gen)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        rewards = model(ids, attention_mask=mask, position_ids=positions).rewards
        cumulative_loss(rewards, targets, mask).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i:  # the first step is a warm-up
            times.append(time.perf_counter() - start)
    step = statistics.median(times)
    return {"method": method, "layers": layers, "step_seconds": round(step, 4), "step_seconds_min": round(min(times), 4),
            "examples_per_second": round(batch_size / step, 2), "tokens_per_second": round(batch_size * seq_len / step, 1),
            "trainable_parameters": sum(p.numel() for p in params.values())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="smollm2-135m-instruct")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--methods", nargs="+", default=["lora", "head", "full"], choices=["lora", "head", "full"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per cell (after one warm-up step)")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_train.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TQDM_DISABLE", "1")

    load_before = os.getloadavg()[0]
    cells = []
    for layers in args.depths:
        for method in args.methods:
            cell = bench_cell(args.backbone, method, layers, args.batch_size, args.seq_len, args.steps, args.lora_r)
            cells.append(cell)
            print(f"  {method:>4} {layers:>2} layers: {cell['examples_per_second']:8.2f} ex/s "
                  f"({cell['step_seconds']:.3f} s/step)", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"reward-model training, {args.backbone}, batch {args.batch_size} x {args.seq_len} tokens, "
                        f"{torch.get_num_threads()} thread(s)")
    for col in ("method", "layers", "examples/s", "tokens/s", "s/step (median)", "trainable params"):
        table.add_column(col, justify="right")
    for c in cells:
        table.add_row(c["method"], str(c["layers"]), f"{c['examples_per_second']:.2f}", f"{c['tokens_per_second']:.0f}",
                      f"{c['step_seconds']:.3f}", f"{c['trainable_parameters']:,}")
    Console().print(table)

    from steerkit.files import atomic_write_text

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    payload = {
        "benchmark": "bench_train", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "backbone": args.backbone, "batch_size": args.batch_size, "seq_len": args.seq_len, "steps": args.steps,
        "lora_r": args.lora_r, "loss": "cumulative", "optimizer": "AdamW",
        "machine": {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "gpu": None,
                    "load_average_1min_before": round(load_before, 2), "load_average_1min_after": round(load_after, 2)},
        "results": cells,
    }
    atomic_write_text(args.out, json.dumps(payload, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Would a shallower ``toxicity`` reach issue 25's "RAD through llama.cpp with ``toxicity`` at most 2x llama.cpp plain
at Q4_1" on this CPU? Speed only, alternated in one run.

The shipped ``toxicity`` model reads 6 layers of SmolLM2. This probe cuts a copy of it to ``--depths`` layers (its
LoRA adapters of the layers kept; the head unchanged), so each copy does exactly the work per step a trained model of
that depth would do. **Its rewards are not a trained model's**: only the times mean anything, and the steered
texts differ between depths. It runs, batch 1, 1 thread, greedy, ``--tokens`` tokens for each of ``--prompts``
prompts (bench_cpu.py's prompts and rows):

* llama.cpp's own loop on the packaged Q4_1 file, plain (the target's base, as ``bench_cpu.py --targets``);
* ``engine="llama.cpp"`` (Q4_1) with each depth's reward, k = 20, beta = -20, on each of ``--backends``;

alternating over ``--rounds`` with the order reversed every round, and reports each row's ms per token and its ratio to
the base, per round and as a median.

    python benchmarks/probe_reward_depth.py      # ~5 min on one thread; JSON: results/probe_reward_depth.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_cpu  # noqa: E402
from cpu_info import cpu_flags  # noqa: E402


def cut_copy(source: Path, layers: int, into: Path) -> Path:
    """A copy of the reward-model directory ``source`` that reads its backbone's first ``layers`` layers only."""
    from safetensors.torch import load_file, save_file

    from steerkit.rewards.model_config import CONFIG_NAME

    target = into / f"depth{layers}"
    shutil.copytree(source, target)
    config = json.loads((target / CONFIG_NAME).read_text())
    if layers > config["num_layers"]:
        raise SystemExit(f"--depths: {layers} layers is more than the shipped model's {config['num_layers']}")
    config["num_layers"] = layers
    config["name"] = f"{config['name']}-cut-to-{layers}-layers"
    (target / CONFIG_NAME).write_text(json.dumps(config, indent=1))
    adapter = target / "adapter.safetensors"
    if adapter.exists():  # LoRA: keep the adapters of the layers kept
        kept = {k: v for k, v in load_file(adapter).items()
                if ".layers." not in k or int(k.split(".layers.")[1].split(".")[0]) < layers}
        save_file(kept, adapter)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 4])
    parser.add_argument("--backends", nargs="+", default=list(bench_cpu.REWARD_BACKENDS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "probe_reward_depth.json"))
    args = parser.parse_args()
    import llama_cpp
    import torch

    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.files import atomic_write_text
    from steerkit.llama_cpp_lib import load_llama
    from steerkit.models import load_tokenizer, resolve
    from steerkit.threads import set_threads
    from steerkit_toxicity import MODEL_DIR as shipped

    set_threads(1)  # torch is imported: it sets torch's threads too
    load_before = os.getloadavg()
    q4 = resolve(bench_cpu.LM).location
    tokenizer = load_tokenizer(bench_cpu.LM)
    prompts = bench_cpu.PROMPTS[:args.prompts]
    scratch = Path(tempfile.mkdtemp(prefix="probe_reward_depth_"))
    try:
        models = {d: cut_copy(shipped, d, scratch) for d in args.depths}
        llm = load_llama(str(q4), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
        llama_lm = (LlamaCppLM(str(q4), threads=1), tokenizer)
        base = "llama.cpp's own loop, Q4_1, plain"
        runs = {base: lambda: bench_cpu.llama_own_loop(llm, tokenizer, {}, args.tokens, prompts)}
        for depth, path in models.items():
            for backend in args.backends:
                runs[f"engine=llama.cpp, toxicity at {depth} layers ({backend})"] = (
                    lambda p=str(path), b=backend: bench_cpu.engine_run(llama_lm, {p: -20.0}, args.tokens, prompts, 1,
                                                                        b))
        per_round = bench_cpu.alternated_rounds(runs, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ms = {name: [round_ms[name] for round_ms in per_round] for name in runs}
    rows = []
    for name, values in ms.items():
        ratios = [round(v / b, 3) for v, b in zip(values, ms[base])]
        rows.append({"row": name, "ms_per_token": values, "ms_median": statistics.median(values),
                     "ratio_to_base": ratios, "ratio_median": statistics.median(ratios),
                     "rounds_at_most_2x": sum(x <= 2.0 for x in ratios)})
        print(f"{name:55s} {statistics.median(values):7.2f} ms/token; x base per round "
              + ", ".join(f"{x:.2f}" for x in ratios) + f" (median {statistics.median(ratios):.2f})", flush=True)
    report = {"benchmark": "probe_reward_depth", "base": base, "k": 20, "beta": -20.0, "tokens": args.tokens,
              "prompts": prompts, "threads": 1, "rounds": args.rounds, "rows": rows,
              "note": "speed only: the cut models' rewards are not trained models'",
              "cpu": cpu_flags(), "cpus": os.cpu_count(), "llama_cpp_python": llama_cpp.__version__,
              "torch": torch.__version__, "load_average": [list(load_before), list(os.getloadavg())]}
    atomic_write_text(Path(args.out), json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

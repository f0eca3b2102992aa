"""Cut an evaluation run archive down to its first N prompts × n continuations, to compare it with a reduced rerun.

The committed runs in docs/results/*/run.tar.gz were made with 100 prompts × 25 continuations. A rerun on the
CPU with fewer prompts (docs/results.md says which) is compared with the same prompts' first continuations of the
archived run, not with the full-scale figures. The subset directory is then rebuilt with `steerkit eval report`.

    python benchmarks/subset_eval_run.py docs/results/toxicity/run.tar.gz runs/eval-v1-toxicity --prompts 20 -n 10
    steerkit eval report runs/eval-v1-toxicity
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

LIST_FIELDS = ("continuations", "scores", "perplexities", "num_new_tokens", "rewards")


def subset(archive: Path, out: Path, prompts: int, continuations: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        src = Path(tmp)
        config = json.loads((src / "config.json").read_text())
        for p in config["prompts"]:
            p["limit"] = min(p.get("limit") or prompts, prompts)
        config["num_continuations"] = continuations
        config["fluency_samples"] = min(config.get("fluency_samples") or continuations, continuations)
        config["output"] = str(out)
        (out / "config.json").write_text(json.dumps(config, indent=1))
        # a setting's key hashes n (the continuations per prompt): recompute it for the subset
        from steerkit.evaluation.config import EvalConfig

        eval_config = EvalConfig.from_dict(config, source=str(out / "config.json"))
        keys = {s.name: eval_config.setting_key(s) for s in eval_config.grid()}
        for name in ("generations.jsonl", "scores.jsonl", "fluency.jsonl"):
            if not (src / name).is_file():
                continue
            kept = []
            for line in (src / name).read_text(encoding="utf-8").split("\n"):
                if not line.strip():
                    continue
                record = json.loads(line)
                if record.get("index", 0) >= prompts:
                    continue
                if "key" in record and record.get("setting") in keys:
                    record["key"] = keys[record["setting"]]
                for field in LIST_FIELDS:
                    if isinstance(record.get(field), list):
                        record[field] = record[field][:continuations]
                kept.append(json.dumps(record))
            (out / name).write_text("\n".join(kept) + "\n")
        for name in ("scorers.json",):
            if (src / name).is_file():
                (out / name).write_text((src / name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--prompts", type=int, required=True, help="first N prompts of each prompt set")
    parser.add_argument("-n", "--continuations", type=int, required=True)
    args = parser.parse_args()
    subset(args.archive, args.out, args.prompts, args.continuations)
    print(f"wrote {args.out}; rebuild with: steerkit eval report {args.out}")


if __name__ == "__main__":
    main()

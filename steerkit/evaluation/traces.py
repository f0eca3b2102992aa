"""``traces/SETTING.json``: one traced generation per steered setting of an eval run (each step's top-k
candidates, their logits, every reward, the combined scores, the betas and the choice), read by the plots."""

from __future__ import annotations

import json
from pathlib import Path

from ..files import atomic_write_text


def trace_is_current(path: Path, key: str, prompt_text: str) -> bool:
    """True when ``path`` already holds the trace of this setting key and prompt (a resumed run skips it)."""
    if not path.exists():
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return old.get("key") == key and old.get("prompt") == prompt_text


def trace_steps(trace, tokenizer) -> list[dict]:
    """The steps of row 0 of ``GenerationOutput.traces[0]`` as JSON-ready dicts (up to the first unchosen step)."""
    steps = []
    for step in trace:
        chosen = int(step.chosen[0])
        if chosen < 0:
            break
        ids = step.topk_ids[0].tolist()
        steps.append({
            "candidates": [tokenizer.decode([i]) for i in ids], "logits": step.topk_logits[0].tolist(),
            "rewards": {n: r[0].tolist() for n, r in step.rewards.items()}, "scores": step.scores[0].tolist(),
            "betas": step.betas, "chosen": chosen, "token": tokenizer.decode([ids[chosen]]),
        })
    return steps


def write_trace(path: Path, out, tokenizer, *, setting, key: str, prompt_set: str, prompt) -> None:
    """Write the trace of one traced generation ``out`` (``return_traces=True``) of ``setting`` on ``prompt``."""
    data = {"setting": setting.name, "key": key, "k": setting.k,
            "rewards": [r.model_dump() for r in setting.rewards], "prompt_set": prompt_set,
            "prompt_index": prompt.index, "prompt": prompt.text, "text": out.texts[0],
            "steps": trace_steps(out.traces[0], tokenizer)}
    atomic_write_text(path, json.dumps(data, ensure_ascii=False, indent=1))

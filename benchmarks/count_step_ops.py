"""Eager tensor operations per decoding step, by phase, outside the models' forwards (issue 25's GPU target).

On a GPU the compiled step replays each model forward as one CUDA graph, and what is left on the host is the
engine's eager glue around them: every tensor operation there is one dispatch and one kernel launch, tens of
microseconds each on the H100 machines' host (docs/performance.md, "Captured CUDA graphs"). This counts them,
exactly and independently of the machine: tiny random models (``steerkit.testing``), the static sessions that
``compile=True`` uses on a GPU (here run eagerly: the layout is the same, the forwards are not counted), 16 rows,
k = 20, each phase's operations per step (a ``TorchDispatchMode`` counts every aten call; calls inside the LM's or a
reward model's forward are left out).

    python benchmarks/count_step_ops.py [--layers 6] [--out benchmarks/results/count_step_ops.json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

PROMPTS = ["ab cd", "hello there friend", "x", "one two three"]


class PhaseCounter(TorchDispatchMode):
    """Counts aten calls per phase; none while a model's forward runs."""

    def __init__(self):
        super().__init__()
        self.phase, self.inside_model = "other", 0
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside_model:
            self.counts[self.phase] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def within(self, phase: str | None):
        """``phase``: count under that name; None: a model's forward (not counted)."""
        old = self.phase
        if phase is None:
            self.inside_model += 1
        else:
            self.phase = phase
        try:
            yield
        finally:
            if phase is None:
                self.inside_model -= 1
            else:
                self.phase = old


def patch(counter: PhaseCounter, owner, name: str, phase: str | None, undo: list) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        with counter.within(phase):
            return original(*args, **kwargs)

    setattr(owner, name, wrapped)
    undo.append((owner, name, original))


def count(kind: str, layers: int, rows: int, steps: int) -> dict:
    import steerkit
    import steerkit.engine.core as core
    from steerkit.engine.static_lm import StaticLM
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.rewards.token.session import TokenReward
    from steerkit.steering import SteeringTerm
    from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward, tiny_token_reward

    tokenizer = make_tokenizer()
    lm = tiny_lm(tokenizer, layers=layers)
    counter = PhaseCounter()
    undo: list = []
    terms = []
    if kind == "toxicity-like (sequence)":
        model = tiny_reward(tokenizer, seed=6, layers=layers)
        terms = [SteeringTerm(RewardModelScorer(model, context="full").compiled_form(compiled=False), -4.0, name="r")]
        patch(counter, model, "forward", None, undo)
    elif kind == "toxicity-token-like (token)":
        model = tiny_token_reward(tokenizer)
        terms = [SteeringTerm(TokenReward(model).compiled_form(compiled=False), -4.0, name="r")]
        patch(counter, model, "project", None, undo)
    patch(counter, lm, "forward", None, undo)
    for name, phase in [("step", "engine step (the rest)"), ("_commit", "reward commit"), ("advance", "LM advance"),
                        ("_emit", "emit (per-row text)")]:
        patch(counter, core.EngineCore, name, phase, undo)
    patch(counter, core, "rad_step", "RAD step (without scoring)", undo)
    import steerkit.engine.reward_groups as reward_groups

    patch(counter, reward_groups.RewardGroup, "score", "reward scoring", undo)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]

    def run(tokens: int):
        return steerkit.generate(prompts, lm=(StaticLM(lm, compiled=False), tokenizer), rewards=terms, k=20,
                                 max_new_tokens=tokens, eos_token_id=[])

    try:
        with counter:
            run(1)  # prefill and the first step only
            first = dict(counter.counts)
            counter.counts.clear()
            run(steps + 1)
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)
    per_step = {phase: round((n - first.get(phase, 0)) / steps, 1) for phase, n in counter.counts.items()
                if phase != "other"}
    per_step["total"] = round(sum(per_step.values()), 1)
    return per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6, help="layers of the tiny models (toxicity's reward: 6)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "count_step_ops.json")
    args = parser.parse_args()
    result = {"layers": args.layers, "rows": args.rows, "k": 20, "torch": torch.__version__, "per_step": {}}
    for kind in ["plain", "toxicity-like (sequence)", "toxicity-token-like (token)"]:
        result["per_step"][kind] = per_step = count(kind, args.layers, args.rows, args.steps)
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in per_step.items()), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

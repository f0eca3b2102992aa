"""Batch generation from a prompt file into a resumable JSONL file (``steerkit generate --input --output``).

One output line per (prompt, return sequence)::

    {"index": 0, "sequence": 0, "prompt": "...", "text": "...", "num_new_tokens": 20,
     "rewards": {"toxicity": [ρ of each chosen token]}, "seed": 2863311530, "settings": {...}}

``index`` is the prompt's 0-based record number in the input file (blank lines not counted: the join key back
to the input), ``seed`` the prompt's sampling seed, derived from the run seed, the prompt set name (the input
file's stem, as ``steerkit eval`` names prompt sets) and ``index`` only
(:func:`steerkit.evaluation.prompts.unit_seed`). So the records do not depend on which process made them, in
which order, or after how many interruptions: 1 process and N Ray actors write the same file.

Lines are appended and fsynced as each prompt finishes, in input order, by this process alone (the workers
return records; see :mod:`.executor`). Rerunning the same command resumes: :class:`~steerkit.evaluation.store.
JsonlStore`'s rules apply (a torn last line is dropped and redone, complete lines are kept), and a prompt
whose sequences were only partly written is generated again (same seed, same samples) and completed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import SteeringConfig
from ..errors import ConfigError, DataError
from ..evaluation.prompts import Prompt, load_prompts, unit_seed
from ..evaluation.store import JsonlStore

#: settings that may change between runs writing one file (they do not change what is sampled on one device)
RESUMABLE_CHANGES = ("device",)


def prompt_set_name(path: str | Path) -> str:
    """The name ``steerkit eval`` gives a prompt file (its stem without ``_prompts``): part of each seed."""
    return Path(path).stem.replace("_prompts", "") or "prompts"


@dataclass(frozen=True)
class BatchSettings:
    """What every worker needs to generate a prompt's records; also the worker factory (see :mod:`.executor`)."""

    config: SteeringConfig
    prompt_set: str
    prompt_field: str = "prompt.text"
    stop: tuple[str, ...] = ()
    batch_size: int | None = None  # rows per forward; None: all of a prompt's return sequences
    run_seed: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "run_seed", 0 if self.config.seed is None else self.config.seed)

    def with_device(self, device: str | None) -> "BatchSettings":
        if device is None or device == self.config.device:
            return self
        return BatchSettings(self.config.with_overrides({"device": device}), self.prompt_set, self.prompt_field,
                             self.stop, self.batch_size)

    def record_settings(self) -> dict:
        """The ``settings`` of every record, as JSON gives them back (tuples as lists)."""
        c = self.config
        return json.loads(json.dumps({"lm": c.lm, "k": c.k, "rewards": [r.model_dump() for r in c.rewards], "do_sample": c.do_sample,
                "temperature": c.temperature, "max_new_tokens": c.max_new_tokens,
                "num_return_sequences": c.num_return_sequences, "seed": self.run_seed,
                "chat_template": c.chat_template, "backend": c.backend, "stop": list(self.stop),
                "batch_size": self.batch_size, "prompt_set": self.prompt_set, "prompt_field": self.prompt_field,
                "device": c.device or "cpu"}))

    def __call__(self) -> "PromptGenerator":
        return PromptGenerator(self)


class PromptGenerator:
    """Loads the LM and the rewards once; ``generator(prompt)`` returns that prompt's records."""

    def __init__(self, settings: BatchSettings):
        from ..assembly import assemble_config

        self.settings = settings
        self.generator = assemble_config(settings.config).generator()
        self.common = settings.record_settings()

    def __call__(self, prompt: Prompt) -> list[dict]:
        s, cfg = self.settings, self.settings.config
        seed = unit_seed(s.run_seed, s.prompt_set, prompt.index)
        out = self.generator.generate([prompt.text], max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample,
                                      temperature=cfg.temperature, num_return_sequences=cfg.num_return_sequences,
                                      seed=seed, chat_template=cfg.chat_template, stop_strings=list(s.stop) or None,
                                      batch_size=s.batch_size, return_traces=True)
        rewards = chosen_rewards(out.traces, len(out.texts))
        return [{"index": prompt.index, "sequence": j, "prompt": prompt.text, "text": text,
                 "num_new_tokens": out.num_new_tokens[j], "rewards": rewards[j], "seed": seed,
                 "settings": self.common}
                for j, text in enumerate(out.texts)]


def chosen_rewards(traces, rows: int) -> list[dict[str, list[float]]]:
    """Per row, per reward: the reward of the token chosen at each step (the steps the row was generating)."""
    per_row: list[dict[str, list[float]]] = [{} for _ in range(rows)]
    offset = 0
    for chunk in traces or []:
        width = chunk[0].chosen.shape[0] if chunk else 0
        for step in chunk:
            chosen = step.chosen.tolist()
            index = step.chosen.clamp(min=0)[:, None]
            for name, values in step.rewards.items():
                picked = values.float().gather(1, index)[:, 0].tolist()
                for r, c in enumerate(chosen):
                    if c >= 0:  # -1: the row had finished
                        per_row[offset + r].setdefault(name, []).append(round(picked[r], 6))
        offset += width
    return per_row


class BatchJob:
    """The prompts of one input file, the output file, and what is left to do."""

    def __init__(self, settings: BatchSettings, input_path: str | Path, output: str | Path):
        self.settings = settings
        self.prompts = load_prompts(input_path, settings.prompt_field)
        self.output = Path(output)
        if self.output.is_dir():
            raise DataError(f"--output {self.output} is a directory; name a .jsonl file.")
        self.store = JsonlStore(self.output, lambda r: (r["index"], r["sequence"]))
        self._check_existing()

    def _check_existing(self) -> None:
        want = {k: v for k, v in self.settings.record_settings().items() if k not in RESUMABLE_CHANGES}
        texts = {p.index: p.text for p in self.prompts}
        for record in self.store:
            have = {k: v for k, v in record.get("settings", {}).items() if k not in RESUMABLE_CHANGES}
            if have != want:
                changed = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
                raise ConfigError(f"{self.output} holds records made with other settings ({', '.join(changed)} "
                                  "changed). Use another --output file, or delete that one to start over.")
            text = texts.get(record["index"])
            if text is not None and text != record["prompt"]:
                raise DataError(f"{self.output}: prompt {record['index']} was {record['prompt']!r} but the input "
                                f"file now has {text!r}; the input changed. Use another --output file.")

    def pending(self) -> list[Prompt]:
        n = self.settings.config.num_return_sequences
        return [p for p in self.prompts if any((p.index, j) not in self.store for j in range(n))]

    def run(self, executor=None, advance: Callable[[int], None] | None = None) -> int:
        """Generate every pending prompt (in input order) and append its missing records; returns prompts done."""
        from .executor import InProcess

        todo = self.pending()
        done = 0
        for records in (executor or InProcess()).map(todo, self.settings):
            self.store.extend([r for r in records if (r["index"], r["sequence"]) not in self.store])
            done += 1
            if advance is not None:
                advance(1)
        return done


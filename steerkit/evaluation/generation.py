"""The generation stage of an eval run, one unit (prompt set, prompt, setting) at a time.

:class:`UnitGenerator` holds the run's LM and rewards (loaded once, or injected by tests) and turns a
:class:`Unit` into its ``generations.jsonl`` record. The runner calls it in its own process; with
``steerkit eval --ray`` the runner sends ``UnitGenerator(config)`` to Ray actors instead, each of which loads the
models from the config's references (see :mod:`steerkit.distributed.executor`). The record depends only on the
config and the unit (the seed comes from :func:`~.prompts.unit_seed`), so both write the same continuations.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import EvalConfig, Setting
from .prompts import Prompt, unit_seed


@dataclass
class Unit:
    setting: Setting
    key: str
    prompt_set: str
    prompt: Prompt


class UnitGenerator:
    """The run's models and one generations record per unit. ``functools.partial(UnitGenerator, config)`` is
    the worker factory Ray actors get: the models load on first use, in the process that uses them."""

    def __init__(self, config: EvalConfig, *, lm: tuple | None = None, rewards: dict | None = None):
        self.config = config
        self._lm = lm
        self._rewards = dict(rewards or {})
        self._generators: dict[str, object] = {}
        self._device: str | None = None
        #: whether the generators run the compiled step: the config's choice, which the runner's generation stage
        #: settles where the config leaves it to steerkit (None: :func:`steerkit.compiling.compile_pays`)
        self.compile = bool(config.compile)

    def __call__(self, unit: Unit) -> dict:
        gen = self._generators.get(unit.setting.name)
        if gen is None:
            gen = self._generators[unit.setting.name] = self.generator(unit.setting)
        return self.record(unit, gen)

    def record(self, unit: Unit, gen) -> dict:
        """``unit``'s generations record, made with ``gen`` (a generator for ``unit.setting``)."""
        cfg = self.config
        out = gen.generate([unit.prompt.text], max_new_tokens=cfg.max_new_tokens, do_sample=True,
                           temperature=cfg.temperature, num_return_sequences=cfg.num_continuations,
                           seed=unit_seed(cfg.seed, unit.prompt_set, unit.prompt.index),
                           batch_size=cfg.batch_size or cfg.num_continuations)
        return {"prompt_set": unit.prompt_set, "index": unit.prompt.index, "setting": unit.setting.name,
                "key": unit.key, "prompt": unit.prompt.text, "continuations": out.texts,
                "num_new_tokens": out.num_new_tokens, "seconds": out.seconds, "device": self.device(),
                "compiled": self.compile, "engine": self.config.engine, "dtype": self.config.dtype}

    def device(self) -> str:
        """The torch device the run's models live on (``config.device``; the CPU by default)."""
        from ..devices import resolve_device

        if self._device is None:
            self._device = resolve_device(self.config.device)
        return self._device

    def lm(self):
        """The run's LM, loaded once for the engine that runs it, on the run's device (llama.cpp's: the CPU)."""
        if self._lm is None:
            from ..assembly import load_lm

            model, tokenizer = load_lm(self.config.lm, self.config.engine)
            self._lm = (model.to(self.device()), tokenizer)
        return self._lm

    def reward(self, name: str, context: str = "continuation"):
        key = (name, context)
        if key not in self._rewards:
            if name in self._rewards:
                return self._rewards[name]
            from ..devices import move_reward
            from ..rewards.loading import load_reward

            reward = load_reward(name, backend=self.config.backend, context=context)
            self._rewards[key] = move_reward(reward, self.device())
        return self._rewards[key]

    def terms(self, setting: Setting):
        """The setting's steering terms, built like a steering config's (labels included) on this run's rewards
        (each loaded once per run, on the run's device)."""
        from ..params import parse_rewards, resolve_terms

        return resolve_terms(parse_rewards(list(setting.rewards)),
                             lambda name, context: self.reward(name, context or "continuation"))

    def generator(self, setting: Setting):
        from ..assembly import assemble

        cfg = self.config
        return assemble(self.lm(), self.terms(setting), k=setting.k, engine=cfg.engine, compile=self.compile,
                        dtype=cfg.dtype).generator()

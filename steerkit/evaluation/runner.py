"""The evaluation run: generate → score → fluency → traces → metrics, each stage resumable.

Output directory layout::

    config.json          the EvalConfig of the latest invocation
    generations.jsonl    one line per (prompt set, prompt, setting): the n continuations, tokens, seconds
    scores.jsonl         one line per (scorer, prompt set, prompt, setting): a score per continuation
    fluency.jsonl        one line per (eval LM, prompt set, prompt, setting): a perplexity per continuation
    traces/SETTING.json  one traced generation per steered setting (top-k candidates, rewards, choice)
    metrics.json         the aggregated metrics (rebuilt from the files above on every run)
    report.md, plots/    tables and figures (PNG + the plotted data as JSON)

Work is done prompt by prompt (every setting of prompt i before prompt i+1), so an interrupted run
always has comparable settings on the prompts it finished. Every line is written and fsynced as soon
as its unit finishes; rerunning the same command resumes (see :mod:`steerkit.evaluation.store`).
Each prompt's sampling seed derives from (seed, prompt set, prompt index) only, so a resumed run
produces exactly what an uninterrupted one would, and all settings share random numbers per prompt.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from ..errors import ConfigError, DataError
from ..files import atomic_write_text
from . import metrics as M
from .config import EvalConfig, Setting
from .generation import Unit, UnitGenerator
from .prompts import Prompt, load_prompts, unit_seed
from .store import JsonlStore
from .traces import trace_is_current, write_trace

STAGES = ("generate", "score", "fluency", "trace", "report")


class EvalRunner:
    """Runs an :class:`EvalConfig`. Models, rewards and scorers can be injected (tests use tiny ones).

    ``executor`` runs the generation stage elsewhere (:class:`steerkit.distributed.executor.RayActors` for
    ``--ray``): it gets the pending units and ``UnitGenerator(config)`` and yields their records in order."""

    def __init__(self, config: EvalConfig, *, lm: tuple | None = None, rewards: dict | None = None,
                 scorers: list | None = None, eval_lm: tuple | None = None, progress: bool = True,
                 log: Callable[[str], None] | None = None, prompts_from_run: bool = False, executor=None):
        config.require_prompts()
        self.config = config
        self.out = Path(config.output)
        self.models = UnitGenerator(config, lm=lm, rewards=rewards)
        self.executor = executor
        self._lm_injected = lm is not None
        self._scorers = scorers
        self._eval_lm = eval_lm
        self.progress = progress
        self.log = log or (lambda msg: None)
        self.settings = config.grid()
        if not self.settings:
            raise ConfigError("Nothing to run: the grid is empty (no baseline, no betas, no settings).")
        self.keys = {s.name: config.setting_key(s) for s in self.settings}
        self.generations = JsonlStore(self.out / "generations.jsonl", lambda r: (r["prompt_set"], r["index"], r["setting"]))
        self.prompts = {p.name: self._load_prompts(p, prompts_from_run) for p in config.prompts}
        self.scores = JsonlStore(self.out / "scores.jsonl", lambda r: (r["scorer"], r["prompt_set"], r["index"], r["setting"]))
        self.fluency = JsonlStore(self.out / "fluency.jsonl", lambda r: (r["eval_lm"], r["prompt_set"], r["index"], r["setting"]))
        self._check_existing()

    def _load_prompts(self, prompt_set, from_run: bool) -> list[Prompt]:
        """The set's prompts from its file; with ``from_run`` (rebuilding a report on another machine) a
        missing file is replaced by the prompts recorded in this run's generations."""
        if from_run and not Path(prompt_set.path).is_file():
            recorded = {r["index"]: r["prompt"] for r in self.generations if r["prompt_set"] == prompt_set.name}
            if recorded:
                self.log(f"{prompt_set.path} is absent: using the {len(recorded)} prompts of set "
                         f"{prompt_set.name!r} recorded in {self.generations.path}")
                return [Prompt(i, recorded[i]) for i in sorted(recorded)]
        return load_prompts(prompt_set.path, prompt_set.field, prompt_set.limit, prompt_set.offset)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _check_existing(self) -> None:
        """Refuse to mix generations made with other parameters under the same setting name."""
        for record in self.generations:
            name = record["setting"]
            if name in self.keys and record.get("key") != self.keys[name]:
                raise ConfigError(
                    f"{self.generations.path} already holds generations for setting {name!r} made with other "
                    "parameters (LM, k, rewards, n, max_new_tokens, temperature, seed or backend changed). "
                    "Use a new --output directory, or delete that directory to start over.")
            prompts = {p.index: p.text for p in self.prompts.get(record["prompt_set"], [])}
            text = prompts.get(record["index"])
            if text is not None and text != record["prompt"]:
                raise DataError(
                    f"{self.generations.path}: prompt {record['index']} of set {record['prompt_set']!r} was "
                    f"{record['prompt']!r} but the prompt file now has {text!r}; the prompt file changed. "
                    "Use a new --output directory.")

    def units(self) -> list[Unit]:
        return [Unit(s, self.keys[s.name], name, p) for name, prompts in self.prompts.items()
                for p in prompts for s in self.settings]

    def pending(self) -> list[Unit]:
        return [u for u in self.units() if (u.prompt_set, u.prompt.index, u.setting.name) not in self.generations]

    # -- models (see .generation) -------------------------------------------------------------------
    def device(self) -> str:
        """The torch device the run's models live on (``config.device``; the CPU by default)."""
        return self.models.device()

    def apply_threads(self) -> None:
        from ..threads import set_threads

        set_threads(self.config.threads)  # None: steerkit's default (see steerkit.threads)

    def lm(self):
        return self.models.lm()

    def reward(self, name: str, context: str = "continuation"):
        return self.models.reward(name, context)

    def terms(self, setting: Setting):
        return self.models.terms(setting)

    def generator(self, setting: Setting):
        return self.models.generator(setting)

    def scorer_objects(self) -> list:
        if self._scorers is None:
            from .scorers import load_scorer

            self._scorers = [load_scorer(spec) for spec in self.config.scorers]
        names = [s.name for s in self._scorers]
        if len(set(names)) != len(names):
            raise ConfigError(f"Two scorers share a name ({names}); pass distinct scorers.")
        return self._scorers

    # -- stages ---------------------------------------------------------------------------------
    def run(self, stages: Iterable[str] = STAGES) -> dict:
        stages = list(stages)
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise ConfigError(f"Unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}.")
        atomic_write_text(self.out / "config.json", self.config.resolved().model_dump_json(indent=2))
        self.apply_threads()
        if "generate" in stages:
            self.generate()
        if "score" in stages:
            self.score()
        if "fluency" in stages and self.config.fluency:
            self.compute_fluency()
        if "trace" in stages and self.config.trace:
            self.trace()
        result = self.compute_metrics()
        if "report" in stages:
            self.write_report(result)
        return result

    def generate(self, limit: int | None = None) -> int:
        """Generate every pending unit (or the first ``limit``), in order; returns how many were done."""
        todo = self.pending()
        if limit is not None:
            todo = todo[:limit]
        if not todo:
            return 0
        compile = self.compile_choice(todo)
        if self.executor is None:
            self.device()  # fail before any work when the device is missing
            self.models.compile = compile
            generators: dict[str, object] = {}

            def record(unit: Unit) -> dict:
                if unit.setting.name not in generators:
                    generators[unit.setting.name] = self.generator(unit.setting)
                return self.models.record(unit, generators[unit.setting.name])

            records = map(record, todo)
        else:  # each actor loads the models from the config's references, on the executor's device if it has one
            device = getattr(self.executor, "device", None)
            overrides = {"compile": compile}
            if device not in (None, self.config.device):
                overrides["device"] = device
            config = self.config.with_overrides(overrides)
            records = self.executor.map(todo, partial(UnitGenerator, config))
        done = 0
        with self._bar("Generating", len(todo)) as advance:
            for record in records:
                self.generations.append(record)
                done += 1
                advance()
        return done

    def compile_choice(self, todo: list[Unit]) -> bool:
        """Whether the generation stage runs the compiled step: the config's ``compile``, or where that is None,
        whether compiling pays for ``todo``'s decode steps on the run's device (said in the log when it does)."""
        if self.config.compile is not None:
            return self.config.compile
        if self.config.engine != "steerkit":  # llama.cpp runs its own graph: there is nothing of steerkit's to compile
            return False
        from ..compiling import compile_pays

        cfg = self.config
        batches = -(-cfg.num_continuations // (cfg.batch_size or cfg.num_continuations))
        steps = len(todo) * batches * cfg.max_new_tokens
        device = getattr(self.executor, "device", None) or cfg.device or "cpu"
        pays = compile_pays(device, steps)
        if pays:
            self.log(f"Compiling the decode step: {steps:,} decode steps on {device} pay for it "
                     "(--no-compile runs eagerly).")
        return pays

    def _relevant(self) -> list[dict]:
        wanted = {(u.prompt_set, u.prompt.index, u.setting.name) for u in self.units()}
        return [r for r in self.generations if (r["prompt_set"], r["index"], r["setting"]) in wanted]

    def scorer_info(self) -> dict:
        """What each scorer that produced scores.jsonl measures (kept in scorers.json)."""
        path = self.out / "scorers.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def score(self, chunk_prompts: int = 40) -> int:
        records = self._relevant()
        done = 0
        info = self.scorer_info()
        for scorer in self.scorer_objects():
            info[scorer.name] = {"measures": scorer.measures, "threshold": float(getattr(scorer, "threshold", 0.5)),
                                 "description": getattr(scorer, "description", "")}
        atomic_write_text(self.out / "scorers.json", json.dumps(info, indent=2))
        for scorer in self.scorer_objects():
            todo = [r for r in records if (scorer.name, r["prompt_set"], r["index"], r["setting"]) not in self.scores]
            if not todo:
                continue
            with self._bar(f"Scoring ({scorer.name})", len(todo)) as advance:
                for lo in range(0, len(todo), chunk_prompts):
                    chunk = todo[lo:lo + chunk_prompts]
                    texts = [t for r in chunk for t in r["continuations"]]
                    values = scorer.score(texts)
                    lines, pos = [], 0
                    for r in chunk:
                        n = len(r["continuations"])
                        lines.append({"scorer": scorer.name, "prompt_set": r["prompt_set"], "index": r["index"],
                                      "setting": r["setting"], "scores": values[pos:pos + n]})
                        pos += n
                    self.scores.extend(lines)
                    done += len(chunk)
                    advance(len(chunk))
        return done

    def eval_lm_name(self) -> str:
        return self.config.eval_lm if self._eval_lm is None else "injected"

    def compute_fluency(self) -> int:
        from .fluency import PerplexityScorer

        name = self.eval_lm_name()
        def wanted(r) -> int:
            return len(r["continuations"][:self.config.fluency_samples])

        def done(r) -> list:
            old = self.fluency.get((name, r["prompt_set"], r["index"], r["setting"]))
            return old["perplexities"] if old else []

        # a record is pending when it is missing or covers fewer continuations than now asked for (a larger
        # --fluency-samples extends earlier records: only the missing continuations are scored)
        todo = [r for r in self._relevant() if len(done(r)) < wanted(r)]
        if not todo:
            return 0
        ppl = PerplexityScorer(self._eval_lm or self.config.eval_lm, batch_size=self.config.fluency_batch_size,
                               device=None if self._eval_lm else self.device())
        with self._bar(f"Perplexity ({name})", len(todo)) as advance:
            for r in todo:
                have = done(r)
                continuations = r["continuations"][len(have):wanted(r)]
                values = ppl.perplexities([r["prompt"]] * len(continuations), continuations)
                self.fluency.append({"eval_lm": name, "prompt_set": r["prompt_set"], "index": r["index"],
                                     "setting": r["setting"],
                                     "perplexities": have + [_finite_or_none(v) for v in values]})
                advance()
        return len(todo)

    def trace(self) -> list[Path]:
        """One traced generation per steered setting, of prompt ``trace_prompt`` of the first prompt set."""
        cfg = self.config
        first = next(iter(self.prompts))
        prompts = self.prompts[first]
        prompt = prompts[min(cfg.trace_prompt, len(prompts) - 1)]
        written = []
        for setting in self.settings:
            if not setting.steered:
                continue
            path = self.out / "traces" / f"{setting.name}.json"
            if trace_is_current(path, self.keys[setting.name], prompt.text):
                continue
            gen = self.generator(setting)
            out = gen.generate([prompt.text], max_new_tokens=cfg.max_new_tokens, do_sample=True,
                               temperature=cfg.temperature, num_return_sequences=1,
                               seed=unit_seed(cfg.seed, first, prompt.index), return_traces=True)
            write_trace(path, out, gen.tokenizer, setting=setting, key=self.keys[setting.name], prompt_set=first,
                        prompt=prompt)
            written.append(path)
        return written

    # -- aggregation ----------------------------------------------------------------------------
    def compute_metrics(self) -> dict:
        cfg = self.config
        scorer_info = self.scorer_info()
        eval_lm = self.eval_lm_name()
        results = []
        for set_name, prompts in self.prompts.items():
            indices = [p.index for p in prompts]
            # prompts finished under every setting: comparisons between settings are paired
            common = [i for i in indices if all((set_name, i, s.name) in self.generations for s in self.settings)]
            for setting in self.settings:
                gens = [self.generations.get((set_name, i, setting.name)) for i in common]
                row = {"prompt_set": set_name, "setting": setting.name, "k": setting.k, "beta": setting.beta(),
                       "direction": cfg.direction if len(setting.rewards) == 1 else None,
                       "rewards": [{"name": r.name, "beta": r.beta} for r in setting.rewards],
                       "steered": setting.steered, "num_prompts": len(gens),
                       "num_continuations": sum(len(g["continuations"]) for g in gens)}
                if gens:
                    row.update(self._row_metrics(set_name, setting, common, gens, scorer_info))
                results.append(row)
        result = {"task": cfg.task, "lm": "injected" if self._lm_injected else cfg.lm,
                  "reward": cfg.reward, "direction": cfg.direction,
                  "eval_lm": eval_lm if cfg.fluency else None,
                  "num_continuations": cfg.num_continuations, "max_new_tokens": cfg.max_new_tokens,
                  "dist_normalize": cfg.dist_normalize, "scorers": scorer_info, "results": results,
                  "prompt_sets": {p.name: {"path": p.path, "field": p.field, "requested": len(self.prompts[p.name])}
                                  for p in cfg.prompts}}
        atomic_write_text(self.out / "metrics.json", json.dumps(result, indent=2, ensure_ascii=False))
        return result

    def _row_metrics(self, set_name: str, setting: Setting, common: list[int], gens: list[dict],
                     scorer_info: dict) -> dict:
        """Every registered metric (:data:`.metrics.METRICS`) of one setting on the prompts ``common`` to all
        settings: those of the generations, of the perplexities (when computed), and per scorer in ``scorers``."""
        cfg = self.config
        row = M.compute("generations", M.MetricData(generations=gens, config=cfg))
        flu = [self.fluency.get((self.eval_lm_name(), set_name, i, setting.name)) for i in common]
        if cfg.fluency and all(f is not None for f in flu):
            values = [v if v is not None else float("nan") for f in flu
                      for v in f["perplexities"][:cfg.fluency_samples]]  # a smaller m after a larger
            row.update(M.compute("perplexities", M.MetricData(generations=gens, config=cfg, perplexities=values)))
        row["scorers"] = {}
        for name, info in scorer_info.items():
            sc = [self.scores.get((name, set_name, i, setting.name)) for i in common]
            if any(s is None for s in sc):
                continue
            row["scorers"][name] = M.attribute_metrics(info["measures"], [s["scores"] for s in sc],
                                                       info["threshold"], generations=gens, config=cfg)
        return row

    def write_report(self, result: dict) -> Path:
        from .report import write_report

        plots = {}
        if self.config.plots:
            from .plots import write_plots

            plots = write_plots(result, self.out / "plots", traces_dir=self.out / "traces")
        return write_report(result, self.out / "report.md", plots=plots, base=self.out)

    # -- cost -----------------------------------------------------------------------------------
    def estimate(self, sample_prompts: int = 1) -> dict:
        """Time ``sample_prompts`` prompts per setting and extrapolate (see :mod:`.estimate`)."""
        from .estimate import estimate_cost

        return estimate_cost(self, sample_prompts)

    # -- progress -------------------------------------------------------------------------------
    @contextmanager
    def _bar(self, description: str, total: int):
        if not self.progress:
            yield lambda n=1: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)


def _finite_or_none(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value

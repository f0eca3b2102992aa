"""What a ``steerkit eval`` run will cost (``--estimate``): time a few prompts per setting and extrapolate."""

from __future__ import annotations

import time

from .prompts import unit_seed


def estimate_cost(runner, sample_prompts: int = 1) -> dict:
    """Time ``sample_prompts`` prompts per setting of an :class:`~steerkit.evaluation.runner.EvalRunner`
    (models already warm after the first) and extrapolate to the whole run; fluency too when it is on."""
    runner.apply_threads()
    total_prompts = sum(len(p) for p in runner.prompts.values())
    first = next(iter(runner.prompts))
    sample = runner.prompts[first][:sample_prompts]
    cfg = runner.config
    per_setting = {}
    for setting in runner.settings:
        gen = runner.generator(setting)
        gen.generate([sample[0].text], max_new_tokens=2, num_return_sequences=2, seed=0)  # warm-up
        seconds = 0.0
        tokens = 0
        for p in sample:
            out = gen.generate([p.text], max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                               num_return_sequences=cfg.num_continuations, seed=unit_seed(cfg.seed, first, p.index),
                               batch_size=cfg.batch_size or cfg.num_continuations)
            seconds += out.seconds
            tokens += sum(out.num_new_tokens)
        per_setting[setting.name] = {"seconds_per_prompt": seconds / len(sample), "tokens_per_second": tokens / seconds}
    gen_total = sum(v["seconds_per_prompt"] for v in per_setting.values()) * total_prompts
    est = {"prompts": total_prompts, "settings": len(runner.settings), "continuations_per_prompt": cfg.num_continuations,
           "generation": per_setting, "generation_seconds": gen_total}
    if cfg.fluency:
        from .fluency import PerplexityScorer

        ppl = PerplexityScorer(runner._eval_lm or cfg.eval_lm, batch_size=cfg.fluency_batch_size)
        texts = [" and then the day went on as it always did, quietly"] * (cfg.fluency_samples or cfg.num_continuations)
        ppl.perplexities([sample[0].text] * 2, texts[:2])
        start = time.perf_counter()
        ppl.perplexities([sample[0].text] * len(texts), texts)
        est["fluency_seconds"] = (time.perf_counter() - start) * total_prompts * len(runner.settings)
    est["total_seconds"] = gen_total + est.get("fluency_seconds", 0.0)
    return est

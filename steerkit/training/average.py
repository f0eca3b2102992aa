"""One reward model from several trained the same way (``steerkit average``): a weight average, which scores like
their ensemble to first order at the cost of one model per step.

Models trained by one recipe with different seeds disagree on cases near the decision boundary (docs/training.md,
"Counter-speech that names the bias"); running all of them as one ensemble would multiply the reward's decode cost.
Their weights share the frozen backbone, so they can be averaged instead:

* **LoRA** (``method: lora``): the average of the adapters' weight updates, exactly. Each model adds
  ``(alpha / r) · B_i A_i`` to a weight; the average adds ``(alpha / r) · (1/n) Σ B_i A_i``, which is one adapter of
  rank ``n · r`` (``A`` the models' ``A_i`` stacked, ``B`` their ``B_i`` side by side divided by n, ``alpha`` times
  n so that ``alpha / r`` is unchanged). Nothing is approximated or truncated;
* the **head** (and, for ``method: full``, every backbone weight): the element-wise mean.

The models must agree on everything but their weights: kind, backbone and its fingerprint, layers, tokenizer, start
token, output function, LoRA settings. Token-level models are refused: a low-rank token head's factors cannot be
averaged exactly. The output is written next to its destination and swapped into place, as ``steerkit train`` writes
(:func:`~steerkit.training.output.write_model_dir`); its card names the models it averages. It is not evaluated here:
``steerkit train``'s metrics belong to each source model, not to their average.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import torch

from ..errors import ConfigError, RewardModelFormatError
from ..rewards.lora import KEY_PREFIX, adapter_factors
from ..rewards.model import ADAPTER_NAME, BACKBONE_NAME, CONFIG_NAME, HEAD_NAME, weight_files
from ..rewards.model_config import RewardModelConfig, read_config

#: config fields that may differ between the averaged models: the reward name (the average takes ``name`` or the first
#: model's) and the LoRA settings (compared on their own below: rank, alpha and targets must agree)
_FREE_FIELDS = {"name", "lora"}


def averaged_config(configs: Sequence[RewardModelConfig], paths: Sequence[Path]) -> RewardModelConfig:
    """The config of the average of models with ``configs``; :class:`ConfigError` naming the first field in which a
    model differs from the first, or a kind that cannot be averaged."""
    first = configs[0]
    if first.kind != "sequence":
        raise ConfigError(f"{paths[0]} is a token-level reward model; `steerkit average` averages sequence reward "
                          "models only (a low-rank token head's factors have no exact average).")
    mine = first.model_dump(exclude=_FREE_FIELDS)
    for config, path in zip(configs[1:], paths[1:]):
        theirs = config.model_dump(exclude=_FREE_FIELDS)
        field = next((f for f in mine if theirs[f] != mine[f]), None)
        if field is not None:
            raise ConfigError(f"{path} differs from {paths[0]} in {field!r} ({theirs[field]!r} against "
                              f"{mine[field]!r}); only models of one recipe (the same backbone, layers and settings) "
                              "can be averaged.")
        if _lora_shape(config) != _lora_shape(first):
            raise ConfigError(f"{path} differs from {paths[0]} in its LoRA settings ({config.lora} against "
                              f"{first.lora}); only adapters of one rank, alpha and target modules can be averaged.")
    if first.method != "lora":
        return first
    n = len(configs)
    return first.model_copy(update={"lora": first.lora.model_copy(update={"r": n * first.lora.r,
                                                                          "alpha": n * first.lora.alpha})})


def _lora_shape(config: RewardModelConfig) -> dict | None:
    """What of a model's LoRA settings its adapter's shape and scale depend on (dropout only acts in training)."""
    return None if config.lora is None else config.lora.model_dump(exclude={"dropout"})


def _same_keys(keys: Sequence, what: str) -> None:
    """Refuse models whose weight files hold different tensors (``keys``: one set per model)."""
    for other in keys[1:]:
        if set(other) != set(keys[0]):
            raise RewardModelFormatError(f"the models' {what} differ ({sorted(set(keys[0]) ^ set(other))[:3]}); "
                                         "they are not of one recipe.")


def average_tensors(states: Sequence[dict]) -> dict:
    """The element-wise mean of state dicts with the same keys and shapes (float32)."""
    _same_keys(states, "weight files")
    return {k: sum(s[k].float() for s in states) / len(states) for k in sorted(states[0])}


def average_adapters(states: Sequence[dict], sources: Sequence[str]) -> dict:
    """One LoRA adapter whose update is the mean of the adapters' updates (see the module's docstring); each state
    is read by the loader's own parser (:func:`~steerkit.rewards.lora.adapter_factors`)."""
    factors = [adapter_factors(state, source) for state, source in zip(states, sources)]
    _same_keys(factors, "adapted modules")
    n, out = len(factors), {}
    for module in sorted(factors[0]):
        a = torch.cat([f[module][0].float() for f in factors], 0)  # (n·r) × in
        b = torch.cat([f[module][1].float() for f in factors], 1) / n  # out × (n·r)
        out[f"{KEY_PREFIX}{module}.lora_A.weight"] = a.contiguous()
        out[f"{KEY_PREFIX}{module}.lora_B.weight"] = b.contiguous()
    return out


def average_reward_models(directories: Sequence[str | os.PathLike], output: str | os.PathLike, *,
                          name: str | None = None, overwrite: bool = False) -> Path:
    """Write the weight average of the reward-model ``directories`` (two or more, of one recipe) to ``output`` and
    return it. ``name``: the averaged model's reward name (default: the first model's)."""
    from safetensors.torch import load_file, save_file

    from ..files import atomic_write_text, sha256_file
    from .output import check_output_dir, write_model_dir

    paths = [Path(d) for d in directories]
    if len(paths) < 2:
        raise ConfigError(f"averaging needs at least two reward-model directories; got {len(paths)}.")
    if len({p.resolve() for p in paths}) < len(paths):
        raise ConfigError("a reward-model directory is named twice; average distinct models (a model twice would "
                          "weigh it double).")
    output = Path(output)
    check_output_dir(output, overwrite)
    configs = [read_config(p) for p in paths]
    config = averaged_config(configs, paths)
    if name is not None:
        config = config.model_copy(update={"name": name})
    files = weight_files(config)
    for path in paths:
        for f in files:
            if not (path / f).is_file():
                raise RewardModelFormatError(f"{path} has no {f}; is it a complete reward-model directory?")

    def fill(tmp: Path) -> None:
        sources = [{"path": path.name, **{f: sha256_file(path / f) for f in files}} for path in paths]
        for f in files:
            states = [load_file(str(p / f)) for p in paths]
            state = (average_adapters(states, [str(p / f) for p in paths]) if f == ADAPTER_NAME
                     else average_tensors(states))
            save_file(state, str(tmp / f))
        metrics = {"averaged_from": sources, "method": "weight average (steerkit average): the mean of the LoRA "
                   "updates as one adapter of rank n·r, the element-wise mean of the head", "models": len(paths)}
        atomic_write_text(tmp / "metrics.json", json.dumps(metrics, indent=2))
        atomic_write_text(tmp / CONFIG_NAME, config.model_dump_json(indent=2))
        atomic_write_text(tmp / "README.md", _card(config, configs[0], sources))

    write_model_dir(output, overwrite, fill)
    return output


def _card(config: RewardModelConfig, source: RewardModelConfig, sources: list[dict]) -> str:
    rows = "\n".join(f"| {s['path']} | `{s[HEAD_NAME][:16]}` | "
                     f"`{s.get(ADAPTER_NAME, s.get(BACKBONE_NAME, ''))[:16] or '–'}` |" for s in sources)
    update = (f"the mean of their LoRA updates, as one adapter of rank {config.lora.r} (each had rank "
              f"{source.lora.r}), and the element-wise mean of their heads" if config.method == "lora" else
              "the element-wise mean of their weights")
    return f"""# {config.name} (weight average of {len(sources)} reward models)

`steerkit average` made this reward model from {len(sources)} models of one recipe: {update}. It scores like their
ensemble to first order, at the decode cost of one model. Backbone `{config.backbone}` (fingerprint
`{config.backbone_fingerprint[:16]}`), {config.num_layers} layers.

| source model | head sha256 | adapter / backbone sha256 |
|---|---|---|
{rows}

**Not evaluated here.** The source models' cards and metrics describe them, not this average; measure it before
use (`steerkit eval`, `benchmarks/compare_reward_auroc.py`).
"""

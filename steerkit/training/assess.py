"""``steerkit train CONFIG --assess MODEL``: measure an existing reward model on a config's data.

The same dev split (seeded, per source), held-out sets, evaluation views, left-out sources and per-category
functional metrics that training would report, for a model that was not trained by this config: an earlier
version of a shipped model, a colleague's model, or an imported paper checkpoint. Nothing is trained or
written except the metrics JSON when asked for.
"""

from __future__ import annotations

from pathlib import Path

from .config import TrainConfig
from .metrics import final_metrics


def assess(config: TrainConfig, model_dir: str | Path) -> dict:
    from ..devices import resolve_device
    from ..rewards.kinds import kind_of
    from ..threads import set_threads
    from .trainer import tokenize_dataset

    set_threads(config.threads)
    device = resolve_device(config.device)
    dataset = config.read_dataset()
    model = kind_of(model_dir).model_class.from_pretrained(model_dir).to(device).eval()  # its kind's torch model
    tokens = tokenize_dataset(model, dataset, config)
    return final_metrics(model, dataset, tokens.dev, tokens.eval_sets, config)

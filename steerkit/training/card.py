"""Model cards: the README.md written into every trained reward-model directory (and ``config.card``)."""

from __future__ import annotations

from .config import TrainConfig

# Licences of the public sets steerkit is developed with (see the data README); a source's own
# ``licence`` field wins. Keys are path fragments.
KNOWN_LICENCES = {
    "rtp_scored_train": "RealToxicityPrompts: Apache-2.0",
    "davidson_hate_offensive": "MIT",
    "snlp_detox_jigsaw_sentences": "Jigsaw / Civil Comments: CC0",
    "paradetox": "CC0-1.0",
    "wiki_context_toxicity": "Apache-2.0; text CC-BY-SA",
    "sst2": "SST: no formal licence (research use)",
    "imdb": "IMDB reviews: no formal licence (research use)",
    "blitzer": "Blitzer Amazon reviews: research use",
}

GENERIC_LIMITATIONS = [
    "English only; trained on short texts truncated to {max_length} tokens (start token included), so "
    "evidence later in a long text is not seen.",
    "A reward model is a small learned classifier: it inherits the biases and blind spots of its "
    "training labels and can be fooled by paraphrase, misspelling or adversarial text.",
    "Scores are calibrated only as far as the training labels are; compare rewards, do not treat them "
    "as probabilities of harm.",
]


def licence_for(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    lowered = path.lower()
    for fragment, licence in KNOWN_LICENCES.items():
        if fragment in lowered:
            return licence
    return "not stated: check the upstream source before redistributing"


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _metrics_table(rows: dict[str, dict]) -> list[str]:
    lines = ["| set | n | MSE | AUROC | accuracy@0.5 | acc. 25% tokens | acc. 50% tokens | acc. 75% tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in rows.items():
        lines.append(f"| {name} | {m['n']} | {_num(m['mse'], 4)} | {_num(m['auroc'])} | {_num(m['accuracy'])} | "
                     f"{_num(m.get('accuracy_at_25pct'))} | {_num(m.get('accuracy_at_50pct'))} | "
                     f"{_num(m.get('accuracy_at_75pct'))} |")
    return lines


def _reproduce(config: TrainConfig) -> str:
    import os
    from pathlib import Path

    if not config.source_file:
        return "steerkit train --data ... (see training_config.json)"
    path = Path(config.source_file)
    try:
        path = Path(os.path.relpath(path.resolve(), Path.cwd()))
    except ValueError:
        pass
    if str(path).startswith(".."):
        path = Path(config.source_file)
    return f"steerkit train {path.as_posix()}"


def render_card(config: TrainConfig, metrics: dict) -> str:
    training = metrics.get("training", {})
    hw = training.get("hardware", {})
    lora = config.lora
    method = {"lora": f"LoRA (r={lora.r}, alpha={lora.alpha}, on {', '.join(lora.target_modules or ['the attention projections'])}) + scalar head",
              "head": "scalar head over a frozen backbone",
              "full": "full fine-tune of the kept layers + scalar head"}[config.method]
    out = [
        f"# `{config.name}` reward model",
        "",
        f"ρ = {config.attribute or 'the trained attribute'}, in [0, 1], read after every token of a text "
        "(a unidirectional reward model for Reward-Augmented Decoding).",
        "",
        "## Model",
        "",
        f"- Backbone: `{config.backbone}`, first {training.get('num_layers', config.num_layers)} transformer layers "
        "(the backbone weights are not stored here; they are resolved from the reference and checked by fingerprint)",
        f"- Method: {method}; {training.get('trainable_parameters', 0):,} trained parameters",
        f"- Input: start token + text (no prompt), at most {config.max_length} tokens; "
        f"loss: {'the cumulative prefix loss of the RAD paper' if config.loss == 'cumulative' else 'last-token MSE'}",
        "",
        "```python",
        "import steerkit",
        "reward = steerkit.load_reward(\"path/to/this/directory\")",
        "reward.model.score_texts([\"some text\"])",
        "```",
        "",
        "## Evaluation (data never trained on)",
        "",
        "AUROC and accuracy binarise continuous labels at 0.5. \"acc. 50% tokens\" reads the reward after only "
        "the first half of each text's tokens.",
        "",
    ]
    if metrics.get("eval"):
        out += ["Held-out test sets:", ""] + _metrics_table(metrics["eval"]) + [""]
        lengths = sorted({m.get("max_length") or config.max_length for m in metrics["eval"].values()})
        out += [f"Test texts are truncated to their first {', '.join(str(x) for x in lengths)} tokens (start token "
                "included), as in training: long texts are judged on their opening only.", ""]
    if metrics.get("dev"):
        out += [f"Dev split, held out from training (seeded {config.dev_fraction:.0%} of each training source, at most "
                f"{config.dev_max_per_source} rows each; rows of one file line stay on one side):", ""]
        out += _metrics_table(metrics["dev"]) + [""]
    out += ["## Training data", "",
            "| source | file | rows used | train | dev | skipped invalid | duplicates / eval overlap | licence |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for source, stats in zip(config.data, metrics.get("data", [])):
        out.append(f"| {stats['name']} | `{stats['path']}` | {stats['used']} | {stats['train']} | {stats['dev']} | "
                   f"{stats['skipped']} | {stats['duplicates']} | {licence_for(source.path, source.licence)} |")
    out.append("")
    if config.eval:
        out += ["Held-out test files (texts also present in training files were removed from training):", ""]
        for source in config.eval:
            sample = f", seeded sample of {source.limit} rows" if source.limit else ""
            out.append(f"- `{source.path}` ({source.display_name}{sample}): {licence_for(source.path, source.licence)}")
        out.append("")
    out += ["Label transforms, weights and limits are in `training_config.json`. The data files are not "
            "distributed with this model.", ""]
    out += [
        "## Training",
        "",
        f"- {training.get('steps')} steps of batch {training.get('batch_size')}, AdamW lr {config.learning_rate:g}, "
        f"seed {config.seed}",
        f"- {_num(training.get('train_seconds'), 0)} s training + {_num(training.get('eval_seconds'), 0)} s evaluation "
        f"on {hw.get('cpu', 'unknown CPU')} ({hw.get('cpu_count')} cores, {hw.get('torch_threads')} torch "
        f"thread{'s' if hw.get('torch_threads') != 1 else ''}, no GPU), torch {hw.get('torch')}",
        f"- Reproduce: `{_reproduce(config)}` (same seed and data files: their sha256 are in `metrics.json`)",
        "",
        "## Intended use",
        "",
        config.intended_use or "Steering and scoring text generation with steerkit (Reward-Augmented Decoding).",
        "",
        "## Limitations",
        "",
    ]
    out += [f"- {item}" for item in config.limitations]
    out += [f"- {item.format(max_length=config.max_length)}" for item in GENERIC_LIMITATIONS]
    out += ["", "## Data licences", ""]
    seen = set()
    for source in list(config.data) + list(config.eval):
        licence = licence_for(source.path, source.licence)
        if (source.path, licence) not in seen:
            seen.add((source.path, licence))
            out.append(f"- `{source.path}`: {licence}")
    out.append("")
    return "\n".join(out)

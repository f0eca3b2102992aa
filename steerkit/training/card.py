"""Model cards: the README.md written into every trained reward-model directory (and ``config.card``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    "Scores are calibrated only as far as the training labels are; compare rewards rather than reading "
    "them as calibrated probabilities.",
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
    """The model card's markdown, one section after another."""
    training = metrics.get("training", {})
    out = (_header_lines(config) + _model_lines(config, training) + _usage_lines() + choosing_beta_lines()
           + _evaluation_lines(config, metrics) + cross_source_section(config)
           + _training_data_lines(config, metrics) + _training_lines(config, training)
           + _intended_use_lines(config) + _limitations_lines(config) + _licence_lines(config))
    return "\n".join(out)


def _method(config: TrainConfig) -> str:
    """How the reward model was trained, in one phrase, as its kind words it (:mod:`steerkit.rewards.kinds`: a
    token-level head names its parametrisation)."""
    from ..rewards.kinds import DEFAULT_KIND, get_kind

    lora = config.lora
    method = {"lora": f"LoRA (r={lora.r}, alpha={lora.alpha}, on {', '.join(lora.target_modules or ['the attention projections'])}) + scalar head",
              "head": "scalar head over a frozen backbone",
              "full": "full fine-tune of the kept layers + scalar head"}[config.method]
    return get_kind(getattr(config, "kind", DEFAULT_KIND)).describe_method(config, method)


def _header_lines(config: TrainConfig) -> list[str]:
    return [
        f"# `{config.name}` reward model",
        "",
        f"ρ = {config.attribute or 'the trained attribute'}, in [0, 1], read after every token of a text "
        "(a unidirectional reward model for Reward-Augmented Decoding).",
        "",
    ]


def _model_lines(config: TrainConfig, training: dict) -> list[str]:
    return [
        "## Model",
        "",
        f"- Backbone: `{config.backbone}`, first {training.get('num_layers', config.num_layers)} transformer layers "
        "(the backbone weights are not stored here; they are resolved from the reference and checked by fingerprint)",
        f"- Method: {_method(config)}; {training.get('trainable_parameters', 0):,} trained parameters",
        f"- Input: start token + text (no prompt), at most {config.max_length} tokens; "
        f"loss: {'the cumulative prefix loss of the RAD paper' if config.loss == 'cumulative' else 'last-token MSE'}",
        "",
    ]


def _usage_lines() -> list[str]:
    """How to use the model: the snippet that loads and scores with it."""
    return [
        "```python",
        "import steerkit",
        "reward = steerkit.load_reward(\"path/to/this/directory\")",
        "reward.model.score_texts([\"some text\"])",
        "```",
        "",
    ]


def choosing_beta_lines() -> list[str]:
    """What β does, and how to measure a good β for this model (no numbers: they depend on the LM, k and the
    prompts, which a card cannot know)."""
    return [
        "## Choosing β",
        "",
        "While steering, each of the LM's top-k candidate tokens gets β·ρ added to its logit (ρ in [0, 1]), so β is "
        "in logit units: at temperature 1 and β = 10, the probability of a candidate with ρ = 1 relative to one with "
        "ρ = 0 is multiplied by e^10 (about 22,000), and a difference of 0.1 in ρ multiplies it by e (about 2.7). "
        "β > 0 favours high ρ, β < 0 low ρ.",
        "",
        "How far a given β moves the text, and what it costs in fluency, depends on the LM, k, the prompts and how "
        "far apart this model's rewards of a step's candidates lie, so measure it: "
        "`steerkit calibrate path/to/this/directory` steers a few prompts at a grid of β and prints each β's mean "
        "reward and the LM's perplexity of the continuations, with the range of β that moves the reward while the "
        "median perplexity stays within 1.5× (by default) that of β = 0.",
        "",
    ]


def _evaluation_lines(config: TrainConfig, metrics: dict) -> list[str]:
    """Held-out test sets, the dev split and the functional cases (``set / category`` names)."""
    out = [
        "## Evaluation (data never trained on)",
        "",
        "AUROC and accuracy binarise continuous labels at 0.5. \"acc. 50% tokens\" reads the reward after only "
        "the first half of each text's tokens.",
        "",
    ]
    tests = {k: v for k, v in (metrics.get("eval") or {}).items() if " / " not in k}
    functional = {k: v for k, v in (metrics.get("eval") or {}).items() if " / " in k}
    if tests:
        out += ["Held-out test sets:", ""] + _metrics_table(tests) + [""]
        lengths = sorted({m.get("max_length") or config.max_length for m in metrics["eval"].values()})
        out += [f"Test texts are truncated to their first {', '.join(str(x) for x in lengths)} tokens (start token "
                "included), as in training: long texts are judged on their opening only.", ""]
    if metrics.get("dev"):
        out += [f"Dev split, held out from training (seeded {config.dev_fraction:.0%} of each training source, at most "
                f"{config.dev_max_per_source} rows each; rows of one file line stay on one side):", ""]
        out += _metrics_table(metrics["dev"]) + [""]
    if functional:
        out += functional_table(functional)
    return out


def _training_data_lines(config: TrainConfig, metrics: dict) -> list[str]:
    """The per-source data table, augmentation and the held-out test files."""
    out = ["## Training data", "",
           "| source | file | rows used | train | dev | augmented copies | skipped invalid | duplicates / eval "
           "overlap | weight | licence |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    by_name = {s.display_name: s for s in config.data}
    for stats in metrics.get("data", []):
        source = by_name.get(stats["name"])
        weight, licence = (source.weight, licence_for(source.path, source.licence)) if source else (1.0, "")
        out.append(f"| {stats['name']} | `{shown_path(stats['path'], config)}` | {stats['used']} | {stats['train']} | {stats['dev']} | "
                   f"{stats.get('augmented', 0)} | {stats['skipped']} | {stats['duplicates']} | {weight:g} | {licence} |")
    out.append("")
    filtered = [(stats, by_name[stats["name"]]) for stats in metrics.get("data", [])
                if stats["name"] in by_name and by_name[stats["name"]].keep_matching]
    for stats, source in filtered:
        out.append(f"- {stats['name']}: only rows whose text matches `{source.keep_matching}` (case-insensitive); "
                   f"{stats.get('filtered', 0)} other valid rows left out.")
    if filtered:
        out.append("")
    out += augmentation_lines(config, metrics.get("augmentation") or {})
    if config.eval:
        out += ["Held-out test files (texts also present in training files were removed from training):", ""]
        for source in config.eval:
            sample = f", seeded sample of {source.limit} rows" if source.limit else ""
            out.append(f"- `{shown_path(source.path, config)}` ({source.display_name}{sample}): "
                       f"{licence_for(source.path, source.licence)}")
        out.append("")
    out += ["Label transforms, weights and limits are in `training_config.json`. The data files are not "
            "distributed with this model.", ""]
    return out


def _training_lines(config: TrainConfig, training: dict) -> list[str]:
    """Steps, optimiser, time and hardware, and the command that reproduces the run."""
    hw = training.get("hardware", {})
    return [
        "## Training",
        "",
        f"- {training.get('steps')} steps of batch {training.get('batch_size')}, AdamW lr {config.learning_rate:g}, "
        f"seed {config.seed}",
        f"- {_num(training.get('train_seconds'), 0)} s training + {_num(training.get('eval_seconds'), 0)} s evaluation "
        f"on {hw.get('cpu', 'unknown CPU')} ({hw.get('cpu_count')} cores, {hw.get('torch_threads')} torch "
        f"thread{'s' if hw.get('torch_threads') != 1 else ''}, {hw.get('gpu') or 'no GPU'}), torch {hw.get('torch')}",
        f"- Reproduce: `{_reproduce(config)}` (same seed and data files: their sha256 are in `metrics.json`)",
        "",
    ]


def _intended_use_lines(config: TrainConfig) -> list[str]:
    return [
        "## Intended use",
        "",
        config.intended_use or "Steering and scoring text generation with steerkit (Reward-Augmented Decoding).",
        "",
    ]


def _limitations_lines(config: TrainConfig) -> list[str]:
    """The config's own limitations, then the generic ones of every steerkit reward model."""
    return (["## Limitations", ""]
            + [f"- {item}" for item in config.limitations]
            + [f"- {item.format(max_length=config.max_length)}" for item in GENERIC_LIMITATIONS] + [""])


def shown_path(path: str, config: TrainConfig) -> str:
    """``path`` as the card shows it: a file that sits next to the config (``relative_to: config``, resolved to an
    absolute path when the config was read) relative to the config's directory, as the config wrote it, so the
    card does not depend on where the repository was checked out; anything else as it is."""
    if config.source_file and Path(path).is_absolute():
        base = Path(config.source_file).resolve().parent
        return Path(os.path.relpath(Path(path), base)).as_posix()
    return path


def _licence_lines(config: TrainConfig) -> list[str]:
    """Each training and test file's licence, once per (path, licence)."""
    out = ["## Data licences", ""]
    seen = set()
    for source in list(config.data) + list(config.eval):
        licence = licence_for(source.path, source.licence)
        if (source.path, licence) not in seen:
            seen.add((source.path, licence))
            out.append(f"- `{shown_path(source.path, config)}`: {licence}")
    out.append("")
    return out


def functional_table(rows: dict[str, dict]) -> list[str]:
    """Per-category results of a functional test set (``by: category``): most categories hold one class only,
    so the mean ρ and the share judged correctly at 0.5 are the measures; AUROC where both classes occur."""
    lines = ["Functional test cases (hand-written, per category; `expected` is the share labelled positive):", "",
             "| set / category | n | expected | mean ρ | correct at 0.5 | AUROC |", "|---|---:|---:|---:|---:|---:|"]
    for name, m in rows.items():
        lines.append(f"| {name} | {m['n']} | {_num(m['positive_rate'], 2)} | {_num(m['mean_reward'])} | "
                     f"{_num(m['accuracy'])} | {_num(m['auroc'])} |")
    return lines + [""]


def cross_source_lines(report: dict) -> list[str]:
    """The leave-one-source-out matrix of a ``cross_source.json``: one row per training run (all sources, or all
    but one), one column per source; a cell is that run's dev metric on the source, or, on the diagonal (bold),
    its metric on the whole source it never saw."""
    columns = report["sources"]
    metric = report.get("metric", "auroc")
    label = {"auroc": "AUROC", "accuracy": "accuracy@0.5"}[metric]
    lines = [f"| trained on ↓ / {label} on → | " + " | ".join(columns) + " | mean left-out |",
             "|---|" + "---:|" * (len(columns) + 1)]
    for fold in report["folds"]:
        cells = []
        for column in columns:
            m = fold["cells"].get(column)
            value = _num(m.get(metric)) if m else "–"
            cells.append(f"**{value}**" if column == fold.get("left_out") else value)
        held = fold.get("left_out_metric")
        lines.append(f"| {fold['name']} | " + " | ".join(cells) + f" | {_num(held) if held is not None else ''} |")
    return lines


def cross_source_section(config: TrainConfig) -> list[str]:
    if not config.cross_source or not Path(config.cross_source).is_file():
        return []
    report = json.loads(Path(config.cross_source).read_text(encoding="utf-8"))
    return ["## Leave-one-source-out validation", "",
            f"Each row is a model trained with the same recipe for {report.get('steps')} steps, on all sources or "
            "on all but one. Off the diagonal: the metric on that source's dev split; on the diagonal (bold): on "
            f"up to {report.get('leave_out_limit')} rows of the source the run never saw, which measures "
            "generalisation to a new source rather than in-distribution fit. "
            f"Reproduce: `{report.get('command', '')}`.", ""] + cross_source_lines(report) + [""]


def augmentation_lines(config: TrainConfig, info: dict) -> list[str]:
    if not config.augment.views:
        return []
    lines = ["Surface-form augmentation (training split only; a copy of a seeded share of each source's rows):", ""]
    for view in config.augment.views:
        where = f" of {', '.join(view.sources)}" if view.sources else ""
        label = f" with label ≥ {view.min_label:g}" if view.min_label is not None else ""
        lines.append(f"- {' + '.join(view.transforms)}: {view.rate:.0%} of the rows{where}{label}")
    if info.get("obfuscation_lexicon_size"):
        lines.append(f"- `obfuscate` perturbs the {info['obfuscation_lexicon_size']} words most indicative of the "
                     "positive class in the training data (letter swaps, dropped letters, spaced-out letters, "
                     "leetspeak, a starred vowel)")
    return lines + [f"- {info.get('copies', 0)} augmented rows in all", ""]

"""The shipped `toxicity` and `sentiment` reward models, and their token-level variants, hold their model cards'
claims.

* The hand-written functional cases (tests/functional/*.jsonl: implicit derogation, negated positives, spelling
  variants, counter-speech; lower-cased tokenized vs normally cased reviews, negation) are scored per category
  and each category must stay at or above its floor: a regression in any of the failure modes the cards
  describe fails the suite. The floors are the shipped models' measured results minus one case of slack.
* The headline held-out figures of the cards (s-nlp Jigsaw test sample AUROC, SST-2 test accuracy, the
  detokenized SST-2 view) are recomputed from ../shared/data and compared with the card's metrics.json
  (skipped, with the reason, where the data is absent).
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import requires_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONAL = ROOT / "tests" / "functional"
DATA = ROOT.parent / "shared" / "data"


def _probe_wordings() -> tuple[dict[str, str], tuple[str, ...]]:
    """The wordings and groups of plugins/steerkit-toxicity/data/probe_explicit_hate.py (a script, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "probe_explicit_hate", ROOT / "plugins" / "steerkit-toxicity" / "data" / "probe_explicit_hate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WORDINGS, module.GROUPS


# minimum share of each category judged correctly at 0.5 (see the module docstring)
FLOORS = {
    # 0.8.0 (0.5.0 + EDOS at half the weight, seed 0) measured 7/12, 5/12, 12/12, 12/12, 11/12, 12/12, 12/12 and 7/12
    # in other wording (0.5.0, 0.4.0's recipe at 3,200 steps: 9, 3, 12, 12, 10, 12, 12, 6; 0.4.0, + real counter-speech
    # from Reddit: 9, 4, 12, 12, 11, 12, 12, 6; 0.3.0, counter-speech grammar: 9, 4, 12, 6, 10, 12, 12, 6; 0.2.0: 2, 0,
    # 12, 1, 11, 12, 12; the card's failure modes: implicit derogation, counter-speech in other wording, negated
    # positives). Floors: one case under the measurement.
    "toxicity": {
        "implicit derogation": 6 / 12, "negated positive": 4 / 12, "spelling variants": 11 / 12,
        "counter-speech": 11 / 12, "counter-speech, other wording": 6 / 12, "neutral identity": 10 / 12,
        "explicit hate with profanity": 11 / 12, "neutral": 11 / 12,
    },
    # 0.2.0 measured 12/12, 11/12, 12/12, 11/12 and 7/12 (negation is the card's failure mode)
    "sentiment": {
        "lowercased tokenized, positive": 11 / 12, "lowercased tokenized, negative": 10 / 12,
        "normal casing, positive": 11 / 12, "normal casing, negative": 10 / 12, "negation": 6 / 12,
    },
    # token-level 0.6.0 (0.3.0's data recipe, counter-speech grammar, 3,000 steps): measured 8/12, 4/12, 12/12, 12/12,
    # 11/12, 12/12, 12/12 and 6/12 in other wording (0.3.0, 1,000 steps: 6, 3, 12, 7, 11, 12, 12, 5; with the fixed
    # frames: 3, 0, 12, 10, 12, 12, 12, 10; 0.2.0: 1, 0, 12, 9, 12, 12, 12). Floors: one case under the measurement.
    "toxicity-token": {
        "implicit derogation": 7 / 12, "negated positive": 3 / 12, "spelling variants": 11 / 12,
        "counter-speech": 11 / 12, "counter-speech, other wording": 5 / 12, "neutral identity": 10 / 12,
        "explicit hate with profanity": 11 / 12, "neutral": 11 / 12,
    },
    # token-level, distilled from `toxicity` (a steering reward, weaker on text): measured 0/12, 0/12, 12/12, 3/12,
    # 11/12, 12/12, 12/12, and 8/12 counter-speech in other wording
    "toxicity-token-distilled": {
        "implicit derogation": 0.0, "negated positive": 0.0, "spelling variants": 11 / 12, "counter-speech": 2 / 12,
        "counter-speech, other wording": 7 / 12, "neutral identity": 10 / 12, "explicit hate with profanity": 11 / 12,
        "neutral": 11 / 12,
    },
    # the rank-64 head on SmolLM2's own final hidden state (train_lm_state.yaml, 2,000 steps): measured 4/12, 1/12,
    # 12/12, 12/12, 12/12, 12/12, 12/12 and 7/12 in other wording
    "toxicity-lm": {
        "implicit derogation": 3 / 12, "negated positive": 0.0, "spelling variants": 11 / 12,
        "counter-speech": 11 / 12, "counter-speech, other wording": 6 / 12, "neutral identity": 11 / 12,
        "explicit hate with profanity": 11 / 12, "neutral": 11 / 12,
    },
    # token-level, 1600 steps: measured 12/12, 11/12, 12/12, 10/12 and 9/12
    "sentiment-token": {
        "lowercased tokenized, positive": 11 / 12, "lowercased tokenized, negative": 10 / 12,
        "normal casing, positive": 11 / 12, "normal casing, negative": 9 / 12, "negation": 8 / 12,
    },
}

# the later cases (tests/functional/toxicity_more.jsonl, written after 0.8.0 shipped; 24 a category, 12 for the last
# three): 0.8.0 measured 16/24, 6/24, 11/24, 21/24, 22/24, 12/12, 12/12, 12/12. Floors: one case under the measurement.
MORE_FLOORS = {
    "toxicity": {
        "implicit derogation": 15 / 24, "negated positive": 5 / 24, "counter-speech": 10 / 24,
        "counter-speech, other wording": 20 / 24, "neutral identity": 21 / 24, "explicit hate with profanity": 11 / 12,
        "spelling variants": 11 / 12, "neutral": 11 / 12,
    },
}

# the cases that name a bias (tests/functional/toxicity_named.jsonl, written after 0.8.0 shipped): 0.8.0 measured 16/24,
# 15/24 and 11/12. Floors: one case under the measurement.
NAMED_FLOORS = {
    "toxicity": {"counter-speech naming the bias": 15 / 24, "hate denying the bias": 14 / 24,
                 "abuse with a bias word": 10 / 12},
}

# name -> (plugin directory, package, model directory, training config)
SHIPPED = {
    "toxicity": ("steerkit-toxicity", "steerkit_toxicity", "model", "train.yaml"),
    "sentiment": ("steerkit-sentiment", "steerkit_sentiment", "model", "train.yaml"),
    "toxicity-token": ("steerkit-toxicity", "steerkit_toxicity", "model_token", "train_token.yaml"),
    "sentiment-token": ("steerkit-sentiment", "steerkit_sentiment", "model_token", "train_token.yaml"),
    "toxicity-token-distilled": ("steerkit-toxicity", "steerkit_toxicity", "model_token_distilled",
                                 "train_token_distill.yaml"),
    "toxicity-lm": ("steerkit-toxicity", "steerkit_toxicity", "model_lm_state", "train_lm_state.yaml"),
}


def _load(name: str):
    import steerkit

    return steerkit.load_reward(name).model


def _per_category(model, path: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    scores = model.score_texts([r["text"] for r in rows])
    hits = defaultdict(list)
    for row, score in zip(rows, scores):
        hits[row["category"]].append((float(score) >= 0.5) == (row["label"] >= 0.5))
    return {c: sum(v) / len(v) for c, v in hits.items()}


def _assert_floors(name: str, model, path: Path, floors: dict[str, float]) -> None:
    measured = _per_category(model, path)
    assert set(measured) == set(floors)
    below = {c: (round(v, 3), floors[c]) for c, v in measured.items() if v < floors[c]}
    assert not below, f"{name}: categories below their floor (measured, floor): {below}"


@pytest.mark.parametrize("name", list(FLOORS))
def test_functional_cases_per_category(name):
    _assert_floors(name, _load(name), FUNCTIONAL / f"{name.split('-')[0]}.jsonl", FLOORS[name])


@pytest.mark.parametrize("name", list(MORE_FLOORS))
def test_later_functional_cases_per_category(name):
    model = _load(name)
    _assert_floors(name, model, FUNCTIONAL / f"{name}_more.jsonl", MORE_FLOORS[name])
    # the card's examples of a group's name alone raising rho over 0.5
    assert all(float(s) > 0.5 for s in model.score_texts(["A trans woman was elected to the city council.",
                                                             "Two gay dads cheered at their daughter's graduation."]))


@pytest.mark.parametrize("name", list(NAMED_FLOORS))
def test_cases_that_name_the_bias_per_category(name):
    model = _load(name)
    _assert_floors(name, model, FUNCTIONAL / f"{name}_named.jsonl", NAMED_FLOORS[name])
    # the card's figure for blatant profane hate against five groups (measured 0.93; the later recipes with DynaHate's
    # profane not-hate entries: 0.18-0.55)
    wordings, groups = _probe_wordings()
    texts = [template.format(group) for template in wordings.values() for group in groups]
    scores = [float(s) for s in model.score_texts(texts)]
    assert sum(scores[:len(groups)]) / len(groups) > 0.85 and min(scores) > 0.5, scores


def _card_metrics(name: str) -> dict:
    plugin, package, model, _ = SHIPPED[name]
    return json.loads((ROOT / "plugins" / plugin / package / model / "metrics.json").read_text())


def _measure_held_out(name: str, eval_set: str, metric: str, held_from: Path | None = None) -> float:
    """``metric`` of the shipped model ``name`` on its config's held-out set ``eval_set`` (or that of the config
    ``held_from``), scored by the model's own config; skips where the set's file is not under the data root."""
    from steerkit.training.assess import assess
    from steerkit.training.config import TrainConfig

    plugin, _, _, train_config = SHIPPED[name]
    config = TrainConfig.from_file(ROOT / "plugins" / plugin / train_config)
    # only the eval set is measured (no dev split), so training sources that are not in ../shared/data (0.3.0's
    # hate-speech files, written by a conversion script) are not needed
    root = config.resolved_data_root()
    source = TrainConfig.from_file(held_from) if held_from else config
    held = [s for s in source.eval if s.metrics_name == eval_set]
    absent = [str(s.resolve(root)) for s in held if not s.resolve(root).is_file()]
    if absent:  # a set written by a conversion script (EDOS, SBIC), not in ../shared/data
        pytest.skip(f"{eval_set} is not under the data root ({', '.join(absent)}): write it with "
                    "plugins/steerkit-toxicity/data/convert_hate_sources.py and set STEERKIT_DATA_ROOT")
    config = config.model_copy(update={"eval": held,
                                       "dev_fraction": 0.0,
                                       "data": [s for s in config.data if s.resolve(root).is_file()]})
    return assess(config, config.output_dir)["eval"][eval_set][metric]


@pytest.mark.slow
@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent: the held-out test sets live there")
@pytest.mark.parametrize("name, eval_set, metric, target", [
    ("toxicity", "s-nlp Jigsaw test_10k (toxic + normal)", "auroc", 0.97),  # 0.8.0: measured 0.980 (0.5.0: 0.982)
    ("toxicity", "RTP held-out continuations", "auroc", 0.93),  # issue 26's floor; 0.8.0 measured 0.945 (0.5.0: 0.949)
    ("toxicity", "EDOS test", "auroc", 0.70),  # sexism in polite words; 0.8.0 measured 0.715 (0.5.0: 0.660)
    ("sentiment", "SST-2 test", "accuracy", 0.87),
    ("toxicity-token", "s-nlp Jigsaw test_10k (toxic + normal)", "auroc", 0.97),  # 0.6.0: 0.977 (0.3.0: 0.965)
    ("sentiment-token", "SST-2 test", "accuracy", 0.81),  # 4 layers, 1600 steps; measured 0.821
    ("toxicity-token-distilled", "s-nlp Jigsaw test_10k (toxic + normal)", "auroc", 0.93),  # measured 0.936
    # the 30-layer LM reads 1,189 texts in about a minute (the 5,000 s-nlp ones: four); measured 0.861
    ("toxicity-lm", "RTP held-out continuations", "auroc", 0.85),
])
def test_card_headline_figures_recompute(name, eval_set, metric, target):
    measured = _measure_held_out(name, eval_set, metric)
    claimed = _card_metrics(name)["eval"][eval_set][metric]
    assert measured == pytest.approx(claimed, abs=1e-4)
    assert measured >= target  # the floor: no loss against the previous shipped model


@pytest.mark.slow
@pytest.mark.parametrize("name, claimed", [("toxicity", 0.674), ("toxicity-token", 0.656), ("toxicity-lm", 0.609)])
def test_card_sbic_figure_recomputes(name, claimed):
    """The cards' SBIC dev AUROC (a held-out set written by a conversion script, named in the Implicit Hate
    experiment's config, not in the shipped configs): each model scored by its own config's path."""
    experiment = ROOT / "plugins" / "steerkit-toxicity" / "train_implicit_hate_experiment.yaml"
    measured = _measure_held_out(name, "SBIC dev", "auroc", held_from=experiment)
    assert measured == pytest.approx(claimed, abs=5e-4)

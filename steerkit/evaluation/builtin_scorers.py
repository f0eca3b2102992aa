"""The scorers shipped with steerkit, registered through the public ``register_scorers`` hook.

This module is listed in :data:`steerkit.registry.BUILTIN_PLUGINS`, so it registers exactly as an
installed plugin package would. Factories import their optional dependencies only when called, so
registering is free and ``steerkit plugins`` lists every scorer even when its extra is not installed.
"""

from __future__ import annotations

from ..registry import hookimpl


def _tox_block(**options):
    from .scorers.offline import ToxBlockScorer

    return ToxBlockScorer(**options)


def _profanity(**options):
    from .scorers.offline import ProfanityCheckScorer

    return ProfanityCheckScorer(**options)


def _vader(**options):
    from .scorers.offline import VaderScorer

    return VaderScorer(**options)


def _textblob(**options):
    from .scorers.offline import TextBlobScorer

    return TextBlobScorer(**options)


def _hf_classifier(model: str, **options):
    from .scorers.hf import HFClassifierScorer

    return HFClassifierScorer(model, **options)


def _perspective(**options):
    from .scorers.perspective import PerspectiveScorer

    return PerspectiveScorer(**options)


def _reward(reward: str, **options):
    from .scorers.hf import RewardModelTextScorer

    return RewardModelTextScorer(reward, **options)


BUILTIN_SCORERS = {
    "tox-block": (_tox_block, "toxicity: BiLSTM trained on Jigsaw 2018 (offline; extra eval-tox-block: tensorflow-cpu, tf-keras)"),
    "alt-profanity-check": (_profanity, "toxicity: TF-IDF + linear SVM on Davidson + Jigsaw (offline, fast; extra eval)"),
    "vader": (_vader, "sentiment: VADER lexicon, (compound+1)/2 (offline; extra eval)"),
    "textblob": (_textblob, "sentiment: TextBlob pattern lexicon, (polarity+1)/2 (offline; extra eval)"),
    "hf-classifier": (_hf_classifier, "any HF sequence classifier: hf-classifier:MODEL,label=POSITIVE,measures=sentiment"),
    "perspective": (_perspective, "toxicity: Perspective API (needs PERSPECTIVE_API_KEY; rate-limited, retried, cached)"),
    "reward": (_reward, "a steerkit reward model as a judge: reward:REF,measures=toxicity (not independent of steering)"),
}


@hookimpl
def register_scorers(register):
    for name, (factory, description) in BUILTIN_SCORERS.items():
        register(name, factory, description=description)

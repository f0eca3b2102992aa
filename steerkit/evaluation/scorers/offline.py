"""Offline scorers that ship their models inside PyPI packages (optional extras).

* ``tox-block``: a BiLSTM over GloVe embeddings trained on the 2018 Jigsaw toxic-comment data
  (six Perspective-like labels; the ``toxic`` probability is used). Needs ``tox-block``,
  ``tensorflow-cpu`` and ``tf-keras``; steerkit runs it with ``TF_USE_LEGACY_KERAS=1``.
* ``alt-profanity-check``: TF-IDF + linear SVM trained on Davidson et al. and Jigsaw; fast and
  profanity-leaning (it misses polite insults and threats).
* ``vader``: VADER's rule-based sentiment lexicon (``vaderSentiment``); score = (compound + 1) / 2.
* ``textblob``: TextBlob's pattern lexicon; score = (polarity + 1) / 2.

tox-block's own prediction module unpickles its tokenizer with the (long gone) ``keras_preprocessing``
package at import. steerkit instead reads that file with a restricted unpickler that only rebuilds
plain containers (no code from the file runs) and re-implements the Keras tokenizer's
``texts_to_sequences`` + ``pad_sequences``; the network itself is loaded from the package's HDF5 file.
alt-profanity-check loads its own joblib files from its installed package directory (that package's
code does so on import; nothing from user paths is unpickled).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from ...errors import PluginError
from .base import BaseScorer, require_package

TOX_BLOCK_INSTALL = 'pip install "steerkit-rad[eval-tox-block]"  (tox-block tensorflow-cpu tf-keras)'
PROFANITY_INSTALL = 'pip install "steerkit-rad[eval]"  (alt-profanity-check, scikit-learn==1.9.1)'
VADER_INSTALL = 'pip install "steerkit-rad[eval]"  (vaderSentiment)'
TEXTBLOB_INSTALL = 'pip install "steerkit-rad[eval]"  (textblob)'


# -- tox-block ---------------------------------------------------------------------------------
class _State:
    """Stand-in for the pickled TokenSequencer / keras Tokenizer: keeps their attributes only."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict, slots)
            state = state[0] or {}
        self.__dict__.update(state)


class _RestrictedUnpickler(pickle.Unpickler):
    ALLOWED = {
        ("collections", "OrderedDict"), ("collections", "defaultdict"), ("builtins", "int"),
        ("builtins", "dict"), ("builtins", "list"),
    }
    STANDINS = {
        ("tox_block.data_processing.preprocessors", "TokenSequencer"),
        ("keras_preprocessing.text", "Tokenizer"),
        ("keras.preprocessing.text", "Tokenizer"),
    }

    def find_class(self, module, name):
        if (module, name) in self.STANDINS:
            return _State
        if (module, name) in self.ALLOWED:
            import builtins
            import collections

            return getattr(collections if module == "collections" else builtins, name)
        raise PluginError(f"tox-block encoder refers to {module}.{name}, which steerkit does not load.")


class KerasTokenizer:
    """``keras_preprocessing.text.Tokenizer.texts_to_sequences`` + ``pad_sequences`` (pre-pad, pre-truncate)."""

    def __init__(self, word_index: dict, num_words: int | None, maxlen: int, filters: str, lower: bool,
                 split: str, oov_token=None, char_level: bool = False):
        self.word_index, self.num_words, self.maxlen = word_index, num_words, maxlen
        self.lower, self.split, self.char_level, self.oov_token = lower, split, char_level, oov_token
        self.table = str.maketrans({c: split for c in filters})

    @classmethod
    def from_pickle(cls, path: Path) -> "KerasTokenizer":
        with open(path, "rb") as fh:
            seq = _RestrictedUnpickler(fh).load()
        tok = seq.tokenizer
        return cls(dict(tok.word_index), getattr(tok, "num_words", None), int(seq.max_sequence_length),
                   getattr(tok, "filters", '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'), getattr(tok, "lower", True),
                   getattr(tok, "split", " "), getattr(tok, "oov_token", None), getattr(tok, "char_level", False))

    def words(self, text: str) -> list[str]:
        if self.lower:
            text = text.lower()
        if self.char_level:
            return list(text)
        return [w for w in text.translate(self.table).split(self.split) if w]

    def encode(self, texts: list[str]):
        import numpy as np

        out = np.zeros((len(texts), self.maxlen), dtype="int32")
        oov = self.word_index.get(self.oov_token) if self.oov_token else None
        for row, text in enumerate(texts):
            ids = []
            for w in self.words(text):
                i = self.word_index.get(w)
                if i is not None and not (self.num_words and i >= self.num_words):
                    ids.append(i)
                elif oov is not None:
                    ids.append(oov)
            ids = ids[-self.maxlen:]
            if ids:
                out[row, self.maxlen - len(ids):] = ids
        return out


class ToxBlockScorer(BaseScorer):
    name = "tox-block"
    measures = "toxicity"
    description = ("tox-block 0.1.2: BiLSTM + GloVe trained on Jigsaw 2018 toxic comments; probability of "
                   "'toxic' (min-max rescaled as the package does). Offline; needs tensorflow-cpu + tf-keras.")
    LABELS = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
    RESCALE = {"toxic": (0.002116, 0.999858), "severe_toxic": (0.000011, 0.648682),
               "obscene": (0.000347, 0.997533), "threat": (0.000040, 0.918887),
               "insult": (0.000373, 0.986303), "identity_hate": (0.000074, 0.901117)}

    def __init__(self, label: str = "toxic", rescale: bool = True, batch_size: int = 256):
        if label not in self.LABELS:
            raise PluginError(f"tox-block label {label!r} unknown; use one of {', '.join(self.LABELS)}.")
        require_package("tox_block", TOX_BLOCK_INSTALL, self.name)
        require_package("tf_keras", TOX_BLOCK_INSTALL, self.name)
        import importlib.util

        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        spec = importlib.util.find_spec("tox_block")
        root = Path(list(spec.submodule_search_locations)[0])
        version = (root / "VERSION").read_text().strip()
        models = root / "trained_models"
        self.tokenizer = KerasTokenizer.from_pickle(models / f"encoder_{version}.pkl")
        import tf_keras

        self.model = tf_keras.models.load_model(str(models / f"lstm_model_{version}.h5"), compile=False)
        self.label, self.column, self.rescale, self.batch_size = label, self.LABELS.index(label), rescale, batch_size

    def _score(self, texts: list[str]) -> list[float]:
        probs = self.model.predict(self.tokenizer.encode(texts), verbose=0, batch_size=self.batch_size)[:, self.column]
        if self.rescale:
            lo, hi = self.RESCALE[self.label]
            probs = abs((probs - lo) / (hi - lo))
        return [min(max(float(p), 0.0), 1.0) for p in probs]


# -- alt-profanity-check -----------------------------------------------------------------------
class ProfanityCheckScorer(BaseScorer):
    name = "alt-profanity-check"
    measures = "toxicity"
    description = ("alt-profanity-check 1.9.1: TF-IDF + calibrated linear SVM trained on Davidson et al. "
                   "tweets and Jigsaw; probability of offensive/profane language. Fast; misses polite insults.")

    def __init__(self, batch_size: int = 1024):
        require_package("profanity_check", PROFANITY_INSTALL, self.name)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn version-mismatch notes, if any
            from profanity_check import predict_prob
        self._predict = predict_prob
        self.batch_size = batch_size

    def _score(self, texts: list[str]) -> list[float]:
        return [float(p) for p in self._predict(texts)]


# -- sentiment lexicons ------------------------------------------------------------------------
class VaderScorer(BaseScorer):
    name = "vader"
    measures = "sentiment"
    description = ("VADER 3.3.2 rule-based sentiment lexicon (social-media tuned); score = (compound + 1) / 2, "
                   "positive when compound > 0.05 (VADER's own convention). Weak on subtle reviews.")
    threshold = 0.525

    def __init__(self):
        require_package("vaderSentiment", VADER_INSTALL, self.name)
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        self.analyzer = SentimentIntensityAnalyzer()

    def _score(self, texts: list[str]) -> list[float]:
        return [(self.analyzer.polarity_scores(t)["compound"] + 1.0) / 2.0 for t in texts]


class TextBlobScorer(BaseScorer):
    name = "textblob"
    measures = "sentiment"
    description = ("TextBlob's pattern sentiment lexicon; score = (polarity + 1) / 2, positive when "
                   "polarity > 0. Weak on negation and subtle reviews.")
    threshold = 0.5

    def __init__(self):
        require_package("textblob", TEXTBLOB_INSTALL, self.name)
        from textblob.en.sentiments import PatternAnalyzer

        self.analyzer = PatternAnalyzer()

    def _score(self, texts: list[str]) -> list[float]:
        return [(self.analyzer.analyze(t).polarity + 1.0) / 2.0 for t in texts]



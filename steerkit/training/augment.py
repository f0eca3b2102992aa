"""Surface-form augmentation of training rows: the same text in the other forms a reward model will meet.

A reward model trained on one surface form learns the form. The s-nlp Jigsaw sentences and SST-2 are
lower-cased and tokenized (``it 's a charming , often affecting journey .``), IMDB and Amazon reviews are not;
a model that sees each form only with one source's labels learns "tokenized = positive". Augmentation adds, to
the *training* split only (never dev or test), copies of a seeded fraction of each source's rows in another form:

* ``lowercase``; ``tokenize`` (Penn-Treebank-style spacing: ``it's`` -> ``it 's``, ``good.`` -> ``good .``);
* ``detokenize`` (the reverse, with sentence capitalisation) for sources that are tokenized already;
* ``strip_punctuation``;
* ``denounce`` (with the view's ``label``, e.g. 0): counter-speech, the row quoted or reported inside a sentence
  that rejects it, so that a model learns that quoting hate to reject it is not hate; ``endorse`` (label kept): the
  row behind the same lead-ins but approved of, so that the lead-in alone never decides the label;
  ``denounce_named`` / ``endorse_named``: the same from the grammar's variant that may also name the bias in the
  rejection ("..., and what a sexist thing to say") and deny it in the approval (steerkit/training/surface.py);
* ``obfuscate``: letter swaps, dropped letters, spaced-out letters, leetspeak and joined words applied to the
  words that mark the positive class *in the training data itself* (the ``lexicon_size`` words with the highest
  smoothed log-odds of appearing in rows labelled >= 0.5), e.g. slurs and insults in toxicity data. An explicit
  ``words`` list replaces the mined lexicon.

Every choice is a pure function of (seed, file, line, view), so a resumed run sees the same copies.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from .data import Example
from .surface import Transform, apply_transforms, unit

_WORD = re.compile(r"[a-z][a-z']+")


class AugmentView(BaseModel):
    """One augmented form: ``transforms`` applied in order to a ``rate`` fraction of each eligible source's rows."""

    model_config = ConfigDict(extra="forbid")
    transforms: list[Transform] = Field(min_length=1)
    rate: float = Field(gt=0, le=1, description="Fraction of each source's training rows that get this copy")
    sources: list[str] | None = Field(default=None, description="Only these sources (name or group); default all")
    min_label: float | None = Field(default=None, ge=0, le=1, description="Only rows with label >= this")
    label: float | None = Field(default=None, ge=0, le=1, description="The copies' label (default: the row's own; "
                                "a view that changes the meaning, such as `denounce`, sets it)")


class AugmentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    views: list[AugmentView] = []
    lexicon_size: int = Field(default=200, ge=1, description="Positive-class words mined for `obfuscate`")
    lexicon_min_count: int = Field(default=8, ge=1)
    words: list[str] | None = Field(default=None, description="Explicit `obfuscate` words instead of mining them")


def mine_lexicon(examples: list[Example], size: int, min_count: int) -> list[str]:
    """The words most indicative of label >= 0.5 (smoothed log-odds, each word counted once per row)."""
    pos, neg = Counter(), Counter()
    n_pos = n_neg = 0
    for ex in examples:
        words = set(_WORD.findall(ex.text.lower()))
        if ex.label >= 0.5:
            pos.update(words)
            n_pos += 1
        else:
            neg.update(words)
            n_neg += 1
    if not n_pos or not n_neg:
        return []
    scored = []
    for word, count in pos.items():
        if count < min_count or len(word) < 3:
            continue
        p, q = (count + 0.5) / (n_pos + 1), (neg[word] + 0.5) / (n_neg + 1)
        scored.append((math.log(p / (1 - p)) - math.log(q / (1 - q)), word))
    scored.sort(reverse=True)
    return [w for s, w in scored[:size] if s > math.log(4)]  # at least 4x the odds in positive rows



def augment(train: list[Example], source_names: list[tuple[str, str]], config: AugmentConfig,
            seed: int, paths: list[str]) -> tuple[list[Example], dict[int, int], list[str]]:
    """Augmented copies of training rows: (new examples, copies per source index, obfuscation lexicon).

    ``source_names[i]`` is (display name, metrics name) of source i, matched against a view's ``sources``.
    A copy whose text does not change (a lower-case row lower-cased) is not added.
    """
    if not config.views:
        return [], {}, []
    needs_lexicon = any("obfuscate" in v.transforms for v in config.views)
    lexicon = (list(config.words) if config.words is not None
               else mine_lexicon(train, config.lexicon_size, config.lexicon_min_count) if needs_lexicon else [])
    lex = {w.lower() for w in lexicon}
    added: list[Example] = []
    counts: dict[int, int] = {}
    for v, view in enumerate(config.views):
        wanted = set(view.sources) if view.sources is not None else None
        for ex in train:
            if wanted is not None and not wanted & set(source_names[ex.source]):
                continue
            if view.min_label is not None and ex.label < view.min_label:
                continue
            key = f"{seed}:augment:{v}:{paths[ex.source]}:{ex.line}"
            if unit(key) >= view.rate:
                continue
            text = apply_transforms(ex.text, view.transforms, lex, key)
            if text.strip() and text != ex.text:
                added.append(Example(text, ex.label if view.label is None else view.label, ex.source, ex.line))
                counts[ex.source] = counts.get(ex.source, 0) + 1
    return added, counts, lexicon

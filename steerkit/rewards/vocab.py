"""Whether two tokenizers share a vocabulary (candidate token ids can then be used by both as they are)."""

from __future__ import annotations

import weakref

#: tokenizer -> {id of the other tokenizer: (a weak reference to it, the answer)}: comparing two 49k-token
#: vocabularies takes ~80 ms, and every ``generate`` call starts each token reward's session with this check
_answers: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def same_vocabulary(a, b) -> bool:
    """True when two tokenizers map every token string to the same id (candidate ids can be shared). The answer
    is remembered for the pair while both tokenizers live (a tokenizer's vocabulary is not edited in place by
    steerkit; one that gains tokens changes its length, which is checked every time)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    try:
        known = _answers.setdefault(a, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: compare every time
        return a.get_vocab() == b.get_vocab()
    entry = known.get(id(b))
    if entry is not None and entry[0]() is b:
        return entry[1]
    answer = a.get_vocab() == b.get_vocab()
    try:
        known[id(b)] = (weakref.ref(b), answer)
    except TypeError:  # the other one cannot be weakly referenced: not remembered
        pass
    return answer

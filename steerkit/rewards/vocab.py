"""Whether two tokenizers share a vocabulary (candidate token ids can then be used by both as they are)."""

from __future__ import annotations


def same_vocabulary(a, b) -> bool:
    """True when two tokenizers map every token string to the same id (candidate ids can be shared)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())

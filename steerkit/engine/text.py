"""A row's text: incremental detokenization and the one stop-string rule.

**Stop rule** (:func:`find_stop`): the stop string that is *completed first* ends the text — of all matches,
the one that ends earliest (ties: the one that starts earliest, i.e. the longest). ``include_stop`` keeps it
(``steerkit.generate``'s default, like transformers' ``stop_strings``) or cuts just before it (the HTTP
server's default, OpenAI's convention).

**Incremental detokenization** (:class:`StreamText`): each token decodes only a short window of ids (from a
few tokens back, so that tokenizers whose decoder strips or merges at the start of a window still give the
right difference), so streaming costs O(window) per token instead of re-decoding the whole output. Text is
held back while it ends in U+FFFD (a multi-byte character split across tokens) or could be the start of a
stop string.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"

#: How many ids before the newest ones each incremental decode re-reads (as vLLM's detokenizer does).
WINDOW = 5


def find_stop(text: str, stops, start: int = 0) -> tuple[int, int] | None:
    """``(start, end)`` of the stop string completed first in ``text[start:]`` (see the module docstring)."""
    best = None
    for stop in stops:
        i = text.find(stop, start)
        if i >= 0 and (best is None or (i + len(stop), i) < (best[1], best[0])):
            best = (i, i + len(stop))
    return best


def cut_at_stop(text: str, stops, include_stop: bool) -> str:
    """``text`` ended by the stop rule (unchanged when no stop string occurs)."""
    hit = find_stop(text, stops)
    if hit is None:
        return text
    return text[: hit[1] if include_stop else hit[0]]


class StreamText:
    """The text of one row, token by token: :meth:`push` returns the new final text and whether a stop string
    ended the row. The row's text is ``decode(ids, skip_special_tokens=True)``, as ``generate`` decodes."""

    def __init__(self, tokenizer, stop, include_stop: bool = False):
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.include_stop = include_stop
        self.longest_stop = max((len(s) for s in self.stop), default=0)
        self.emitted = ""  # text handed out so far
        self.decoded = ""  # text decoded so far (complete characters)
        self._prefix = 0  # ids[_prefix:_read] decode to the end of ``decoded`` (the window's head)
        self._read = 0

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _catch_up(self, ids: list[int], final: bool) -> None:
        if len(ids) <= self._read:
            return
        head = self._decode(ids[self._prefix:self._read])
        text = self._decode(ids[self._prefix:])
        if len(text) > len(head) and (final or not text.endswith(REPLACEMENT)) and text.startswith(head):
            self.decoded += text[len(head):]
            self._prefix, self._read = max(self._prefix, len(ids) - WINDOW), len(ids)
        elif final or not text.startswith(head):  # a decoder that rewrote the window: decode it all once
            self.decoded = self._decode(ids)
            self._prefix, self._read = max(0, len(ids) - WINDOW), len(ids)

    def push(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """The new text after ``ids`` (all generated ids so far) and whether a stop string ended the row.
        ``final``: no token follows (EOS, length, ...), so nothing is held back any more."""
        self._catch_up(ids, final)
        text = self.decoded
        if self.stop:
            hit = find_stop(text, self.stop, max(0, len(self.emitted) - self.longest_stop))
            if hit is not None:
                return self._advance(text[: hit[1] if self.include_stop else hit[0]]), True
        if not final:
            text = self._hold_back(text)
        return self._advance(text), False

    def _hold_back(self, text: str) -> str:
        text = text.rstrip(REPLACEMENT)
        for n in range(min(self.longest_stop - 1, len(text)), 0, -1):  # longest suffix that starts a stop string
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return text[:-n]
        return text

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.emitted) or not text.startswith(self.emitted):
            return ""  # nothing new (or a re-decoding that changed earlier text: already streamed, kept)
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta

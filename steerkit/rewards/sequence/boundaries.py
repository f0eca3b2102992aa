"""Where a bridged session's stable boundary moves (:class:`~steerkit.rewards.sequence.bridge.BridgedSession`).

The reward model's cache holds the reward tokens of a row's committed text up to a boundary ``S``; the text after it
(the tail) is re-tokenized with every candidate at every step, so the tail's length is each candidate block's width.
After each commit the boundary moves to the latest of these spots that re-tokenizes cleanly, ``rm(T[P:S]) +
rm(T[S:]) == rm(T[P:])`` (``P`` the current boundary):

1. **Whitespace:** the start of a whitespace run followed by a non-space character (the last
   :attr:`~StableBoundaries.max_boundary_tries`). The pre-tokenizers of the byte-level BPE and SentencePiece
   families never merge across it, so text appended later cannot change the tokens before it: the cache is exactly
   the from-scratch tokenization.
2. **Pre-token starts**, once the tail passes :attr:`~StableBoundaries.max_tail` reward tokens (code, a URL, markup):
   where one of the reward tokenizer's pre-tokens starts, away from whitespace (byte-level BPE's split between
   letters and punctuation), which appended text cannot move either.
3. **A cut at a token**, once the tail still passes :attr:`~StableBoundaries.max_block` tokens: a run that neither
   splits (Chinese or Japanese text, which has no whitespace and is one byte-level pre-token; any long word under a
   SentencePiece reward tokenizer). The boundary goes where a token of the tail's current tokenization starts, at
   least :attr:`~StableBoundaries.tail_keep` characters before the end, and the cache keeps the tokens before it.
   That is the from-scratch tokenization of the text so far; text appended later could in principle merge across
   the cut, where scoring from scratch would then see other tokens. Without the cut a block would grow with the
   run, and each step's scoring with it: quadratic time and memory in the tokens a request asks for.
"""

from __future__ import annotations

import re
from itertools import islice

REPLACEMENT = "\ufffd"
_BOUNDARY = re.compile(r"(?<=\S)\s+(?=\S)")


class StableBoundaries:
    """The boundary search of a bridged session, which provides ``texts``, ``stable`` (each row's ``S``),
    ``rm_tokenizer`` and ``_rm_encode``."""

    #: most recent whitespace boundaries tried per commit when advancing the stable boundary
    max_boundary_tries = 3
    #: reward-model tokens after the boundary past which the starts of the reward tokenizer's pre-tokens are tried
    #: too (:meth:`_pretoken_starts`; text without whitespace: code, a URL, repeated markup), so that the candidates'
    #: blocks do not grow with the text; at least ``tail_keep`` characters stay after such a boundary
    max_tail, tail_keep = 16, 8
    #: reward-model tokens after the boundary past which, with no clean split, the boundary is cut at a token
    #: (:meth:`_cut_at_token`): the most a candidate's block grows to, whatever the text
    max_block = 32

    def _choose_boundaries(self, rows: list[int], tails: dict[int, list[int] | None]):
        """New boundary per row, searched after the current one: ``{b: (S, rm(T[P:S]))}``.

        ``tails[b]`` is ``rm(T[P:])`` when already known (the chosen block), else None.
        """
        unknown = [b for b in rows if tails[b] is None]
        for b, ids in zip(unknown, self._rm_encode([self.texts[b][self.stable[b]:] for b in unknown])):
            tails[b] = ids
        trials = []
        for b in rows:
            text, start = self.texts[b], self.stable[b]
            tail = text[start:].rstrip(REPLACEMENT)
            spots = [start + m.start() for m in _BOUNDARY.finditer(tail)][::-1][:self.max_boundary_tries]
            if len(tails[b]) > self.max_tail:  # a long tail: also where the reward tokenizer's pre-tokens start
                end = start + len(tail) - self.tail_keep
                near = [s for s in spots if s >= end]  # whitespace near the end: preferred
                late = [start + a for a in self._pretoken_starts(tail)[::-1] if start + a <= end][:8]
                spots = near + late + [s for s in spots if s < end]
            trials += [(b, s) for s in spots]
        pieces = []
        for b, s in trials:
            pieces += [self.texts[b][self.stable[b]:s], self.texts[b][s:]]
        encoded = self._rm_encode(pieces)
        result = {b: (self.stable[b], []) for b in rows}
        done = set()
        for i, (b, s) in enumerate(trials):  # latest boundary first; the first that re-tokenizes cleanly wins
            if b in done:
                continue
            head, rest = encoded[2 * i], encoded[2 * i + 1]
            if head + rest == tails[b]:
                result[b] = (s, head)
                done.add(b)
        for b in rows:
            if len(tails[b]) - len(result[b][1]) > self.max_block:  # still too long: cut at a token
                result[b] = self._cut_at_token(b) or result[b]
        return result

    def _pretoken_starts(self, text: str) -> list[int]:
        """Where in ``text`` a pre-token of the reward tokenizer starts (e.g. byte-level BPE's split between letters
        and punctuation), but the first and the last, away from whitespace: splits that text appended later cannot
        move (none without a pre-tokenizer; a SentencePiece-style one splits at whitespace only)."""
        pre = getattr(getattr(self.rm_tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
        if pre is None:
            return []
        starts = [a for _, (a, _) in pre.pre_tokenize_str(text)][1:-1]
        return [a for a in starts if not text[a - 1].isspace() and not text[a].isspace()]

    def _cut_at_token(self, b: int) -> tuple[int, list[int]] | None:
        """Row ``b``'s boundary at a token of its tail's tokenization ``rm(T[P:])`` (encoded again here, for its
        character offsets) that starts on a character of its own at least :attr:`tail_keep` characters before the end
        (not in trailing U+FFFD): ``(S, the tokens before it)``. Of the last 8 such tokens, the latest whose split
        re-tokenizes cleanly (the text after it alone gives the tokens after it); else the latest (under a
        SentencePiece-style tokenizer the text after the cut then reads as if a word started there). None: a tokenizer
        without offsets (a slow one), or no such token."""
        start = self.stable[b]
        text = self.texts[b][start:]
        end = len(text.rstrip(REPLACEMENT)) - self.tail_keep
        try:
            enc = self.rm_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:  # a slow (Python) tokenizer gives no offsets
            return None
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        # token i starts a character of its own: the token before it ends there and starts before it (byte pieces of
        # one character share that character's offsets)
        starts_own = (i for i in range(len(ids) - 1, 0, -1) if 0 < offsets[i][0] <= end
                      and offsets[i - 1][1] <= offsets[i][0] and offsets[i - 1][0] < offsets[i][0])
        cuts = list(islice(starts_own, 8))  # the last 8, latest first
        if not cuts:
            return None
        rests = self._rm_encode([text[offsets[i][0]:] for i in cuts])
        i = next((i for i, rest in zip(cuts, rests) if rest == ids[i:]), cuts[0])
        return start + offsets[i][0], ids[:i]

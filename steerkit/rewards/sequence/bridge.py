"""Tokenizer bridging: a reward model whose tokenizer differs from the language model's.

The reward model (RM) must score exactly what it would score from scratch: the row's text
``prefix + decode(generated LM ids + candidate)`` tokenized with the RM's own tokenizer. Doing that
from scratch for k candidates at every step costs O(k·L); this session keeps it incremental:

* **Stable boundary.** Per row, the RM cache holds the RM tokens of the committed text up to a *stable
  boundary* ``S`` (a character offset), chosen so that re-tokenizing confirms the split:
  ``rm(T[P:S]) + rm(T[S:]) == rm(T[P:])`` (``P`` the previous boundary, ``T`` the committed text). ``S`` is the
  start of a whitespace run followed by a non-space character, across which the pre-tokenizers of the byte-level
  BPE and SentencePiece/Metaspace families never merge, so text appended later cannot change the tokens before it;
  in text without whitespace, a split that appended text cannot move either; and in a run that neither splits
  (Chinese, a long word) a cut at a token, which bounds each candidate's block (:mod:`.boundaries`).
* **Candidates.** The text after ``S`` (the *unstable tail*) plus each candidate's text is re-tokenized
  with the RM tokenizer and the k results are scored as k blocks in one shared-prefix forward
  (:meth:`ScoringCache.score_blocks`): each block sees the cached prefix and itself.
* **Candidate text** is ``decode(ids + [c]) − decode(ids)`` over a short window of the last LM ids, never
  a candidate decoded on its own (byte-level tokens and SentencePiece word starts only decode right in
  context). Incomplete UTF-8 (a multi-byte character split across LM tokens decodes to U+FFFD) is
  handled by the same difference: a candidate may *replace* trailing characters of the committed text
  (``"caf\\ufffd"`` → ``"café"``). Boundaries never fall inside trailing U+FFFD runs, so those characters
  always sit in the unstable tail.
* **Commit.** The chosen block's KV is kept (:meth:`commit_choice`), the boundary advances, and the cache
  is rolled back (:meth:`rollback`) to the new boundary; any disagreement (a token that was not a
  candidate, an unexpected tokenization) is repaired by rolling back to the longest common prefix and
  appending the right tokens, so the cache equals a from-scratch tokenization of ``T[:S]`` (up to a cut
  at a token, :mod:`.boundaries`).

The per-row work that remains is string work the tokenizers need anyway (batched decode and encode
calls); the model runs one forward per step for all B·k candidates, as in the same-tokenizer case. Where the cache
scores ragged (:attr:`BridgedSession.ragged`), a pruned round's ``active`` candidates alone are decoded, re-tokenized
and run, in the cache's row groups.
"""

from __future__ import annotations

import os.path

import torch

from .boundaries import REPLACEMENT, StableBoundaries


class BridgedSession(StableBoundaries):
    """A :class:`~steerkit.rewards.base.RewardSession` for a reward model from another tokenizer family (its
    boundary search: :class:`~steerkit.rewards.sequence.boundaries.StableBoundaries`)."""

    #: LM tokens of left context decoded together with each candidate (widened when it starts mid-character)
    window = 4

    def __init__(self, scorer, texts: list[str], lm_tokenizer):
        self.scorer = scorer
        self.model = scorer.model
        self.rm_tokenizer = scorer.model.tokenizer
        self.lm_tokenizer = lm_tokenizer
        self.pad_token_id = lm_tokenizer.pad_token_id
        rm_pad = self.rm_tokenizer.pad_token_id
        self.rm_pad_id = rm_pad if rm_pad is not None else 0
        B = len(texts)
        self.prefixes = list(texts)
        self.texts = list(texts)  # committed text T per row: prefix + decode(lm_ids)
        self.lm_ids: list[list[int]] = [[] for _ in range(B)]
        self.stable = [0] * B  # boundary S per row (characters of T covered by the cache)
        self.cached = [0] * B  # RM tokens in the cache after the start token, if any (= len(rm(T[:S])))
        self._pending = None
        self._empty_rewards: dict[str, float] = {}
        self._byte_tokens: dict[int, bool] = {}
        rows = list(range(B))
        found = self._choose_boundaries(rows, {b: None for b in rows})
        heads = []
        for b in rows:
            self.stable[b], head = found[b]
            self.cached[b] = len(head)
            heads.append(head)
        ids, mask = self._left_padded(heads)
        self.cache = scorer.new_cache(ids, mask)

    # -- tokenizers ---------------------------------------------------------------------------------
    def _rm_encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.rm_tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _decode(self, sequences: list[list[int]]) -> list[str]:
        if not sequences:
            return []
        return self.lm_tokenizer.batch_decode(sequences, skip_special_tokens=True)

    def _left_padded(self, rows: list[list[int]]):
        start = self.model.config.start_ids  # [] for a model without a start token (the paper's)
        rows = [start + r for r in rows]
        width = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), width), self.rm_pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
        return ids, mask

    # -- candidate texts ----------------------------------------------------------------------------
    def _windows(self, rows: list[int]) -> tuple[list[list[int]], list[str]]:
        """A window of trailing LM ids per row, wide enough that its decoding starts on a clean character."""
        windows, bases = {}, {}
        todo = {b: self._byte_run_start(b, min(len(self.lm_ids[b]), self.window)) for b in rows}
        while todo:
            seqs = {b: self.lm_ids[b][len(self.lm_ids[b]) - w:] for b, w in todo.items()}
            decoded = dict(zip(seqs, self._decode(list(seqs.values()))))
            nxt = {}
            for b, w in todo.items():
                text = decoded[b].rstrip(REPLACEMENT)
                if w == len(self.lm_ids[b]) or (text and text[0] != REPLACEMENT):
                    windows[b], bases[b] = seqs[b], decoded[b]
                else:  # starts inside a multi-byte character (or is all partial bytes): widen
                    nxt[b] = self._byte_run_start(b, min(len(self.lm_ids[b]), 2 * w))
            todo = nxt
        return [windows[b] for b in rows], [bases[b] for b in rows]

    def _byte_run_start(self, b: int, width: int) -> int:
        """Widen a window of ``width`` trailing ids so it does not start inside a run of byte-fallback tokens.

        SentencePiece-style byte fallback (``<0xE2>``) decodes each run of byte tokens as a whole: one invalid
        byte turns the entire run into U+FFFD, so a window must hold the whole run to decode like the full text.
        """
        ids = self.lm_ids[b]
        start = len(ids) - width
        while 0 < start < len(ids) and self._is_byte(ids[start]) and self._is_byte(ids[start - 1]):
            start -= 1
        return len(ids) - start

    def _is_byte(self, token_id: int) -> bool:
        flag = self._byte_tokens.get(token_id)
        if flag is None:
            piece = self.lm_tokenizer.convert_ids_to_tokens(token_id)
            flag = self._byte_tokens[token_id] = bool(
                isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"))
        return flag

    def _extensions(self, rows: list[int], candidates: list[list[int]]) -> list[list[tuple[int, str]]]:
        """For each row and candidate: (characters of T replaced, text appended), from a windowed decode."""
        windows, bases = self._windows(rows)
        seqs = [w + [c] for w, cands in zip(windows, candidates) for c in cands]
        decoded = iter(self._decode(seqs))
        out = []
        for b, base, cands in zip(rows, bases, candidates):
            row = []
            for _ in cands:
                d = next(decoded)
                if d.startswith(base):
                    row.append((0, d[len(base):]))
                else:  # the candidate completes (or otherwise changes) trailing characters
                    p = len(os.path.commonprefix([base, d]))
                    row.append((len(base) - p, d[p:]))
            out.append(row)
        return out

    def _retreat(self, rows: list[int], extra: list[int] | None = None) -> None:
        """Drop rows' whole stable part from the cache (fallback when the committed prefix changed)."""
        counts = torch.zeros(len(self.texts), dtype=torch.long)
        for i, b in enumerate(rows):
            counts[b] = self.cached[b] + (extra[i] if extra else 0)
            self.stable[b], self.cached[b] = 0, 0
        if counts.any():
            self.cache.rollback(counts)

    # -- session API --------------------------------------------------------------------------------
    @property
    def ragged(self) -> bool:
        """Whether :meth:`score` scores each row only on the candidates ``active`` marks (the cache's
        ``scores_ragged``): their texts alone are decoded and re-tokenized, their blocks alone run."""
        return bool(getattr(self.cache, "scores_ragged", False))

    def score(self, candidates: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Rewards [B, k] of the candidates [B, k]; ``active`` [B, k]: the ones the caller reads, for a
        :attr:`ragged` session (the others score 0 and are not chosen; a row with none is read as its first)."""
        B, k = candidates.shape
        cands = candidates.tolist()
        rows = list(range(B))
        if active is not None and self.ragged:
            need = active.to("cpu").bool().clone()
            need[~need.any(-1), 0] = True
        else:
            active, need = None, torch.ones((B, k), dtype=torch.bool)
        wanted = [[j for j, flag in enumerate(row) if flag] for row in need.tolist()]  # the candidates to score
        got = self._extensions(rows, [[cands[b][j] for j in wanted[b]] for b in rows])
        ext = [dict(zip(wanted[b], got[b])) for b in rows]  # j -> (characters replaced, text appended)
        # a candidate that rewrites text before the stable boundary (never expected) forces a full re-encode
        bad = [b for b in rows if max(ext[b][j][0] for j in wanted[b]) > len(self.texts[b]) - self.stable[b]]
        if bad:
            self._retreat(bad)
        new_texts: list[list] = [[None] * k for _ in rows]
        spots, block_texts = [], []
        for b in rows:
            T, S = self.texts[b], self.stable[b]
            tail = T[S:]
            for j in wanted[b]:
                d, a = ext[b][j]
                new_texts[b][j] = T[: len(T) - d] + a
                spots.append((b, j))
                block_texts.append(tail[: len(tail) - d] + a)
        blocks: list[list] = [[[] for _ in range(k)] for _ in rows]  # RM tokens after the boundary, per candidate
        for (b, j), x in zip(spots, self._rm_encode(block_texts)):
            blocks[b][j] = x
        m = max(1, max(len(x) for row in blocks for x in row))
        ids = torch.full((B, k, m), self.rm_pad_id, dtype=torch.long)
        mask = torch.zeros((B, k, m), dtype=torch.bool)
        for b, j in spots:
            ids[b, j, :len(blocks[b][j])] = torch.tensor(blocks[b][j], dtype=torch.long)
            mask[b, j, :len(blocks[b][j])] = True
        # a cache of the two-argument ScoringCache contract is only handed `active` where it scores ragged
        rewards = (self.cache.score_blocks(ids, mask).float() if active is None
                   else self.cache.score_blocks(ids, mask, need).float().masked_fill(~need, 0.0))
        empty = [(b, j) for b, j in spots if not blocks[b][j]]
        if empty:  # nothing after the boundary: the reward of the cached prefix itself (only when T is "")
            textless = []
            for b, j in empty:
                text = new_texts[b][j]
                if text or self.model.config.start_token_id is not None:
                    rewards[b, j] = self._empty_reward(text)
                else:
                    textless.append((b, j))
            if textless:
                _neutral_rewards(rewards, textless, need)
        self._pending = {"candidates": cands, "texts": new_texts, "blocks": blocks, "scored": wanted}
        return rewards

    def _empty_reward(self, text: str) -> float:
        if text not in self._empty_rewards:
            self._empty_rewards[text] = float(self.model.score_texts([text])[0])
        return self._empty_rewards[text]

    def commit(self, tokens: torch.Tensor) -> None:
        toks = [int(t) for t in tokens.tolist()]
        pending, self._pending = self._pending, None
        B = len(toks)
        choice, kept, tails = [0] * B, [[] for _ in range(B)], {}
        forced, idle = [], []
        for b, t in enumerate(toks):
            if pending is not None:  # a token that was no scored candidate: the cache keeps the row's first scored
                choice[b] = pending["scored"][b][0]
                kept[b] = pending["blocks"][b][choice[b]]
            j = _scored_index(pending, b, t)
            if j is not None:
                choice[b], kept[b] = j, pending["blocks"][b][j]
                self.texts[b] = pending["texts"][b][j]
                self.lm_ids[b].append(t)
                tails[b] = kept[b]  # rm(T[S:]) is exactly the chosen block
            elif t == self.pad_token_id:
                idle.append(b)  # a finished row padded by the decoder: its text does not change
            else:
                forced.append(b)  # a token that was not a candidate (forced by the caller)
        if pending is not None:
            self.cache.commit_choice(torch.tensor(choice, dtype=torch.long))
        if forced:
            ext = self._extensions(forced, [[toks[b]] for b in forced])
            retreat = []
            for b, [(d, a)] in zip(forced, ext):
                T = self.texts[b]
                self.texts[b] = T[: len(T) - d] + a
                self.lm_ids[b].append(toks[b])
                tails[b] = None
                if d > len(T) - self.stable[b]:
                    retreat.append(b)
            if retreat:
                self._retreat(retreat, [len(kept[b]) for b in retreat])
                for b in retreat:
                    kept[b] = []
        for b in idle:
            tails[b] = None
        rows = [b for b in range(B) if b in tails]
        chosen = self._choose_boundaries(rows, tails) if rows else {}
        counts = torch.zeros(B, dtype=torch.long)
        appends = [[] for _ in range(B)]
        for b in range(B):
            target = chosen[b][1] if b in chosen else []
            n = _common_prefix(kept[b], target)
            counts[b] = len(kept[b]) - n
            appends[b] = target[n:]
            if b in chosen:
                self.stable[b] = chosen[b][0]
            self.cached[b] += len(target)
        if counts.any():
            self.cache.rollback(counts)
        width = max(len(a) for a in appends)
        if width:
            ids = torch.full((B, width), self.rm_pad_id, dtype=torch.long)
            mask = torch.zeros((B, width), dtype=torch.bool)
            for b, a in enumerate(appends):
                if a:
                    ids[b, : len(a)] = torch.tensor(a, dtype=torch.long)
                    mask[b, : len(a)] = True
            self.cache.append(ids, mask)


    # -- rows leaving and joining ---------------------------------------------------------------------
    @property
    def supports_row_changes(self) -> bool:
        return bool(getattr(self.cache, "supports_row_changes", False))

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` in that order (:meth:`RewardSession.keep_rows`): the per-row token state
        (texts, LM ids, stable boundaries) and the cache rows alike; a pending score is discarded."""
        rows = [int(i) for i in torch.as_tensor(index).tolist()]
        self._pending = None
        for name in self._ROW_STATE:
            values = getattr(self, name)
            setattr(self, name, [values[b] for b in rows])
        self.cache.keep_rows(torch.tensor(rows, dtype=torch.long))

    def add_rows(self, other: "BridgedSession") -> None:
        """Append the rows of a session that the same reward started (:meth:`RewardSession.add_rows`)."""
        if not isinstance(other, BridgedSession) or other.model is not self.model:
            raise TypeError("add_rows needs a BridgedSession started by the same reward")
        self._pending = other._pending = None
        for name in self._ROW_STATE:
            getattr(self, name).extend(getattr(other, name))
        self._empty_rewards.update(other._empty_rewards)
        self._byte_tokens.update(other._byte_tokens)
        self.cache.add_rows(other.cache)

    _ROW_STATE = ("prefixes", "texts", "lm_ids", "stable", "cached")


def _neutral_rewards(rewards: torch.Tensor, textless: list[tuple[int, int]], scored: torch.Tensor) -> None:
    """Rewards for candidates that leave the text empty, under a reward model without a start token.

    Such a model reads nothing for an empty text, so it has no reward (``score_texts`` refuses one). It can only
    happen at a step whose committed text is empty (continuation-only scoring, first step) and for a candidate
    that decodes to no text (an end-of-text or other special token). Rather than stop decoding, each such
    candidate gets the mean reward of its row's other scored candidates (``scored`` [B, k]; 0.5 when there are
    none), so the reward neither favours nor penalises it against them. ``rewards`` [B, k] (``textless``: its
    (row, candidate) pairs) is updated in place.
    """
    missing = set(textless)
    for b, j in textless:
        others = [i for i in range(rewards.shape[1]) if scored[b, i] and (b, i) not in missing]
        rewards[b, j] = rewards[b, others].mean() if others else 0.5


def _scored_index(pending: dict | None, b: int, token: int) -> int | None:
    """Where ``token`` is among row ``b``'s scored candidates of ``pending`` (a :meth:`BridgedSession.score`)."""
    scored = [] if pending is None else pending["scored"][b]
    return next((j for j in scored if pending["candidates"][b][j] == token), None)


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

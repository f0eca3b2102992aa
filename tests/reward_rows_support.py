"""Rows joining and leaving a live reward session, driven at random and checked against scoring from scratch: what
tests/unit/test_reward_rows.py and tests/unit/test_static_scoring.py both drive their sessions with."""

from __future__ import annotations

import torch

PROMPTS = ["The quick brown fox jumps", "", "You are", "Café déjà vu: naïve 🙂 résumé", "I hate it",
           "Numbers 0123 and"]
TOL = 1e-5


def same_tokenizer_reference(rm, lm_tok):
    def reference(prefix: str, ids: list[int], candidates: list[int]) -> list[float]:
        head = [rm.config.start_token_id] + lm_tok(prefix, add_special_tokens=False)["input_ids"] + ids
        batch = torch.tensor([head + [c] for c in candidates])
        with torch.no_grad():
            return rm(batch).rewards[:, -1].tolist()
    return reference


def text_reference(rm, lm_tok):
    def reference(prefix: str, ids: list[int], candidates: list[int]) -> list[float]:
        return rm.score_texts([prefix + lm_tok.decode(ids + [c], skip_special_tokens=True) for c in candidates])
    return reference


def drive(reward, lm_tok, reference, *, steps=14, k=5, seed=0, max_rows=4, tol=TOL, by_index=False):
    """Random joins (newcomers started alone, some advanced a few tokens before joining) and leaves (random
    subsets in a random order) between steps; every step compares all rows with ``reference``. Returns the
    number of joins and leaves that happened. ``by_index``: each step's choice is committed as the engine commits
    it, by its index among the candidates (``session.commit_chosen``)."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(lm_tok)

    def rand(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=g))

    def step(session, rows, check: bool):
        cands = torch.randint(3, vocab, (len(rows), k), generator=g)
        got = session.score(cands)
        assert got.shape == (len(rows), k)
        if check:
            for b, row in enumerate(rows):
                want = torch.tensor(reference(row["prefix"], row["ids"], cands[b].tolist()))
                diff = (got[b] - want).abs().max().item()
                assert diff <= tol, f"row {row['prefix']!r} after {len(row['ids'])} tokens differs by {diff:.2e}"
        index = torch.randint(0, k, (len(rows),), generator=g)
        chosen = cands[torch.arange(len(rows)), index]
        if by_index:
            session.commit_chosen(chosen, index)
        else:
            session.commit(chosen)
        for row, token in zip(rows, chosen.tolist()):
            row["ids"].append(token)

    session, rows, joins, leaves = None, [], 0, 0
    for t in range(steps):
        if rows and (rand(3) == 0 or len(rows) == max_rows):  # some rows leave, the rest are reordered
            keep = torch.randperm(len(rows), generator=g)[: rand(len(rows))]
            if len(keep):
                session.keep_rows(keep)
                rows = [rows[i] for i in keep.tolist()]
            else:
                session, rows = None, []
            leaves += 1
        if len(rows) < max_rows and (not rows or rand(2) == 0):
            n = 1 + rand(min(2, max_rows - len(rows)))
            new_rows = [{"prefix": PROMPTS[rand(len(PROMPTS))], "ids": []} for _ in range(n)]
            other = reward.start([r["prefix"] for r in new_rows], lm_tok)
            for _ in range(rand(3)):  # a newcomer may have committed tokens of its own before joining
                step(other, new_rows, check=False)
            if session is None:
                session = other
            else:
                session.add_rows(other)
            rows += new_rows
            joins += 1
        step(session, rows, check=True)
    return joins, leaves

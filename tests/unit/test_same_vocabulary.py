"""``rewards.vocab.same_vocabulary``: the answer for a pair of live tokenizers is remembered (comparing two
49k-token vocabularies costs ~80 ms per ``generate`` call otherwise), and a tokenizer that changes size is
compared again."""

from __future__ import annotations

from steerkit.rewards.vocab import same_vocabulary
from steerkit.testing import make_tokenizer


class Counting:
    """A tokenizer stand-in that counts ``get_vocab`` calls."""

    def __init__(self, vocab: dict):
        self.vocab, self.calls = dict(vocab), 0

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict:
        self.calls += 1
        return dict(self.vocab)


def test_the_answer_is_remembered_while_both_tokenizers_live():
    vocab = make_tokenizer().get_vocab()
    a, b = Counting(vocab), Counting(vocab)
    assert same_vocabulary(a, b) and same_vocabulary(a, b) and same_vocabulary(a, b)
    assert a.calls == 1 and b.calls == 1


def test_a_different_vocabulary_and_a_grown_one_are_told_apart():
    vocab = make_tokenizer().get_vocab()
    a, b = Counting(vocab), Counting({**vocab, "extra": 10**6})
    assert not same_vocabulary(a, b)  # different sizes: no comparison needed
    c = Counting({k: (v + 1 if k == next(iter(vocab)) else v) for k, v in vocab.items()})
    assert not same_vocabulary(a, c) and not same_vocabulary(a, c)
    d = Counting(vocab)
    assert same_vocabulary(a, d)
    d.vocab["grown"] = 10**6  # a tokenizer that gains a token is compared again (its length changed)
    assert not same_vocabulary(a, d)


def test_a_new_tokenizer_at_a_reused_address_is_not_mistaken_for_the_old_one():
    vocab = make_tokenizer().get_vocab()
    a = Counting(vocab)
    assert same_vocabulary(a, Counting(vocab))  # the other one dies at once; its id may be reused
    other = {k: v for k, v in vocab.items()}
    first = next(iter(other))
    other[first] = other[first] + len(other)
    assert not same_vocabulary(a, Counting(other))

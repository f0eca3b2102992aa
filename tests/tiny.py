"""The tiny models of the test suite live in :mod:`steerkit.testing` (also used by the docstring examples)."""

from steerkit.testing import (  # noqa: F401
    CORPUS, labelled_review, make_tokenizer, save_tiny_lm, tiny_lm, tiny_reward, tiny_token_reward,
    write_distribution,
)

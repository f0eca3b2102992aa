"""The tiny models of the test suite live in :mod:`steerkit.testing` (also used by the docstring examples)."""

from steerkit.testing import CORPUS, make_tokenizer, tiny_lm, tiny_reward  # noqa: F401

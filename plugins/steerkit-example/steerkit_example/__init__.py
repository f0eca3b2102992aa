"""steerkit-example: a lexicon reward and scorer, registered through the ``steerkit`` entry-point group.

This is the package walked through in ``docs/plugins.md``. It implements the reward contract honestly:
the reward of each candidate is the reward of the row's text extended by that candidate, where the text
is ``prefix + decode(generated ids + candidate)``; a candidate token is never decoded on its own.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor is made: every `steerkit` command (--help too) imports plugins
    import torch

try:  # first: the steerkit Python imports must be steerkit-rad's (PyPI's 'steerkit' is another project)
    from steerkit.provenance import check_distribution
except ImportError as exc:  # the unrelated project's 'steerkit' package (or a mix of both), or none at all
    raise ImportError(f"steerkit-example needs steerkit-rad, which is not what `import steerkit` finds ({exc}): "
                      "pip uninstall steerkit, then pip install --force-reinstall --no-deps steerkit-rad") from exc
check_distribution(needed_by="steerkit-example")  # ForeignDistributionError if another distribution shares it

from steerkit import hookimpl

__version__ = "0.1.0"

POSITIVE_WORDS = frozenset(
    "good great love lovely wonderful happy glad nice beautiful excellent amazing fantastic kind "
    "friend friends enjoy enjoyed best brilliant delightful superb fun thanks thank".split()
)
_WORD = re.compile(r"[^\W\d_]+")


def count_words(text: str, words=POSITIVE_WORDS) -> int:
    """Whole words of ``text`` (case-insensitive) that are in the lexicon."""
    return sum(1 for w in _WORD.findall(text.lower()) if w in words)


def lexicon_reward(text: str, words=POSITIVE_WORDS) -> float:
    """ρ = 1 − 0.5ⁿ for n lexicon words: 0 for none, 0.5 for one, saturating towards 1."""
    return 1.0 - 0.5 ** count_words(text, words)


class LexiconReward:
    """A :class:`steerkit.rewards.base.Reward`: ``start`` returns a session over B rows."""

    def __init__(self, name: str = "positive-words", words=POSITIVE_WORDS, context: str = "continuation"):
        if context not in ("continuation", "full"):
            raise ValueError(f"context must be 'continuation' or 'full', got {context!r}")
        self.name = name
        self.words = frozenset(words)
        self.context = context

    def start(self, prefixes: list[str], lm_tokenizer) -> "LexiconSession":
        texts = list(prefixes) if self.context == "full" else [""] * len(prefixes)
        return LexiconSession(self, texts, lm_tokenizer)


class LexiconSession:
    """A :class:`steerkit.rewards.base.RewardSession`: ``score`` k candidates per row, then ``commit`` one."""

    def __init__(self, reward: LexiconReward, texts: list[str], lm_tokenizer):
        self.reward = reward
        self.prefixes = texts
        self.tokenizer = lm_tokenizer
        self.generated: list[list[int]] = [[] for _ in texts]  # LM ids committed so far, per row

    def score(self, candidates: torch.Tensor) -> torch.Tensor:
        """[B, k] LM token ids -> [B, k] rewards of each row's text extended by each candidate."""
        import torch

        rows = candidates.tolist()
        sequences = [self.generated[b] + [c] for b, row in enumerate(rows) for c in row]
        texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=True)
        k = candidates.shape[1]
        rewards = [lexicon_reward(self.prefixes[i // k] + t, self.reward.words) for i, t in enumerate(texts)]
        return torch.tensor(rewards, dtype=torch.float32, device=candidates.device).view(-1, k)

    def commit(self, tokens: torch.Tensor) -> None:
        """Append the chosen token of each row (finished rows get the pad token, which decodes to nothing)."""
        for row, token in zip(self.generated, tokens.tolist()):
            row.append(token)


class LexiconScorer:
    """An evaluation scorer (``steerkit eval``): the same measure for finished texts."""

    name = "positive-words"
    measures = "sentiment"
    description = "share of positive lexicon words, 1 - 0.5^n (a toy; use VADER or a classifier for real work)"
    threshold = 0.5

    def __init__(self, words=POSITIVE_WORDS):
        self.words = frozenset(words)

    def score(self, texts: list[str]) -> list[float]:
        return [lexicon_reward(t, self.words) for t in texts]


def make_reward(context: str = "continuation") -> LexiconReward:
    """Reward factory: steerkit calls it with the keyword arguments it declares (here ``context``)."""
    return LexiconReward(context=context)


@hookimpl
def register_reward_models(register):
    register("positive-words", make_reward, description="ρ = 1 − 0.5^n for n positive words (example plugin)")


@hookimpl
def register_scorers(register):
    register("positive-words", LexiconScorer, description="sentiment: positive-word lexicon (example plugin)")


@hookimpl
def register_commands(cli):
    @cli.command("positive-words")
    def positive_words_command(texts: list[str]):
        """Count the example lexicon's positive words in each text, and print ρ."""
        for text in texts:
            print(f"{lexicon_reward(text):.4f}\t{count_words(text)}\t{text}")

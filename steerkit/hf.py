"""RAD as a transformers ``LogitsProcessor``, for ``model.generate(..., logits_processor=[...])``.

State is keyed by the prefix, not by a hidden step counter: each call checks that ``input_ids`` extends
the previous call's rows by one token; otherwise a new generation has begun and the reward sessions are
restarted. One processor can therefore be reused across any number of ``generate`` calls.

Use it with ``do_sample=True, top_k=0`` (or ``do_sample=False``): the processor does its own top-k and
transformers' temperature is then applied to the reweighted scores, exactly as in :func:`steerkit.generate`.
The returned scores have each row's maximum subtracted (softmax and argmax are shift-invariant), so that
transformers computes ``(scores − max) / T`` like :func:`steerkit.generate` does: a tiny temperature then acts
like greedy decoding instead of producing ``inf − inf = NaN``.

k and β are validated as in :func:`steerkit.generate` (:mod:`steerkit.steering`); a reward returning NaN or
±inf raises :class:`~steerkit.errors.NonFiniteRewardError` naming the reward and the step.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import LogitsProcessor

from .steering import SteeringTerm, check_terms, reweight, warn_if_slow
from .validators import validate_k


class RewardAugmentedLogitsProcessor(LogitsProcessor):
    r"""RAD as a transformers [`LogitsProcessor`]: keeps the top-k logits and adds Σ β·ρ of every reward.

    At each call the `k` largest logits of every row are reweighted with the rewards of those k candidate
    tokens, scored by each term's reward over a cache of the row's text so far; every other token gets
    `-inf`. The processor's state is keyed by the prefix, so one instance serves any number of
    `model.generate` calls.

    Args:
        tokenizer ([`PreTrainedTokenizerBase`]):
            The LM's tokenizer: it decodes prompts for the rewards, and its vocabulary bounds `k`.
        terms (`Sequence[SteeringTerm]`):
            The rewards and their signed weights β; term names must be distinct.
        k (`int`, *optional*, defaults to 20):
            Candidates reweighted per step, in `[1, len(tokenizer)]`.

    Call args:
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`): the ids so far.
        scores (`torch.FloatTensor` of shape `(batch_size, vocab_size)`): the LM's next-token logits.

    Returns:
        `torch.FloatTensor` of shape `(batch_size, vocab_size)`: the reweighted top-k scores minus each row's
        maximum (a shift that changes no probability), `-inf` elsewhere. The last step's [`StepResult`] (top-k
        ids, logits, rewards `[batch_size, k]` per term) is kept in `last_step`.

    Examples:

    ```python
    >>> import torch
    >>> from steerkit import RewardAugmentedLogitsProcessor, SteeringTerm
    >>> from steerkit.rewards.sequence.scorer import RewardModelScorer
    >>> from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward
    >>> tokenizer = make_tokenizer()
    >>> model, reward = tiny_lm(tokenizer), RewardModelScorer(tiny_reward(tokenizer))
    >>> rad = RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(reward, -5.0)], k=4)
    >>> enc = tokenizer(["The movie was"], return_tensors="pt")
    >>> _ = torch.manual_seed(0)
    >>> ids = model.generate(**enc, logits_processor=[rad], do_sample=True, top_k=0, max_new_tokens=3,
    ...                      pad_token_id=tokenizer.pad_token_id)
    >>> ids.shape[1] - enc["input_ids"].shape[1]
    3
    >>> rad.last_step.rewards["tiny"].shape  # rewards of the k candidates of the last step
    torch.Size([1, 4])
    >>> bool(torch.isin(ids[0, -1], rad.last_step.topk_ids[0]))  # the chosen token is one of the top k
    True

    ```
    """

    def __init__(self, tokenizer, terms: Sequence[SteeringTerm], k: int = 20):
        self.tokenizer = tokenizer
        self.terms = check_terms(list(terms))
        self.k = validate_k(k, len(tokenizer))
        warn_if_slow(self.k, self.terms)
        self._sessions = None
        self._last_ids: torch.Tensor | None = None
        self._prompt_length = 0
        self.last_step = None  # the StepResult of the latest call, for inspection

    def _continues(self, input_ids: torch.Tensor) -> bool:
        last = self._last_ids
        return (last is not None and self._sessions is not None and input_ids.shape[0] == last.shape[0]
                and input_ids.shape[1] == last.shape[1] + 1 and torch.equal(input_ids[:, :-1], last))

    def _start(self, input_ids: torch.Tensor) -> None:
        pad = self.tokenizer.pad_token_id
        prompts = []
        for row in input_ids.tolist():
            while row and row[0] == pad:  # strip left padding
                row = row[1:]
            prompts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        self._sessions = [t.reward.start(prompts, self.tokenizer) for t in self.terms]
        self._prompt_length = input_ids.shape[1]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._continues(input_ids):
            for s in self._sessions:
                s.commit(input_ids[:, -1])
        else:
            self._start(input_ids)
        self._last_ids = input_ids.clone()
        step = input_ids.shape[1] - self._prompt_length
        self.last_step = reweight(scores, self.k, self.terms, self._sessions, step)
        return self.last_step.scores.to(scores.dtype)  # row max 0 (see reweight): safe for any temperature

"""Token-level reward models (``kind: token``) on llama.cpp: the backbone in llama.cpp, the token head in torch.

:class:`LlamaCppTokenModel` has the attributes :class:`~steerkit.rewards.token.session.TokenReward` reads
(``config``, ``tokenizer``, ``encode``, ``output_embeddings``, ``vocab_rows``, ``textless_ids``, ``output``,
``score_texts``) and names its session class (``session_class``): :class:`LlamaCppTokenSession` keeps each row's
committed text in a llama.cpp sequence instead of KV tensors. A step is one ``llama_decode`` of one token per row
(the committed one) plus the head's query and baseline of its hidden state; the k candidates' rewards are the same
gather and dot products as in torch (:func:`~steerkit.rewards.token.model.candidate_logits`).
"""

from __future__ import annotations

import weakref

import torch

from ..model import score_from_scratch
from ..token.model import TokenRewardModel, TokenVocabulary, candidate_logits, realized_logits
from ..token.session import TokenSession
from .model import _LlamaCppModelBase


class LlamaCppTokenModel(TokenVocabulary, _LlamaCppModelBase):
    """A token-level reward model whose backbone runs in llama.cpp."""

    kind = "token"

    def __init__(self, torch_model: TokenRewardModel, reward_hash: str, precision: str | None = None,
                 threads: int | None = None):
        super().__init__(torch_model, reward_hash, precision, threads)
        self.head = torch_model.head
        self.output_embeddings = torch_model.output_embeddings.detach().float().cpu()

    @classmethod
    def _torch_class(cls):
        return TokenRewardModel

    @property
    def session_class(self):
        return LlamaCppTokenSession


    def output(self, logits: torch.Tensor) -> torch.Tensor:
        return self.torch_model.output(logits)

    @torch.no_grad()
    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's (query, offset) of hidden states [..., d]."""
        return self.head(hidden)

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32, per_prefix: bool = False):
        """Reward of each text (from scratch), and with ``per_prefix`` of every prefix."""
        def rewards(ids, _positions, _mask4d, mask):
            query, offset = self.project(self.hidden_of_texts(ids, mask))
            return self.output(realized_logits(query, offset, self.output_embeddings, ids, mask.long(),
                                               self.textless_ids))

        return score_from_scratch(self.encode, texts, batch_size, per_prefix, rewards, config=self.config)


class LlamaCppTokenSession(TokenSession):
    """:class:`TokenSession` with each row's committed text in a llama.cpp sequence (``seqs[b]``)."""

    def __init__(self, reward, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.reward = reward
        self.model = reward.model
        self.runtime = self.model.runtime
        B = input_ids.shape[0]
        seqs = self.runtime.take_or_raise(B, "the reward model's rows", "decode fewer rows at once")
        self.seqs: list[int] = seqs  # changed in place only: the finalizer releases what it holds
        weakref.finalize(self, self.runtime.release, self.seqs)
        self.next_pos = torch.zeros(B, dtype=torch.long)
        self.query = self.offset = self.current = None
        self.textless = self.model.textless_ids
        self._append(input_ids, attention_mask)

    @property
    def device(self):
        return torch.device("cpu")

    def _append(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> None:
        tokens = tokens.cpu()
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.cpu().bool()
        start = self.query is None  # the prefill reads every position (realized_logits); a step only the last
        ids, positions, owners, outputs = [], [], [], []
        last = mask.shape[1] - 1
        for b in range(tokens.shape[0]):
            cols = mask[b].nonzero().flatten().tolist()
            p = int(self.next_pos[b])
            for i, c in enumerate(cols):
                ids.append(int(tokens[b, c]))
                positions.append(p + i)
                owners.append(self.seqs[b])
                outputs.append(start or c == last)
        hidden = torch.from_numpy(self.runtime.decode(self.model.embed(ids), positions, owners, outputs)) if ids \
            else torch.zeros((0, self.model.geometry["hidden"]))
        query, offset = self.model.project(hidden)
        embeddings, textless = self.model.output_embeddings, self.textless
        B, n = tokens.shape
        if start:
            q = torch.zeros((B, n, query.shape[-1]))
            o = torch.zeros((B, n))
            q[mask], o[mask] = query, offset
            self.current = realized_logits(q, o, embeddings, tokens, mask, textless)[:, -1]
            q_last, o_last = q[:, -1], o[:, -1]
        else:  # one committed token per row, scored as it was as a candidate
            self.current = candidate_logits(self.query, self.offset, embeddings, tokens, self.current, textless)[:, 0]
            q_last, o_last = query, offset
        self.query, self.offset = q_last, o_last
        self.next_pos = self.next_pos + mask.long().sum(-1)

    def keep_rows(self, index: torch.Tensor) -> None:
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        kept = set(index.tolist())
        self.runtime.drop([s for b, s in enumerate(self.seqs) if b not in kept])
        self.seqs[:] = [self.seqs[i] for i in index.tolist()]
        self.next_pos = self.next_pos.index_select(0, index)
        self.query, self.offset = self.query.index_select(0, index), self.offset.index_select(0, index)
        self.current = self.current.index_select(0, index)

    def add_rows(self, other: "LlamaCppTokenSession") -> None:
        if not isinstance(other, LlamaCppTokenSession) or other.runtime is not self.runtime:
            raise TypeError("add_rows() needs a session started by the same llama.cpp token-level reward, got "
                            f"{type(other).__name__}.")
        self.seqs.extend(other.seqs)
        other.seqs.clear()
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.query = torch.cat([self.query, other.query])
        self.offset = torch.cat([self.offset, other.offset])
        self.current = torch.cat([self.current, other.current])

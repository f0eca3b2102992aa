"""A token-level reward model as a decoding-time reward: one reward-model token per row and step, any k.

:class:`TokenReward` implements the :class:`~steerkit.rewards.base.Reward` contract (``kind = "token"``, so
:attr:`steerkit.steering.SteeringTerm.is_sequence_reward` is False and large k raises no warning). Its
:class:`TokenSession` keeps the reward model's KV of the committed text and the head's query and baseline of
the last position. ``score`` is then a gather of the k candidates' output embeddings and k dot products (one
``[B, V]`` product for a large k); ``commit`` runs the chosen token through the reward model, one position per
row. The session runs any model with the runner interface (``run``, ``empty_past``, ``output_embeddings``,
``output``, ``encode``): :class:`~steerkit.rewards.token.model.TokenRewardModel` (torch) and
:class:`~steerkit.rewards.onnx.token.OnnxTokenModel` (onnxruntime).

A token-level reward reads the LM's token ids directly, so it needs the LM's vocabulary:
:func:`check_vocabulary` raises :class:`~steerkit.errors.VocabularyMismatchError` for another tokenizer family
(a sequence reward model re-tokenizes candidate text and works with any LM).
"""

from __future__ import annotations

import torch

from ...errors import InvalidArgumentError
from ...compiling import CompiledStep, bucket
from ...model_copies import converted_copy
from ..attention import additive, append_mask_4d
from ..backends import DEFAULT_BACKEND, resolve_backend
from ..builtin_backends import torch_backend
from ..cache import left_pad_kv
from .lm_state import start_lm_state
from .model import candidate_logits, check_vocabulary, realized_logits  # noqa: F401  (check_vocabulary: re-exported)
from ..static_kv import MIN_COLUMNS, StaticKV


class TokenReward:
    """A token-level reward: ``start`` returns a :class:`TokenSession` over B rows.

    ``context="continuation"`` scores only the generated text (the reward model starts from its start token);
    ``"full"`` scores prompt + generated text.
    """

    kind = "token"

    def __init__(self, model, name: str | None = None, *, backend: str = DEFAULT_BACKEND,
                 context: str = "continuation"):
        self.name = name or model.config.name
        self.backend = resolve_backend(backend)
        runner = torch_backend(self.backend)
        # a torch backend of reduced precision runs its converted copy of an in-memory float32 model (loading through
        # it converts already): the eager and the static sessions run the same weights
        self.model = model if runner is None else runner.runs(model)
        self.context = context

    #: Keep the KV on preallocated tensors (:class:`StaticTokenSession`): ``"compiled"``, with the commit compiled,
    #: on the copy that ``assemble(compile=True)`` makes (:meth:`compiled_form`); ``"eager"``, the same layout run
    #: eagerly; None: :class:`TokenSession`'s growing tensors.
    static: str | None = None

    def compiled_form(self, *, compiled: bool | None = None) -> "TokenReward":
        """This reward as ``compile=True`` runs it (:func:`~steerkit.rewards.static_kv.static_form`): a torch model
        on the static session, its commit compiled (on a CPU too: one row's step 23.7 against 27.8 ms with
        SmolLM2, docs/performance.md); otherwise this reward itself."""
        from ..static_kv import static_form

        return static_form(self, compiled, pays_on_cpu=True)

    @property
    def reads_lm_state(self) -> bool:
        """True for a head on the LM's own final hidden state (``token_head.lm_state``): its sessions score from the
        state the engine hands them (:mod:`steerkit.rewards.token.lm_state`)."""
        return bool(getattr(self.model.config, "reads_lm_state", False))

    def start(self, prefixes: list[str], lm_tokenizer, lm=None) -> "TokenSession":
        """A session over ``len(prefixes)`` rows. ``lm``: the language model whose state the engine hands to a
        reward that reads it (:attr:`reads_lm_state`; without it such a reward raises
        :class:`~steerkit.errors.LMStateUnavailableError`)."""
        if self.reads_lm_state:
            return start_lm_state(self, prefixes, lm_tokenizer, lm)
        check_vocabulary(self.name, self.model, lm_tokenizer)
        texts = prefixes if self.context == "full" else [""] * len(prefixes)
        enc = self.model.encode(texts)
        if self.static:
            return StaticTokenSession(self, enc["input_ids"], enc["attention_mask"],
                                      compiled=self.static == "compiled")
        # a backend whose KV lives outside torch (llama.cpp) names its own session class on its model
        session_class = getattr(self.model, "session_class", None) or TokenSession
        return session_class(self, enc["input_ids"], enc["attention_mask"])

    def __repr__(self) -> str:
        return f"TokenReward({self.name!r}, backend={self.backend!r}, context={self.context!r})"


class TokenSession:
    """The reward model's state over B rows: KV of the committed text (flat list of 2·L tensors [B, H, T, d]),
    the mask of real cached columns [B, T], each row's next position [B], the head's query [B, d] and
    baseline [B] after the last committed token, and the logit [B] of the committed text itself (what a
    candidate that adds no text, such as the end-of-text token, is scored)."""

    def __init__(self, reward: TokenReward, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.reward = reward
        self.model = reward.model
        device = self.model.device
        B = input_ids.shape[0]
        self.past = self.model.empty_past(B)
        self.mask = torch.zeros((B, 0), dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(B, dtype=torch.long, device=device)
        self.query = self.offset = self.current = None
        textless = self.model.textless_ids  # moved to the model's device once, not every step
        self.textless = None if textless is None else textless.to(device)
        self._append(input_ids, attention_mask)

    @property
    def device(self):
        return self.model.device

    def _append(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> None:
        tokens = tokens.to(self.device)
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.to(self.device).bool()
        positions = self.next_pos[:, None] + (mask.long().cumsum(-1) - 1).clamp(min=0)
        query, offset = self._run(tokens, positions, append_mask_4d(self.mask, mask))
        embeddings, textless = self.model.output_embeddings, self.textless
        if self.query is None:  # the start: the reward of each row's text, from its realized last token
            self.current = realized_logits(query, offset, embeddings, tokens, mask, textless)[:, -1]
        else:  # one committed token per row, scored as it was as a candidate
            self.current = candidate_logits(self.query, self.offset, embeddings, tokens, self.current, textless)[:, 0]
        self.query, self.offset = query[:, -1], offset[:, -1]  # the last column is real in every row
        self.mask = torch.cat([self.mask, mask], dim=1)
        self.next_pos = self.next_pos + mask.long().sum(-1)

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor):
        """The reward model over ``tokens`` [B, n] at ``positions`` after the cached text (``allowed`` [B, 1, n,
        T + n]: what each token sees), their KV kept: (query [B, n, d], offset [B, n])."""
        query, offset, self.past = self.model.run(tokens, positions, additive(allowed), self.past)
        return query, offset

    def _keep_past(self, index: torch.Tensor, first: int) -> None:
        """Keep rows ``index`` of the cached KV, and its columns from ``first`` on."""
        self.past = [t.index_select(0, index)[:, :, first:] for t in self.past]

    def _join_past(self, other: "TokenSession", pad_self: int, pad_other: int) -> None:
        """The cached KV of this session's rows then ``other``'s, each left-padded by so many (masked) columns."""
        self.past = [torch.cat([left_pad_kv(x, pad_self), left_pad_kv(y.to(x.device), pad_other)])
                     for x, y in zip(self.past, other.past)]

    def score(self, candidates: torch.Tensor) -> torch.Tensor:
        """Rewards [B, k] of each row's text extended by each candidate LM token [B, k]."""
        device = candidates.device
        candidates = candidates.to(self.device).long()
        rows = self.model.vocab_rows
        if candidates.numel() and int(candidates.max()) >= rows:
            raise InvalidArgumentError(
                f"Reward {self.reward.name!r} got candidate token id {int(candidates.max())}, but its output "
                f"embeddings have {rows} rows: the language model's vocabulary is larger than the reward model's. "
                "Use a sequence reward model for this LM.")
        logits = candidate_logits(self.query, self.offset, self.model.output_embeddings, candidates, self.current,
                                  self.textless)
        return self.model.output(logits).to(device)

    def commit(self, tokens: torch.Tensor) -> None:
        """Append the chosen LM token of each row [B]: one reward-model position per row."""
        self._append(tokens[:, None], None)

    # -- continuous batching (RewardSession.keep_rows / add_rows) ---------------------------------------
    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order; columns that are then holes in every row are dropped."""
        index = torch.as_tensor(index, dtype=torch.long).to(self.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(0)
        first = int(used.nonzero().min()) if bool(used.any()) else mask.shape[1]
        self._keep_past(index, first)
        self.mask, self.next_pos = mask[:, first:], self.next_pos.index_select(0, index)
        self.query, self.offset = self.query.index_select(0, index), self.offset.index_select(0, index)
        self.current = self.current.index_select(0, index)

    def add_rows(self, other: "TokenSession") -> None:
        """Append the rows of ``other`` (started by the same reward), left-padding the shorter KV with holes."""
        if not isinstance(other, TokenSession) or other.model is not self.model:
            raise TypeError("add_rows() needs a TokenSession started by the same token-level reward, got "
                            f"{type(other).__name__}.")
        width = max(self.mask.shape[1], other.mask.shape[1])
        a, b = self.mask.shape[1], other.mask.shape[1]
        self._join_past(other, width - a, width - b)
        self.mask = torch.cat([torch.nn.functional.pad(self.mask, (width - a, 0)),
                               torch.nn.functional.pad(other.mask.to(self.device), (width - b, 0))])
        self.next_pos = torch.cat([self.next_pos, other.next_pos.to(self.device)])
        self.query = torch.cat([self.query, other.query.to(self.device)])
        self.offset = torch.cat([self.offset, other.offset.to(self.device)])
        self.current = torch.cat([self.current, other.current.to(self.device)])


# -- the static session (compile=True) ---------------------------------------------------------------------------
#
# A token-level reward's session on preallocated tensors, its commit compiled once per shape (``compile=True``, issue
# 25): the token-level side of the engine's static-shape step.
#
# :class:`TokenSession` keeps the reward model's KV as a list of tensors that grows
# by ``torch.cat`` at every commit, and runs the commit's forward (one token per row) eagerly.
# :class:`StaticTokenSession` keeps the same state (mask, positions, the head's query and baseline) with the KV in a
# :class:`~steerkit.rewards.static_kv.StaticKV`: ``slots`` rows (a power of two) × ``width`` columns (a power of two,
# at least :data:`~steerkit.rewards.static_kv.MIN_COLUMNS`), the cached column ``j`` of :attr:`mask` in column
# ``j``. A commit writes its token at column ``T`` in place, through the compiled forward (one graph per (slots,
# width)); the start, whose length varies, runs eagerly on the same tensors. Scoring candidates is unchanged: a gather
# and k dot products against the last query.

def _projection_of(model):
    """The token model's projection as the compiled function: (query, offset) alone."""
    def project(**kwargs):
        query, offset, _ = model.project(**kwargs)
        return query, offset
    return project


def compiled_commit(model):
    """The token model's compiled commit (one token per row), made once per model object and process."""
    return converted_copy(model, "compiled token commit",
                          lambda m: CompiledStep(m, _projection_of(m), what="a token reward's commit"))


class StaticTokenSession(TokenSession):
    """:class:`TokenSession` with the KV in a :class:`~steerkit.rewards.static_kv.StaticKV` (:attr:`kv`) and the
    commit compiled (``compiled=False``: the same layout, run eagerly)."""

    def __init__(self, reward, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, compiled: bool = True):
        self.kv = StaticKV(reward.model)
        self.compiled = compiled_commit(reward.model) if compiled else None
        super().__init__(reward, input_ids, attention_mask)
        self.past = None  # the KV is in self.kv

    @property
    def static(self):
        """The transformers ``StaticCache`` holding the KV."""
        return self.kv.static

    def _room(self, rows: int, columns: int) -> None:
        """Make the layout hold ``rows`` rows and ``columns`` columns, keeping the cached ones."""
        kv = self.kv
        if kv.static is None or kv.slots < rows or kv.width < columns:
            kv.resize(bucket(rows), max(kv.width, bucket(columns, MIN_COLUMNS)), *self.mask.shape)

    @torch.no_grad()
    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor):
        B, n = tokens.shape
        T = self.mask.shape[1]
        self._room(B, T + n)
        kwargs = self.kv.inputs(tokens, positions, allowed, T, T, n)
        if n == 1 and self.compiled is not None:
            query, offset = self.compiled((f"{self.kv.slots} row(s)", f"{self.kv.width} tokens"), kwargs)
        else:
            query, offset, _ = self.model.project(**kwargs)
        return query[:B], offset[:B]

    def _keep_past(self, index: torch.Tensor, first: int) -> None:
        T = self.mask.shape[1]
        self.kv.take(index, first, T, bucket(T - first + 1, MIN_COLUMNS))

    def _join_past(self, other: "TokenSession", pad_self: int, pad_other: int) -> None:
        if not isinstance(other, StaticTokenSession):
            raise TypeError(f"cannot add the rows of a {type(other).__name__} to a StaticTokenSession")
        (a, t), (b, u) = self.mask.shape, other.mask.shape
        width = max(self.kv.width, bucket(t + pad_self + 1, MIN_COLUMNS))
        self.kv.join(a, t, pad_self, other.kv, b, u, pad_other, width)


# -- loading (the ``token`` kind of :mod:`steerkit.rewards.kinds`) ------------------------------------------
def load_token_model(directory, backend: str = DEFAULT_BACKEND, *, cached: bool = False):
    """The model of a token-level reward-model directory (or of a backend's export of it), loaded by the backend's
    ``load_token`` (:mod:`steerkit.rewards.backends`). ``cached``: once per process, directory and backend (what
    packaged rewards use)."""
    from ..kinds import get_kind

    return get_kind("token").load_model(directory, backend, cached=cached)


def load_token_reward(directory, *, backend: str = DEFAULT_BACKEND, context: str = "continuation",
                      name: str | None = None, cached: bool = False) -> TokenReward:
    from ..kinds import get_kind

    return get_kind("token").load_reward(directory, backend=backend, context=context, name=name, cached=cached)

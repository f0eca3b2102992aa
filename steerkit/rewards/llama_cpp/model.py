"""Sequence reward models on llama.cpp: :class:`LlamaCppRewardModel` and its :class:`LlamaCppScoringCache`.

The backbone runs in llama.cpp (:mod:`.runtime`, a GGUF written by :mod:`.export`); the head (``f(w·h + b)``, the
config's output function) runs in torch on the hidden states llama.cpp returns. The cache implements the
:class:`~steerkit.rewards.base.ScoringCache` contract with llama.cpp sequences instead of KV tensors:

* row b is sequence ``seqs[b]`` holding its real tokens at positions ``0 .. next_pos[b] - 1`` (positions count real
  tokens, as in every backend; holes left by rollbacks are simply removed cells);
* ``score_blocks``: each candidate block gets a sequence sharing the row's cells (``llama_memory_seq_cp``, metadata
  only in the unified KV cache) and its real tokens at ``next_pos[b] ..``; every block of every row runs in one
  ``llama_decode``; the reward is read at each block's last real token (a block of no real token is read at its
  first, padding, token, as the torch backend reads it: the prefix and itself);
* ``commit_choice``: the chosen block's cells join the row's sequence, the candidate sequences are cleared
  (their other cells are freed);
* ``rollback``: ``llama_memory_seq_rm`` of the row's last positions; ``keep_rows`` renumbers rows (dropped rows'
  sequences are cleared); ``add_rows`` adopts the sequences of a cache of the same model (same context).

When the sequence pool cannot hold a pending block per candidate, rows are scored in groups whose candidate
sequences are cleared at once, and the chosen block is run again on commit (as the torch backend's chunked path).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import torch

from ...errors import ExportError
from ...model_copies import converted_copy
from ..model import CONFIG_NAME, OUTPUT_FUNCTIONS, RewardModel, score_from_scratch
from .export import check_precision, ensure_gguf, geometry, llama_backbone
from .runtime import LlamaCppRuntime


def default_precision() -> str:
    return check_precision(os.environ.get("STEERKIT_LLAMA_CPP_PRECISION", "f32"))


class _LlamaCppModelBase:
    """What the sequence and token models share: the torch model they were made from (config, tokenizer, head,
    input embeddings), the cached GGUF and its llama.cpp runtime."""

    backend = "llama.cpp"

    def __init__(self, torch_model: RewardModel, reward_hash: str, precision: str | None = None,
                 threads: int | None = None):
        self.precision = check_precision(precision or default_precision())
        backbone = llama_backbone(torch_model)
        self.geometry = geometry(backbone)
        self.torch_model = torch_model
        self.config = torch_model.config
        self.tokenizer = torch_model.tokenizer
        self.reward_hash = reward_hash
        self.gguf = ensure_gguf(torch_model, reward_hash, self.precision)
        self.embeddings = backbone.embed_tokens.weight.detach().float().cpu().contiguous().numpy()
        self.runtime = LlamaCppRuntime(self.gguf, hidden=self.geometry["hidden"], threads=threads,
                                       kv_type="f32" if self.precision == "f32" else "f16")
        self.device = torch.device("cpu")

    @classmethod
    def _torch_class(cls):
        return RewardModel

    @classmethod
    def load(cls, reference, *, precision: str | None = None, threads: int | None = None):
        """A reward-model directory (or its config file); its GGUF is written into the cache on first use."""
        from ..onnx.export import reward_dir_hash

        path = Path(reference).expanduser()
        if path.name == CONFIG_NAME:
            path = path.parent
        if not (path / CONFIG_NAME).is_file():
            raise ExportError(f"{path} is no reward-model directory (no {CONFIG_NAME}); backend 'llama.cpp' runs "
                              "reward-model directories (ONNX exports run on backend 'onnx').")
        return cls(cls._torch_class().from_pretrained(path), reward_dir_hash(path), precision, threads)

    @classmethod
    def from_torch(cls, model: RewardModel, *, precision: str | None = None, threads: int | None = None):
        """The llama.cpp model of an in-memory torch reward model (GGUF cached by its content hash)."""
        from ..onnx.export import model_content_hash

        return cls(model, model_content_hash(model), precision, threads)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.config.name!r}, layers={self.config.num_layers}, "
                f"precision={self.precision!r})")

    def context_limit(self) -> int | None:
        return self.torch_model.context_limit()

    def encode(self, texts: list[str], max_length: int | None = None, **kw) -> dict[str, torch.Tensor]:
        return self.torch_model.encode(texts, max_length, **kw)

    def embed(self, ids) -> np.ndarray:
        return self.embeddings[np.asarray(ids, dtype=np.int64)]

    def hidden_of_texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, n, d] of left-padded rows, from scratch (zeros at padding)."""
        B, n = input_ids.shape
        mask = attention_mask.bool()
        seqs = self.runtime.take_or_raise(B, "scoring texts", "score fewer at once")
        try:
            ids, positions, owners = [], [], []
            for b in range(B):
                row = input_ids[b][mask[b]].tolist()
                ids += row
                positions += range(len(row))
                owners += [seqs[b]] * len(row)
            hidden = self.runtime.decode(self.embed(ids), positions, owners, [True] * len(ids))
        finally:
            self.runtime.drop(seqs)
        out = torch.zeros((B, n, self.geometry["hidden"]), dtype=torch.float32)
        out[mask] = torch.from_numpy(hidden)
        return out


class LlamaCppRewardModel(_LlamaCppModelBase):
    """A sequence reward model whose backbone runs in llama.cpp (see the module docstring)."""

    def __init__(self, torch_model: RewardModel, reward_hash: str, precision: str | None = None,
                 threads: int | None = None):
        super().__init__(torch_model, reward_hash, precision, threads)
        head = torch_model.head
        self.head_weight = head.weight.detach().float().cpu().reshape(-1)
        self.head_bias = float(head.bias.detach().float().cpu().reshape(-1)[0]) if head.bias is not None else 0.0
        self._output = OUTPUT_FUNCTIONS[self.config.output_function]

    def rewards(self, hidden: torch.Tensor) -> torch.Tensor:
        """``f(w·h + b)`` of hidden states [..., d]."""
        return self._output(hidden @ self.head_weight + self.head_bias)

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32, per_prefix: bool = False):
        """Reward of each text (from scratch), and with ``per_prefix`` of every prefix (as RewardModel's)."""
        def rewards(ids, _positions, _mask4d, mask):
            return self.rewards(self.hidden_of_texts(ids, mask))

        return score_from_scratch(self.encode, texts, batch_size, per_prefix, rewards, config=self.config)


def _assign(seqs: list[int], used: list[list[bool]]) -> list[list[int | None]]:
    """Sequences ``seqs`` handed out in order to the used blocks of each row; None where a block is not used."""
    given = iter(seqs)
    return [[next(given) if u else None for u in row] for row in used]


def as_llama_cpp(model, cls=LlamaCppRewardModel):
    """``model`` itself when it is a llama.cpp model, else the (memoised) llama.cpp model of a torch one."""
    if isinstance(model, _LlamaCppModelBase):
        return model
    if isinstance(model, RewardModel):
        return converted_copy(model, f"llama.cpp:{cls.__name__}", cls.from_torch)
    raise ExportError(f"backend 'llama.cpp' needs a RewardModel or a llama.cpp reward model, got {type(model).__name__}.")


class LlamaCppScoringCache:
    """The :class:`~steerkit.rewards.base.ScoringCache` of a :class:`LlamaCppRewardModel` over B rows (module
    docstring). ``next_pos`` [B] is each row's next position (its real tokens so far)."""

    def __init__(self, model: LlamaCppRewardModel, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model = model
        self.runtime = model.runtime
        self.device = torch.device("cpu")
        B = input_ids.shape[0]
        seqs = self.runtime.take_or_raise(B, "the reward model's rows", "decode fewer rows at once")
        self.seqs: list[int] = seqs  # changed in place only: the finalizer releases what it holds
        self._release = weakref.finalize(self, self.runtime.release, self.seqs)
        self.next_pos = [0] * B
        self._pending = None
        self.append(input_ids, attention_mask)

    supports_row_changes = True
    scores_ragged = True  # score_blocks(..., active) decodes only the active blocks: llama.cpp batches are ragged

    @classmethod
    def for_model(cls, model, input_ids, attention_mask) -> "LlamaCppScoringCache":
        return cls(as_llama_cpp(model), input_ids, attention_mask)

    @property
    def batch_size(self) -> int:
        return len(self.seqs)

    # -- pending candidate blocks ------------------------------------------------------------------------
    def _drop_pending(self) -> None:
        if self._pending is not None:
            cand = self._pending["seqs"]
            self._pending = None
            if cand:
                self.runtime.drop([s for row in cand for s in row if s is not None])

    def score_blocks(self, blocks: torch.Tensor, block_mask: torch.Tensor | None = None,
                     active: torch.Tensor | None = None) -> torch.Tensor:
        """Rewards [B, k] of k blocks per row ([B, k, m], right padded, mask [B, k, m]) in one llama_decode.
        ``active`` [B, k]: only these blocks are run (a row with none: its first); the others score 0, and choosing
        one commits the row's first active block."""
        self._drop_pending()
        device = blocks.device
        B, k, m = blocks.shape
        mask = torch.ones((B, k, m), dtype=torch.bool) if block_mask is None else block_mask.cpu().bool()
        used = [[True] * k for _ in range(B)] if active is None else active.cpu().bool().tolist()
        used = [row if any(row) else [j == 0 for j in range(k)] for row in used]
        real = [[blocks[b, j][mask[b, j]].tolist() for j in range(k)] for b in range(B)]
        fed = [[r if r else [int(blocks[b, j, 0])] for j, r in enumerate(row)] for b, row in enumerate(real)]
        per_group = max(1, self.runtime.sequences - self.runtime.sequences // 8)  # leave room for other rows
        count = sum(map(sum, used))
        cand = self.runtime.take(count) if count <= per_group else None
        rewards = torch.zeros((B, k), dtype=torch.float32)
        if cand is not None:
            seqs = _assign(cand, used)
            rewards[:] = self._score_rows(list(range(B)), seqs, fed)
            self._pending = {"seqs": seqs, "real": real, "used": used}
            return rewards.to(device)
        # not enough sequences: rows in groups, candidates dropped at once, the choice run again on commit
        rows_per = max(1, per_group // max(1, k))
        for lo in range(0, B, rows_per):
            rows = list(range(lo, min(B, lo + rows_per)))
            flat = self.runtime.take_or_raise(sum(sum(used[b]) for b in rows), "one row's candidates", "lower k")
            try:
                rewards[rows] = self._score_rows(rows, _assign(flat, [used[b] for b in rows]), fed)
            finally:
                self.runtime.drop(flat)
        self._pending = {"seqs": None, "real": real, "used": used}
        return rewards.to(device)

    def _score_rows(self, rows, seqs, fed) -> torch.Tensor:
        """Rewards [len(rows), k] of each row's blocks that have a sequence (``seqs[i][j]``; None: 0, not run)."""
        embed_ids, positions, owners, outputs, where = [], [], [], [], []
        for i, (b, row_seqs) in enumerate(zip(rows, seqs)):
            start = self.next_pos[b]
            for j, s in enumerate(row_seqs):
                if s is None:
                    continue
                self.runtime.copy(self.seqs[b], s)
                ids = fed[b][j]
                embed_ids += ids
                positions += range(start, start + len(ids))
                owners += [s] * len(ids)
                outputs += [False] * (len(ids) - 1) + [True]
                where.append((i, j))
        hidden = self.runtime.decode(self.model.embed(embed_ids), positions, owners, outputs)
        out = torch.zeros((len(rows), len(seqs[0]) if seqs else 0), dtype=torch.float32)
        if where:
            out[tuple(torch.tensor(where).T)] = self.model.rewards(torch.from_numpy(hidden)).float()
        return out

    def commit_choice(self, choice: torch.Tensor) -> None:
        """Keep block ``choice[b]`` of the last :meth:`score_blocks` for each row; drop the others."""
        if self._pending is None:
            raise RuntimeError("commit_choice() needs a preceding score_blocks() call")
        pending, self._pending = self._pending, None
        choice = [int(c) for c in torch.as_tensor(choice).reshape(-1).tolist()]
        choice = [c if pending["used"][b][c] else pending["used"][b].index(True) for b, c in enumerate(choice)]
        real, cand = pending["real"], pending["seqs"]
        if cand is None:  # scored in groups: run each chosen block again
            width = max(1, max(len(real[b][c]) for b, c in enumerate(choice)))
            ids = torch.zeros((len(choice), width), dtype=torch.long)
            mask = torch.zeros((len(choice), width), dtype=torch.bool)
            for b, c in enumerate(choice):
                ids[b, :len(real[b][c])] = torch.tensor(real[b][c], dtype=torch.long)
                mask[b, :len(real[b][c])] = True
            self.append(ids, mask)
            return
        with self.runtime._lock:
            for b, c in enumerate(choice):
                n = len(real[b][c])
                if n:
                    self.runtime.copy(cand[b][c], self.seqs[b], self.next_pos[b])
                    self.next_pos[b] += n
            self.runtime.drop([s for row in cand for s in row if s is not None])

    # -- prefix ------------------------------------------------------------------------------------------
    def append(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Run new tokens [B, n] (mask [B, n]) through the backbone and keep them in each row's sequence."""
        self._drop_pending()
        self._append(tokens, mask, outputs=False)

    def _append(self, tokens, mask, outputs: bool):
        tokens = tokens.cpu()
        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.cpu().bool()
        ids, positions, owners, lengths = [], [], [], []
        for b in range(tokens.shape[0]):
            row = tokens[b][mask[b]].tolist()
            ids += row
            positions += range(self.next_pos[b], self.next_pos[b] + len(row))
            owners += [self.seqs[b]] * len(row)
            lengths.append(len(row))
        hidden = None
        if ids:
            hidden = self.runtime.decode(self.model.embed(ids), positions, owners, [outputs] * len(ids))
        for b, n in enumerate(lengths):
            self.next_pos[b] += n
        return hidden, lengths

    def rollback(self, counts: torch.Tensor) -> None:
        """Forget the last ``counts[b]`` real tokens of each row."""
        self._drop_pending()
        with self.runtime._lock:
            for b, c in enumerate(torch.as_tensor(counts).reshape(-1).tolist()):
                c = min(int(c), self.next_pos[b])
                if c > 0:
                    self.next_pos[b] -= c
                    self.runtime.cut(self.seqs[b], self.next_pos[b])

    # -- rows --------------------------------------------------------------------------------------------
    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` [B'] in that order; the other rows' sequences are cleared."""
        self._drop_pending()
        index = [int(i) for i in torch.as_tensor(index).reshape(-1).tolist()]
        dropped = [s for b, s in enumerate(self.seqs) if b not in set(index)]
        self.runtime.drop(dropped)
        self.seqs[:] = [self.seqs[i] for i in index]
        self.next_pos = [self.next_pos[i] for i in index]

    def add_rows(self, other: "LlamaCppScoringCache") -> None:
        """Adopt the rows of ``other``, a cache of the same llama.cpp model (it is consumed)."""
        if type(other) is not type(self):
            raise TypeError(f"cannot add the rows of a {type(other).__name__} to a {type(self).__name__}")
        if other.runtime is not self.runtime:
            raise TypeError("add_rows() needs a cache of the same llama.cpp reward model (one context): load the "
                            "reward once and start both sessions from it.")
        self._drop_pending()
        other._drop_pending()
        self.seqs.extend(other.seqs)
        self.next_pos += other.next_pos
        other.seqs.clear()  # its finalizer now releases nothing
        other.next_pos = []

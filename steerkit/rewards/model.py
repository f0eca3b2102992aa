"""The reward model: a causal (unidirectional) backbone, optionally truncated, plus a scalar head.

``ρ = f(head(h_t))`` is read at every position, so a single forward pass gives the reward of every
prefix, which is what both the paper's cumulative loss and cached decoding need. The output function
``f`` is the config's ``output_function``: ``sigmoid`` (steerkit's trained models, the default) or
``clamp`` (``clamp(x, 0, 1)``, the paper's reward models, see :mod:`steerkit.rewards.rad_import`).
The backbone is the base model of any causal LM whose blocks form a list (:mod:`.backbones`).

A reward model is saved as a directory (never pickled)::

    reward_config.json     RewardModelConfig (backbone reference + fingerprint, depth, method, ...)
    head.safetensors       the scalar head
    adapter.safetensors    LoRA weights            (method "lora"; merged on load by :mod:`.lora`, no peft)
    backbone.safetensors   the truncated backbone  (method "full")
    metrics.json           optional, written by training
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .attention import additive, append_mask_4d
from ..errors import InvalidArgumentError, PromptTooLongError, RewardModelFormatError
from ..hf_compat import cache_kwargs, output_cache
from ..files import atomic_write_text
from ..models import context_length, load_causal_lm, load_causal_lm_cached, load_tokenizer, resolve
from .backbones import num_blocks, output_hidden_size, truncate
from .lora import lora_config, merge_lora, resolve_lora  # noqa: F401  (lora_config, resolve_lora: re-exported)
from .model_config import (  # noqa: F401  (FORMAT_VERSION, TokenHeadSettings re-exported: importers use them)
    CONFIG_NAME, FORMAT_VERSION, LoraSettings, RewardModelConfig, TokenHeadSettings, _warn_on_old_rad_import,
    read_config,
)

HEAD_NAME = "head.safetensors"
ADAPTER_NAME = "adapter.safetensors"
BACKBONE_NAME = "backbone.safetensors"


@dataclass
class RewardOutput:
    rewards: torch.Tensor  # [B, T] in [0, 1]
    past_key_values: object | None = None


OUTPUT_FUNCTIONS = {
    "sigmoid": torch.sigmoid,
    "clamp": lambda x: torch.clamp(x, 0.0, 1.0),
}


class RewardModel(nn.Module):
    r"""A unidirectional reward model: (the first blocks of) a causal LM plus a scalar head read at every position.

    `ρ_t = f(head(h_t))` with `f` the config's output function (`sigmoid`, or `clamp` to [0, 1] as in the RAD
    paper), so one forward gives the reward of every prefix, and a KV cache of the text so far lets decoding
    score k candidates at the cost of k new positions.

    Args:
        backbone (`nn.Module`):
            The decoder of any `AutoModelForCausalLM` whose blocks form a list (Llama, Qwen, Gemma, SmolLM,
            GPT-2, GPT-NeoX, Phi, OPT, ...), possibly truncated to its first `config.num_layers` blocks.
        config (`RewardModelConfig`):
            Name, attribute, backbone reference and fingerprint, layers kept, output function, training method.
        tokenizer (*optional*):
            The backbone's tokenizer (`encode` and `score_texts` need it).

    `forward(input_ids, attention_mask=None, position_ids=None, past_key_values=None)` takes ids of shape
    `(batch_size, sequence_length)` and returns a `RewardOutput` whose `rewards` have the same shape.
    Build one with `from_backbone(reference, num_layers)` or `from_causal_lm(lm, tokenizer)`, train it with
    `steerkit train`, and reload it with `from_pretrained(directory)` (safetensors only).

    Examples:

    ```python
    >>> import torch
    >>> from steerkit import RewardModel
    >>> from steerkit.testing import make_tokenizer, tiny_lm
    >>> tokenizer = make_tokenizer()
    >>> rm = RewardModel.from_causal_lm(tiny_lm(tokenizer, layers=3), tokenizer, num_layers=2, name="tiny")
    >>> rm.config.num_layers, rm.config.output_function
    (2, 'sigmoid')
    >>> enc = rm.encode(["You are wonderful", "I hate it"])
    >>> rewards = rm(enc["input_ids"], attention_mask=enc["attention_mask"]).rewards
    >>> rewards.shape == enc["input_ids"].shape
    True
    >>> bool(((rewards >= 0) & (rewards <= 1)).all())
    True
    >>> scores = rm.score_texts(["You are wonderful", "I hate it"])  # the reward of each whole text
    >>> len(scores), all(0 <= s <= 1 for s in scores)
    (2, True)

    ```
    """

    #: the ``kind`` of the configs this class loads ("token": :class:`~steerkit.rewards.token.model.TokenRewardModel`)
    kind = "sequence"

    def __init__(self, backbone: nn.Module, config: RewardModelConfig, tokenizer=None):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(config.hidden_size, 1)
        self.config = config
        self.tokenizer = tokenizer

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, reference: str, num_layers: int | None = None, *, name: str = "reward",
                      attribute: str = "", max_length: int = 512) -> "RewardModel":
        """A new reward model with a freshly initialised head over (the first layers of) a causal LM."""
        lm, tokenizer, source = load_causal_lm(reference)
        return cls._wrap(lm, tokenizer, source.reference, source.fingerprint, num_layers, name=name,
                         attribute=attribute, max_length=max_length)

    @classmethod
    def from_causal_lm(cls, lm, tokenizer, num_layers: int | None = None, *, reference: str = "<in-memory>",
                       fingerprint: str = "in-memory", name: str = "reward", attribute: str = "",
                       max_length: int = 512) -> "RewardModel":
        """Wrap an already loaded causal LM (tests build tiny random ones in code)."""
        return cls._wrap(lm, tokenizer, reference, fingerprint, num_layers, name=name, attribute=attribute,
                         max_length=max_length)

    @classmethod
    def _wrap(cls, lm, tokenizer, reference, fingerprint, num_layers, **kw) -> "RewardModel":
        backbone = lm.base_model
        total = num_blocks(backbone)
        num_layers = num_layers or total
        head = kw.get("token_head")
        lm_state = head is not None and head.lm_state
        if lm_state and num_layers != total:
            raise InvalidArgumentError(
                f"token_head.lm_state reads the LM's own final hidden state, so the backbone keeps all {total} "
                f"layers of {reference!r}; got num_layers {num_layers}. Leave num_layers out (or set {total}).")
        truncate(backbone, num_layers)
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        config = RewardModelConfig(
            backbone=reference, backbone_fingerprint=fingerprint, num_layers=num_layers,
            hidden_size=output_hidden_size(lm), vocab_size=backbone.config.vocab_size,
            start_token_id=None if lm_state else int(start), **kw,
        )
        model = cls._from_parts(backbone, config, tokenizer, lm)
        model._init_head()
        return model.eval()

    @classmethod
    def _from_parts(cls, backbone, config: RewardModelConfig, tokenizer, lm) -> "RewardModel":
        """The model around a (truncated) backbone; ``lm`` is the causal LM it came from (subclasses that need
        more of it, such as its output embeddings, take it from there)."""
        return cls(backbone, config, tokenizer)

    def _init_head(self) -> None:
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    # -- forward ------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool = False, cache_position=None) -> RewardOutput:
        extra = {} if cache_position is None else {"cache_position": cache_position}  # a static cache's columns
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=use_cache, **cache_kwargs(self.backbone, past_key_values), **extra)
        rewards = OUTPUT_FUNCTIONS[self.config.output_function](self.head(out.last_hidden_state).squeeze(-1))
        return RewardOutput(rewards, output_cache(out) if use_cache else None)

    def context_limit(self) -> int | None:
        """Most tokens (start token, if any, included) the reward model can read: its backbone's max positions."""
        return context_length(getattr(self, "backbone", None))

    def encode(self, texts: list[str], max_length: int | None = None, *,
               first_index: int = 0) -> dict[str, torch.Tensor]:
        """Tokenize texts as the reward model sees them: start token + text, left padded.

        A model without a start token (``start_token_id: null``) reads the text's own ids only; an empty text is
        then a row of padding alone (what a decoding session starts from; :meth:`score_texts` refuses it).
        With ``max_length`` each text is cut to ``max_length - 1`` tokens (training's convention). Without it
        the whole text is read, and a text longer than the reward model's context raises
        :class:`PromptTooLongError` (never a silent cut, never positions past the context) naming the text
        by its index (``first_index`` + position in ``texts``).
        """
        tok = self.tokenizer
        start = self.config.start_ids
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        if max_length:
            ids = [r[: max_length - 1] for r in ids]
        else:
            limit = self.context_limit() if callable(getattr(self, "context_limit", None)) else None
            for i, r in enumerate(ids):
                if limit is not None and len(r) + len(start) > limit:
                    raise PromptTooLongError(
                        f"Text {first_index + i} has {len(r)} tokens{' (plus the start token)' if start else ''}; "
                        f"the reward model {self.config.name!r} reads at most {limit} tokens (its backbone's "
                        f"context). Shorten the text to at most {limit - len(start)} tokens, or score it in pieces.")
        rows = [start + r for r in ids]
        width = max((len(r) for r in rows), default=0)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        return {"input_ids": ids, "attention_mask": mask}

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32, per_prefix: bool = False):
        """Reward of each text (from scratch, no cache). With ``per_prefix`` also every prefix's reward.

        Without a start token an empty text has no reward: it raises :class:`InvalidArgumentError`."""
        finals, prefixes = [], []
        skip = len(self.config.start_ids)  # the start token's position is no prefix of the text
        device = next(self.parameters()).device
        for i in range(0, len(texts), batch_size):
            enc = self.encode(texts[i:i + batch_size], first_index=i)
            refuse_empty_rows(self.config, enc["attention_mask"], first_index=i)
            mask = enc["attention_mask"].to(device)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            rewards = self(enc["input_ids"].to(device), attention_mask=mask, position_ids=position_ids).rewards
            finals.extend(rewards[:, -1].tolist())
            if per_prefix:
                prefixes.extend(r[m.bool()][skip:].tolist() for r, m in zip(rewards, mask))
        return (finals, prefixes) if per_prefix else finals

    # -- persistence --------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike, metrics: dict | None = None) -> Path:
        """Write config + safetensors weights (atomically, file by file)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name: t.detach().contiguous().cpu() for name, t in self.head.state_dict().items()}
        _save_atomic(save_file, tensors, directory / HEAD_NAME)
        if self.config.method == "lora":
            from peft import get_peft_model_state_dict

            if not hasattr(self.backbone, "peft_config"):
                raise RewardModelFormatError("method is 'lora' but the backbone carries no LoRA adapter.")
            # the adapter only: LoRA never trains the embeddings here (and "auto" would look the backbone up online)
            adapter = get_peft_model_state_dict(self.backbone, save_embedding_layers=False)
            state = {k: v.detach().contiguous().cpu() for k, v in adapter.items()}
            _save_atomic(save_file, state, directory / ADAPTER_NAME)
        elif self.config.method == "full":
            state = {k: v.detach().contiguous().cpu() for k, v in self.backbone.state_dict().items()}
            _save_atomic(save_file, state, directory / BACKBONE_NAME)
        if metrics is not None:
            atomic_write_text(directory / "metrics.json", json.dumps(metrics, indent=2))
        atomic_write_text(directory / CONFIG_NAME, self.config.model_dump_json(indent=2))
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, check_backbone: bool = True) -> "RewardModel":
        """Load a reward-model directory; every missing or mismatched file raises RewardModelFormatError."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = Path(directory)
        config = read_config(directory)
        _warn_on_old_rad_import(directory, config)
        if config.kind != cls.kind:
            raise RewardModelFormatError(
                f"{directory} is a {config.kind}-level reward model, not a {cls.kind}-level one: load it with "
                "steerkit.load_reward(directory)" + (" or steerkit.rewards.token.model.TokenRewardModel"
                                                      ".from_pretrained" if config.kind == "token" else "") + ".")
        missing = [f for f in weight_files(config) if not (directory / f).is_file()]
        if missing:
            raise RewardModelFormatError(
                f"Reward-model directory {directory} lacks {', '.join(missing)} (method {config.method!r}). "
                "Re-export it with `steerkit train` or copy the missing files."
            )
        source = resolve(config.backbone)
        if check_backbone and source.fingerprint != config.backbone_fingerprint:
            raise RewardModelFormatError(
                f"{directory} was trained on backbone {config.backbone!r} with fingerprint "
                f"{config.backbone_fingerprint[:16]}…, but that reference now resolves to weights "
                f"{source.fingerprint[:16]}…. Install the matching backbone or retrain the reward model."
            )
        # A head on the whole, unchanged LM (token_head.lm_state; the config's validator holds it to method "head")
        # shares the process's loaded copy of it, the one steerkit's engine steers with: a second copy would sit
        # unused while the engine hands the head the LM's own state (toxicity-lm: load 1.0 s -> 0.3 s;
        # docs/token_rewards.md). Any other backbone is truncated or merged, so it gets a copy of its own.
        shares = config.reads_lm_state
        lm, _, _ = (load_causal_lm_cached if shares else load_causal_lm)(config.backbone)
        tokenizer = load_tokenizer(config.tokenizer or config.backbone)
        backbone = lm.base_model
        if shares and num_blocks(backbone) != config.num_layers:
            raise RewardModelFormatError(
                f"{directory}: a head on the LM's own state (token_head.lm_state) reads all of {config.backbone!r}, "
                f"which has {num_blocks(backbone)} layers, but the config says num_layers {config.num_layers}. "
                "Retrain it, or set num_layers to the LM's.")
        hidden = output_hidden_size(lm)
        if hidden != config.hidden_size or backbone.config.vocab_size != config.vocab_size:
            raise RewardModelFormatError(
                f"{directory}: backbone {config.backbone!r} has hidden size {hidden} and "
                f"vocab {backbone.config.vocab_size}, the reward model expects {config.hidden_size} / {config.vocab_size}."
            )
        truncate(backbone, config.num_layers)
        try:
            if config.method == "lora":
                adapter = directory / ADAPTER_NAME  # merged by steerkit itself: loading needs no peft
                backbone = merge_lora(backbone, config.lora or LoraSettings(), load_file(str(adapter)), str(adapter))
            elif config.method == "full":
                _load_strict(backbone, load_file(str(directory / BACKBONE_NAME)), directory / BACKBONE_NAME)
            model = cls._from_parts(backbone, config, tokenizer, lm)
            _load_strict(model.head, load_file(str(directory / HEAD_NAME)), directory / HEAD_NAME)
        except (SafetensorError, OSError) as exc:
            raise RewardModelFormatError(f"Corrupt weights in {directory}: {exc}") from None
        return model.eval()


def weight_files(config: RewardModelConfig) -> list[str]:
    """The weight files a reward-model directory of ``config``'s method holds: the head, and the LoRA adapter or the
    fine-tuned backbone."""
    return [HEAD_NAME] + {"lora": [ADAPTER_NAME], "full": [BACKBONE_NAME]}.get(config.method, [])


def refuse_empty_rows(config: RewardModelConfig, attention_mask: torch.Tensor, first_index: int = 0) -> None:
    """Raise :class:`InvalidArgumentError` for a text of no tokens (an :meth:`RewardModel.encode` row with no real
    position) when the model reads no start token: there is no position to read its reward from. The paper's
    code never scores an empty text (it scores prompt + continuation, and prompts are not empty)."""
    if config.start_token_id is not None:
        return
    empty = (attention_mask.sum(-1) == 0).nonzero()
    if len(empty):
        raise InvalidArgumentError(
            f"Text {first_index + int(empty[0])} is empty (no tokens), and the reward model {config.name!r} reads no "
            "start token (start_token_id: null, as the paper's RAD models, which read a text's own ids): an empty "
            "text has no reward. Score non-empty texts only (leave empty ones out).")


def score_from_scratch(encode, texts: list[str], batch_size: int, per_prefix: bool, rewards, *,
                       config: RewardModelConfig):
    """``score_texts`` of a reward model run by another runtime (ONNX, llama.cpp): one prefill per batch of
    ``batch_size`` texts, zero-length past.

    ``encode(texts)`` gives ``input_ids`` and ``attention_mask`` [B, n]; ``rewards(ids, positions, mask4d, mask)``
    gives the reward at every position [B, n] (``mask4d`` the additive 4D mask, ``mask`` the bool [B, n] one).
    Returns the final reward of each text, and with ``per_prefix`` also each text's prefix rewards (those after
    the start token, where ``config`` has one).
    """
    finals, prefixes = [], []
    skip = len(config.start_ids)
    for i in range(0, len(texts), batch_size):
        enc = encode(texts[i:i + batch_size])
        refuse_empty_rows(config, enc["attention_mask"], first_index=i)
        mask = enc["attention_mask"].bool()
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        allowed = append_mask_4d(torch.zeros((mask.shape[0], 0), dtype=torch.bool), mask)
        batch_rewards = rewards(enc["input_ids"], positions, additive(allowed), mask)
        finals.extend(batch_rewards[:, -1].tolist())
        if per_prefix:
            prefixes.extend(r[m][skip:].tolist() for r, m in zip(batch_rewards, mask))
    return (finals, prefixes) if per_prefix else finals



def _save_atomic(save_file, tensors: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def _load_strict(module: nn.Module, state: dict, path: Path) -> None:
    expected = module.state_dict()
    problems = sorted(set(expected) ^ set(state))
    problems += [k for k in expected if k in state and expected[k].shape != state[k].shape]
    if problems:
        raise RewardModelFormatError(
            f"{path} does not match the model it is loaded into (mismatched tensors: {', '.join(problems[:5])}"
            f"{'…' if len(problems) > 5 else ''}). It was saved from a different backbone or depth."
        )
    module.load_state_dict(state)

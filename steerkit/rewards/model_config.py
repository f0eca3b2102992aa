"""A reward-model directory's ``reward_config.json``: :class:`RewardModelConfig` (with its LoRA and token-head
settings) and :func:`read_config`, which validates it. :mod:`steerkit.rewards.model` builds the model around it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import RewardModelFormatError, SteerkitWarning

CONFIG_NAME = "reward_config.json"
FORMAT_VERSION = 1


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    #: None: the backbone family's attention projections (q_proj/v_proj, GPT-2 c_attn, GPT-NeoX query_key_value)
    target_modules: list[str] | None = None


class TokenHeadSettings(BaseModel):
    """The head of a token-level reward model (``kind: token``, :mod:`steerkit.rewards.token.model`)."""

    model_config = ConfigDict(extra="forbid")
    #: None: W is d×d (as in rad-q's ``linear_with_baseline``); an int r: W = U·V with U d×r, V r×d
    rank: int | None = Field(default=None, ge=1)
    #: add the prefix baseline b·h_t (rad-q's ``prefix_baseline``)
    baseline: bool = True
    #: the head reads the language model's *own* final hidden state: the backbone is the whole LM, frozen, read
    #: without a start token (as the LM reads a prompt), so steerkit's engine can hand the head the state its LM
    #: has already computed and the reward costs one small product per step (:mod:`steerkit.rewards.token.lm_state`).
    #: Such a model steers only that LM (its ``backbone_fingerprint``), only in steerkit's own engine.
    lm_state: bool = False


class RewardModelConfig(BaseModel):
    """Everything needed to rebuild a reward model around its saved weights."""

    model_config = ConfigDict(extra="forbid")
    format_version: int = FORMAT_VERSION
    name: str = "reward"
    attribute: str = ""  # what rho measures, e.g. "probability the text is toxic"
    backbone: str  # model reference of the backbone (packaged name, dir, gguf, hub id)
    backbone_fingerprint: str  # sha256 of the backbone's weights, checked on load
    tokenizer: str | None = None  # defaults to the backbone's tokenizer
    num_layers: int  # transformer layers kept from the backbone
    hidden_size: int
    vocab_size: int
    method: Literal["head", "lora", "full"] = "head"
    lora: LoraSettings | None = None
    #: prepended to every text, so an empty prefix can be scored (the backbone's BOS, else its EOS). ``null``: the
    #: model reads a text's own ids and nothing else, as the paper's reward models were trained (``steerkit import
    #: rad`` writes it): the first scored position is the text's first token, and an empty text has no reward.
    #: Required, so a directory always says which; ``kind: token`` needs one.
    start_token_id: int | None
    max_length: int = 512
    output_function: Literal["sigmoid", "clamp"] = "sigmoid"  # rho = sigmoid(head(h)) or clamp(head(h), 0, 1)
    #: "sequence": a scalar head read after each candidate (this module); "token": a head that scores every
    #: next token from the prefix alone (:mod:`steerkit.rewards.token.model`, ``token_head`` its settings)
    kind: Literal["sequence", "token"] = "sequence"
    token_head: TokenHeadSettings | None = None

    @property
    def reads_lm_state(self) -> bool:
        """A head on the LM's own final hidden state (``token_head.lm_state``): kind token, method head, all the LM's
        layers unchanged, no start token (:mod:`steerkit.rewards.token.lm_state`)."""
        return self.token_head is not None and self.token_head.lm_state

    @model_validator(mode="after")
    def _token_models_need_a_start_token(self) -> "RewardModelConfig":
        lm_state = self.reads_lm_state
        if lm_state and (self.kind != "token" or self.start_token_id is not None or self.method != "head"):
            raise ValueError("token_head.lm_state needs kind: token, method: head (the LM stays as it is) and "
                             "start_token_id: null (the LM reads a prompt without one).")
        if self.kind == "token" and self.start_token_id is None and not lm_state:
            raise ValueError("start_token_id is null, but a token-level reward model (kind: token) reads the "
                             "reward of a text's first token from the start token's position; set start_token_id.")
        return self

    @property
    def start_ids(self) -> list[int]:
        """The ids read before every text: ``[start_token_id]``, or ``[]`` when the model reads none."""
        return [] if self.start_token_id is None else [self.start_token_id]


def _warn_on_old_rad_import(directory: Path, config: RewardModelConfig) -> None:
    """Directories written by ``steerkit import rad`` before it wrote ``start_token_id: null`` score every text
    after a start token the paper's models never saw in training: other rewards than the original's."""
    if config.start_token_id is not None and (directory / "rad_import.json").is_file():  # rad_import.PROVENANCE_NAME
        warnings.warn(SteerkitWarning(
            f"{directory} was imported from a RAD checkpoint by an older steerkit that prepends a start token the "
            "paper's reward models never saw, so its rewards differ from the original's. Re-import it with "
            "`steerkit import rad CHECKPOINT --backbone gpt2 --out DIR --overwrite`, or set \"start_token_id\": "
            f"null in its {CONFIG_NAME}."), stacklevel=3)


def read_config(directory: Path) -> RewardModelConfig:
    path = Path(directory) / CONFIG_NAME
    if not Path(directory).is_dir():
        raise RewardModelFormatError(f"{directory} is not a directory; a reward model is a directory with {CONFIG_NAME}.")
    if not path.is_file():
        raise RewardModelFormatError(f"{directory} has no {CONFIG_NAME}; is it a steerkit reward-model directory?")
    try:
        config = RewardModelConfig.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise RewardModelFormatError(f"{path} is invalid: {exc}") from None
    if config.format_version != FORMAT_VERSION:
        raise RewardModelFormatError(f"{path} has format_version {config.format_version}; this steerkit reads {FORMAT_VERSION}.")
    return config

"""The OpenAI request bodies ``steerkit serve`` accepts (pydantic), with steerkit's steering fields.

``CompletionRequest`` (``POST /v1/completions``) and ``ChatCompletionRequest`` (``POST /v1/chat/completions``)
take OpenAI's fields (``model``, ``max_tokens``, ``temperature``, ``n``, ``seed``, ``stop``, ``stream``,
``stream_options``, ``user``) and three of steerkit's, sent by the ``openai`` client through ``extra_body``:

- ``rewards``: ``{"toxicity": -20, "sentiment": 10}`` (name -> β) or the config file's list form
  ``[{"name": "sentiment", "beta": 10, "schedule": "linear", "ramp_steps": 5, "label": "pos"}]``;
  ``{}`` or ``[]`` is unsteered; absent or ``null`` is the server's default steering;
- ``k``: candidates reweighted per step (absent: the server's default);
- ``reward_trace``: ``true`` adds each token's per-reward ρ to the response (``reward_trace`` on each choice,
  or on each streamed chunk).

``vllm_xargs`` (vLLM's per-request extra arguments) is accepted beside them, in the form steerkit's vLLM logits
processor reads (docs/vllm.md): ``{"rewards": ["toxicity=-20"], "k": 20}`` (``rewards`` also in any form above),
translated into the same ``rewards`` and ``k``, so a client written against vLLM + steerkit runs here unchanged.

Validation is strict: wrong JSON types (``"k": "5"``, ``"stream": 1``) are refused, not coerced, and unknown
fields are refused with the closest known name. OpenAI fields that steerkit does not implement are accepted
only at their neutral value (``top_p: 1``, ``presence_penalty: 0``, ``logprobs: null`` ...), so a request never
silently gets something other than what it asked for.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


#: OpenAI fields steerkit does not implement, and the values that mean "not used" (accepted, ignored).
NEUTRAL_FIELDS: dict[str, tuple] = {
    "top_p": (1, 1.0, None), "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}), "echo": (False, None),
    "best_of": (None, 1), "suffix": (None, ""), "parallel_tool_calls": (None,), "tools": (None, []),
    "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
    "service_tier": (None, "auto", "default"), "store": (None, False), "metadata": (None, {}),
}

#: At most this many stop strings (OpenAI's limit) and prompts in one completions request.
MAX_STOP = 4
MAX_PROMPTS = 16


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Request(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow", strict=True)  # extras are checked by _known_fields (better messages)
    model: str | None = Field(default=None, description="The served model's name (GET /v1/models); optional")
    max_tokens: int | None = Field(default=None, ge=1, description="Tokens to generate at most per choice")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Alias of max_tokens (chat)")
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False, description="0 is greedy")
    n: int = Field(default=1, ge=1, description="Choices per prompt; choice i uses seed + i")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1,
                             description="Seed of choice 0 (what torch.manual_seed takes); absent: the server draws one")
    stop: Any = Field(default=None, description="A stop string or a list of up to 4")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    rewards: Any = Field(default=None, description="name -> beta, or a list of reward specs; {} is unsteered")
    k: int | None = Field(default=None, description="Top-k candidates reweighted per step")
    reward_trace: bool = Field(default=False, description="Return each token's per-reward rho")
    vllm_xargs: Any = Field(default=None, description="vLLM's extra arguments: rewards ('name=beta' strings or any "
                                                      "rewards form) and k, as under vLLM with steerkit's processor")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data):
        if not isinstance(data, dict):
            return data  # pydantic reports "a valid dictionary"
        known = set(cls.model_fields)
        for key, value in data.items():
            if key in known:
                continue
            if key in NEUTRAL_FIELDS:
                if _neutral(value, NEUTRAL_FIELDS[key]):
                    continue
                raise ValueError(f"field {key!r} is an OpenAI option steerkit serve does not implement; remove it "
                                 f"(or send it at its neutral value {NEUTRAL_FIELDS[key][0]!r}).")
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(sorted(known))}."
            raise ValueError(f"unknown field {key!r}{hint}")
        return {key: value for key, value in data.items() if key in known}

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings.")
        if len(items) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} strings, got {len(items)}.")
        return tuple(items)

    @field_validator("rewards")
    @classmethod
    def _rewards(cls, value):
        return parse_rewards(value)

    @field_validator("vllm_xargs")
    @classmethod
    def _vllm_xargs(cls, value):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError("vllm_xargs must be an object ({\"rewards\": [\"toxicity=-20\"], \"k\": 20}).")
        unknown = sorted(str(key) for key in value if key not in VLLM_XARGS)
        if unknown:
            raise ValueError(f"vllm_xargs.{unknown[0]} is not a steering field; steerkit reads "
                             f"{' and '.join(VLLM_XARGS)} from vllm_xargs.")
        out = {}
        if "rewards" in value:
            try:
                out["rewards"] = parse_rewards(value["rewards"], strings=True)
            except ValueError as exc:
                raise ValueError(f"vllm_xargs.rewards: {exc}") from None
            for entry in out["rewards"] or ():  # an unknown name found later is blamed where the client wrote it
                if getattr(entry, "_param", None):
                    entry._param = f"vllm_xargs.{entry._param}"
        if "k" in value:
            if type(value["k"]) is not int:
                raise ValueError(f"vllm_xargs.k must be an integer, got {value['k']!r:.40}.")
            out["k"] = value["k"]
        return out

    @model_validator(mode="after")
    def _from_vllm_xargs(self):
        for key, parsed in (self.vllm_xargs or {}).items():
            if getattr(self, key) is not None:
                raise ValueError(f"field '{key}' is given twice, at the top level and in vllm_xargs; send one.")
            setattr(self, key, parsed)
        return self

    def limit(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


def _neutral(value, neutral: tuple) -> bool:
    return any(type(value) is type(n) and value == n for n in neutral)


#: The keys of ``vllm_xargs`` steerkit reads (what steerkit.integrations.requests reads under vLLM).
VLLM_XARGS = ("rewards", "k")


def parse_rewards(value, strings: bool = False) -> list | None:
    """``rewards`` as sent: None (server default), a name -> β mapping, or a list of reward specs (``strings``:
    ``"name=β"`` items too, vLLM's form), parsed by :func:`steerkit.params.parse_rewards` (the one parser; its
    errors become pydantic's ``ValueError``)."""
    from ..errors import SteerkitError
    from ..params import parse_rewards as parse

    if isinstance(value, dict) and any(not name for name in value):
        raise ValueError("a reward name is empty; use a name from GET /v1/models (steering.rewards).")
    try:
        return parse(value, strings=strings)
    except SteerkitError as exc:
        raise ValueError(str(exc)) from None


def _first_error(exc) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    e = errors(include_url=False)[0]
    where = ".".join(str(p) for p in e["loc"])
    message = e["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is a string or a list of strings (choices are prompt-major)."""

    prompt: Any = Field(description="A prompt, or a list of up to 16 prompts")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(p, str) for p in items):
            raise ValueError("prompt must be a string or a non-empty list of strings (token-id prompts are not "
                             "supported; send text).")
        if len(items) > MAX_PROMPTS:
            raise ValueError(f"prompt takes at most {MAX_PROMPTS} prompts per request, got {len(items)}.")
        for i, p in enumerate(items):
            if not p.strip():
                raise ValueError(f"prompt {i} is empty; send some text to continue.")
        return items


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "developer"]
    content: Any
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, value):
        if isinstance(value, list):  # OpenAI's content parts: text only
            parts = []
            for part in value:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ValueError("content parts must be {\"type\": \"text\", \"text\": ...}; images and audio "
                                     "are not supported.")
                parts.append(part["text"])
            value = "".join(parts)
        if not isinstance(value, str):
            raise ValueError("content must be a string or a list of text parts.")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # the position in this message's own text, not in the templated prompt
            raise ValueError(f"content has an invalid character {value[exc.start]!r} (a lone surrogate) at position "
                             f"{exc.start}; it is not valid Unicode text. Remove it.") from None
        return value


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``: ``messages`` go through the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation; the model answers the last")

    @field_validator("messages")
    @classmethod
    def _some_text(cls, value):
        if not any(m.content.strip() for m in value):
            raise ValueError("messages are all empty; send some text.")
        return value

    def conversation(self) -> list[dict]:
        """Messages for ``apply_chat_template`` (OpenAI's ``developer`` role is the templates' ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.content} for m in self.messages]

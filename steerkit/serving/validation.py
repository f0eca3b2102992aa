"""Checking a :class:`~steerkit.serving.requests.RowSpec` before it is queued: steerkit's own validators (so the
messages match ``steerkit.generate`` and config files), each error tagged with ``.param``, the field to blame."""

from __future__ import annotations

from ..errors import InvalidArgumentError, PromptTooLongError, SteerkitError
from ..params import SteerParams, tag_param
from ..validators import check_unicode
from ..engine.rows import Row
from .requests import RowSpec
from .row_terms import row_terms


def prepare_rows(engine, specs, handles) -> list[Row] | None:
    """Check each spec once against ``engine`` (its vocabulary, context, rewards and defaults) with steerkit's
    validators; a typed error carries ``.param``, the RowSpec field to blame. A prompt is tokenized, and a
    rewards value turned into terms, once per call however many rows share it. With handles: the Rows to
    queue (all specs are checked before any Row exists)."""
    tokens: dict[str, list[int]] = {}
    terms: dict[int, list] = {}
    checked = []
    for spec in specs:
        values = _check_fields(engine, spec, terms)
        if spec.prompt not in tokens:
            tokens[spec.prompt] = _prompt_ids(engine, spec.prompt, values["max_tokens"])
        elif engine.context is not None and len(tokens[spec.prompt]) + values["max_tokens"] > engine.context:
            _prompt_ids(engine, spec.prompt, values["max_tokens"])  # raises the length error
        checked.append(values)
    if handles is None:
        return None
    rows = []
    for spec, handle, values in zip(specs, handles, checked):
        timeout = values["timeout_s"]
        rows.append(Row(spec.prompt, tokens[spec.prompt], values["rewards"], values["k"], values["temperature"],
                        values["max_tokens"], values["stop"], bool(spec.include_stop), values["seed"], spec.trace,
                        None if timeout is None else handle.submitted + timeout, handle))
    return rows


def _check_fields(engine, spec: RowSpec, terms: dict) -> dict:
    """The spec's fields as :class:`~steerkit.params.SteerParams` (validated once), k within the LM's
    vocabulary, and the row's terms (built once per rewards value)."""
    if not isinstance(spec, RowSpec):
        raise InvalidArgumentError(f"expected a RowSpec, got {type(spec).__name__}")
    prompt = spec.prompt
    if not isinstance(prompt, str) or not prompt:
        raise tag_param(InvalidArgumentError(f"The prompt is empty or not a string ({prompt!r:.40}); give some "
                                             "text."), "prompt")
    try:
        check_unicode(prompt, "The prompt")
    except SteerkitError as exc:
        raise tag_param(exc, "prompt") from None
    rewards = engine.default_rewards if spec.rewards is None else spec.rewards
    params = SteerParams.create(max_new_tokens=spec.max_tokens, k=spec.k, temperature=spec.temperature,
                                seed=spec.seed, stop=spec.stop, include_stop=spec.include_stop, trace=spec.trace,
                                timeout_s=spec.timeout_s, vocab_size=engine.vocab_size,
                                names={"max_new_tokens": "max_tokens"})
    k = engine.default_k if params.k is None else params.k
    if id(rewards) not in terms:
        try:
            terms[id(rewards)] = row_terms(rewards, engine.lookup)
        except SteerkitError as exc:
            raise tag_param(exc, "rewards") from None
    check_cost(engine, terms[id(rewards)], k, "k")
    return {"max_tokens": params.max_new_tokens, "temperature": params.temperature, "k": k, "seed": params.seed,
            "stop": list(params.stop), "timeout_s": params.timeout_s, "rewards": terms[id(rewards)]}


def check_cost(engine, terms, k: int, what: str) -> None:
    """Refuse (``param`` "k") a row whose step would cost more than the engine admits: k candidates scored by a
    sequence reward (each one a text through the reward model) past ``engine.max_k_sequence``. A token-level
    reward scores the whole vocabulary at once, so its cost does not grow with k."""
    limit = getattr(engine, "max_k_sequence", None)
    heavy = [t.name for t in terms if t.is_sequence_reward]
    if limit is None or k <= limit or not heavy:
        return
    raise tag_param(InvalidArgumentError(
        f"{what}={k} is more than this server scores with a sequence reward ({', '.join(map(repr, heavy))}): at "
        f"most {limit} candidates per step (steerkit serve --max-k-sequence; GET /v1/models lists the limits). "
        "Lower k, or use a token-level reward, whose cost does not grow with k."), "k")


def _prompt_ids(engine, prompt: str, max_tokens: int) -> list[int]:
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise tag_param(InvalidArgumentError("The prompt encodes to no tokens; give some text."), "prompt")
    if engine.context is not None and len(ids) + max_tokens > engine.context:
        raise tag_param(PromptTooLongError(
            f"The prompt has {len(ids)} tokens; with max_tokens={max_tokens} that exceeds the "
            f"model's context of {engine.context} tokens. Shorten the prompt or lower max_tokens."), "prompt")
    return ids

"""What :meth:`Engine.from_config` loads: the LM, every installed reward, the config's rewards and defaults."""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass
class EngineParts:
    lm: object
    tokenizer: object
    rewards: dict
    default_rewards: list | None
    k: int
    model_name: str


def engine_parts(config=None) -> EngineParts:
    """``config`` (a :class:`~steerkit.config.SteeringConfig`, or None for the defaults: the packaged SmolLM2,
    every installed reward, no default steering). Every reward is loaded now, so that no request waits for a
    load; an installed reward that fails to load is skipped with a :class:`~steerkit.errors.SteerkitWarning`
    (the config's own rewards must load)."""
    from ..assembly import assemble
    from ..config import SteeringConfig
    from ..devices import place, resolve_device
    from ..errors import SteerkitError, SteerkitWarning
    from ..registry import list_rewards
    from ..rewards.loading import load_reward

    config = config or SteeringConfig()
    if config.device is not None:
        resolve_device(config.device)  # a device this machine lacks fails before the slow loads
    rewards: dict = {}
    for spec in config.rewards:  # the config's references (names or directories), with their context
        if spec.name not in rewards:
            rewards[spec.name] = load_reward(spec.name, backend=config.backend, context=spec.context)
    for registration in list_rewards():
        if registration.name in rewards:
            continue
        try:
            rewards[registration.name] = load_reward(registration.name, backend=config.backend)
        except SteerkitError as exc:
            warnings.warn(f"reward {registration.name!r} is installed but could not be loaded, so it is not served: "
                          f"{exc}", SteerkitWarning, stacklevel=2)
    _load_clashing_rewards(rewards, config.backend)
    setup = assemble(config.lm, device=config.device, engine=config.engine, compile=config.compile, dtype=config.dtype)  # the LM, on the config's device
    model, tokenizer = setup.model, setup.tokenizer
    if config.device is not None:
        model = place(model, rewards.values(), config.device)
    if config.compile:
        # the rewards' compiled steps where they pay (assembly.compiled_reward); their row buckets compile before the
        # server answers, as the LM's do (Engine's construction: warm_up_compiled_rewards below)
        from ..assembly import compiled_reward

        rewards = {name: compiled_reward(reward) for name, reward in rewards.items()}
    default = [spec.model_dump() for spec in config.rewards] or None
    return EngineParts(model, tokenizer, rewards, default, config.k, config.lm)


def _load_clashing_rewards(rewards: dict, backend) -> None:
    """Serve every provider of a reward name that several plugins register under its qualified name
    ``PLUGIN:NAME`` (:meth:`~steerkit.registry.Registry.qualified`); the bare name is served only when a preference
    (``--prefer NAME=PLUGIN`` or ``STEERKIT_PREFER``) picks one, else a ``warning:`` says how to pick."""
    from ..errors import SteerkitError, SteerkitWarning
    from ..hookspecs import ENV_PREFER
    from ..registry import get_registry
    from ..rewards.loading import load_reward

    registry = get_registry()
    for name, conflict in sorted(registry.conflicts["reward"].items()):
        refs = []
        for provider in sorted(conflict.providers, key=registry.qualified):
            ref = registry.qualified(provider)
            refs.append(ref)
            if ref in rewards:
                continue
            if conflict.selected is provider and name in rewards:
                rewards[ref] = rewards[name]  # the preferred provider, already loaded under the bare name
                continue
            try:
                rewards[ref] = load_reward(ref, backend=backend)
            except SteerkitError as exc:
                warnings.warn(f"reward {ref!r} is installed but could not be loaded, so it is not served: {exc}",
                              SteerkitWarning, stacklevel=3)
        if conflict.selected is not None and name in rewards:
            continue
        why = f" ({conflict.problem})" if conflict.problem else ""
        plugins = " or ".join(ref.rpartition(":")[0] for ref in refs)
        warnings.warn(f"reward {name!r} is registered by {len(refs)} plugins, so it is not served under the bare name "
                      f"{name!r}{why}: requests can name {' or '.join(repr(r) for r in refs)}; to serve one of them "
                      f"as {name!r}, start the server with --prefer {name}=PLUGIN or set {ENV_PREFER}={name}=PLUGIN "
                      f"(PLUGIN: {plugins}).", SteerkitWarning, stacklevel=3)


def warm_up_compiled_rewards(engine, tokens: int) -> None:
    """Compile the candidate scoring of every reward ``engine`` serves whose scoring is compiled (a static session,
    ``--compile``) for each row bucket up to its ``max_running`` at its default k and each reward context of up to
    ``tokens`` tokens (64, 128, ... columns), now, as the LM's steps are (the engine calls this while it is built):
    greedy rows steered by one reward each, run through the engine before its loop starts. A reward that reads the
    prompt (``context="full"``) gets rows of two tokens, their prompts as long as each context bucket needs; one that
    scores the continuation alone (the default context, every shipped reward) gets rows of a one-token prompt that
    generate as many tokens as the widest bucket needs, so they pass through every bucket (a row that ends early, at
    its end-of-sequence token, leaves the wider buckets to run eagerly in the loop). A reward the engine cannot run
    (one that reads the LM's own state, on the compiled LM) is left to fail its requests with its own error. The
    counts and the observer (the metrics) do not see these rows."""
    from ..compiling import buckets_up_to
    from ..rewards.static_kv import MIN_COLUMNS

    names = [name for name in engine.lookup.names() if getattr(engine.lookup(name), "static", None) == "compiled"]
    if engine.context is not None:
        tokens = min(tokens, engine.context - 3)  # each warm-up row (its prompt and tokens) fits the context
    # a prompt of 1 token fills the narrowest bucket of columns; one of half a wider bucket and 1, that bucket
    lengths = [1] + [columns // 2 + 1 for columns in buckets_up_to(tokens + 1, MIN_COLUMNS)[1:]]
    prompts = [engine.tokenizer.decode(engine.tokenizer(" a" * n, add_special_tokens=False)["input_ids"][:n])
               for n in lengths]
    # (prompt, tokens) rows: a full-context reward's bucket is filled by the prompt, a continuation's by its tokens
    rows = {"full": [(prompt, 2) for prompt in prompts], "continuation": [(prompts[0], lengths[-1] + 1)]}
    observer, max_queue = engine.observer, engine.max_queue
    engine.observer, engine.max_queue = None, max(max_queue, engine.max_running)  # a bucket's rows at once
    try:
        for name in names:
            for prompt, max_tokens in rows[getattr(engine.lookup(name), "context", "full")]:
                if not _warm_up_reward(engine, name, prompt, max_tokens):
                    break
    finally:
        engine.observer, engine.max_queue = observer, max_queue
        engine._counts = {"steps": 0, "tokens": 0, "finished": {}}
        engine._core.reset()


def _warm_up_reward(engine, name: str, prompt: str, max_tokens: int) -> bool:
    """Rows of ``prompt`` generating ``max_tokens`` tokens steered by reward ``name`` through ``engine``, one batch
    per row bucket: False where the engine refuses them (as it would any request naming that reward)."""
    from ..compiling import buckets_up_to
    from ..errors import SteerkitError
    from .requests import RowSpec

    for rows in buckets_up_to(engine.max_running):
        specs = [RowSpec(prompt, max_tokens, temperature=0.0, k=engine.default_k, rewards={name: 1.0})
                 for _ in range(min(rows, engine.max_running))]
        try:
            handles = engine.submit_all(specs)
        except SteerkitError:  # refused as any request naming it would be
            return False
        while any(h.finish is None for h in handles):
            engine._iterate()
        if any(h.finish.error is not None for h in handles):
            return False
    return True

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
    setup = assemble(config.lm, device=config.device)  # the LM, on the config's device
    model, tokenizer = setup.model, setup.tokenizer
    if config.device is not None:
        model = place(model, rewards.values(), config.device)
    default = [spec.model_dump() for spec in config.rewards] or None
    return EngineParts(model, tokenizer, rewards, default, config.k, config.lm)

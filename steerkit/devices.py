"""Torch devices: one place that validates a device name and puts the models of a run on it."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from .errors import ConfigError


def check_device_name(name: str | None) -> str | None:
    """``None``/"" (the CPU) or a valid torch device string (cpu, cuda, cuda:1, mps); ValueError otherwise."""
    if not name:
        return None
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {name!r} is not a torch device (use cpu, cuda, cuda:0 or mps): {exc}") from None
    return name


DeviceName = Annotated[str | None, AfterValidator(check_device_name)]
"""A config field holding a device name (validated when the config is built, checked for presence at use)."""


def resolve_device(name: str | None) -> str:
    """The device to use (``"cpu"`` when none is given); a typed error when it is not on this machine."""
    import torch

    device = check_device_name(name) or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for, but torch sees no CUDA GPU "
                          f"(torch {torch.__version__}); use --device cpu.")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device 'mps' was asked for, but this torch has no Apple GPU; use --device cpu.")
    return device


def move_reward(reward, device: str):
    """Put a torch reward model on ``device`` (ONNX rewards and rewards without a torch model stay put)."""
    model = getattr(reward, "model", None)
    if getattr(reward, "backend", "torch") == "torch" and hasattr(model, "to"):
        model.to(device)
    return reward


def place(model, terms, device: str | None):
    """Put an LM and its steering terms' torch reward models on ``device``; returns the LM there."""
    device = resolve_device(device)
    for term in terms:
        move_reward(term.reward, device)
    return model.to(device)

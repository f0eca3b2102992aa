"""Torch devices: one place that validates a device name and puts the models of a run on it.

steerkit runs models on ``cpu``, ``cuda`` / ``cuda:N`` and ``mps`` only. :func:`check_device_name` checks the
spelling (no torch import on the happy path); :func:`resolve_device` also checks that the device exists on
this machine. Both are cheap, so callers validate a device *before* loading any model.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from .errors import ConfigError, InvalidArgumentError

SUPPORTED = "cpu, cuda, cuda:N (N = GPU index) or mps"
_DEVICE_RE = re.compile(r"(cpu|cuda|mps)(?::(\d{1,4}))?")


def check_device_name(name) -> str | None:
    """``None``/"" (the CPU) or a device steerkit can run on (cpu, cuda, cuda:1, mps).

    Anything else raises :class:`InvalidArgumentError`, which is a ``ValueError``, so the same function
    serves as a pydantic validator and as a plain check.
    """
    if name is None or name == "":
        return None
    if type(name).__name__ == "device" and type(name).__module__.startswith("torch"):  # a torch.device
        name = str(name)
    if not isinstance(name, str):
        raise InvalidArgumentError(f"device must be a string such as 'cpu' or 'cuda:0', got {type(name).__name__}.")
    if _DEVICE_RE.fullmatch(name):
        return name
    shown = repr(name[:40] + ("…" if len(name) > 40 else ""))
    if _is_torch_device(name):
        kind = name.split(":", 1)[0]
        raise InvalidArgumentError(
            f"device {shown} is not a torch device steerkit can run models on (the {kind!r} device type is "
            f"not supported); use {SUPPORTED}.")
    raise InvalidArgumentError(f"device {shown} is not a torch device; use {SUPPORTED}.")


def _is_torch_device(name: str) -> bool:
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


DeviceName = Annotated[str | None, AfterValidator(check_device_name)]
"""A config field holding a device name (validated when the config is built, checked for presence at use)."""


def available_devices() -> list[str]:
    """The devices steerkit can use on this machine (``cpu`` always; each CUDA GPU; ``mps`` on Apple GPUs)."""
    import torch

    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def resolve_device(name) -> str:
    """The device to use (``"cpu"`` when none is given); :class:`ConfigError` when it is not usable here.

    Cheap (no model is touched): call it before loading models so that a wrong ``--device`` fails at once.
    """
    try:
        device = check_device_name(name) or "cpu"
    except InvalidArgumentError as exc:
        raise ConfigError(str(exc)) from None
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} was asked for, but torch sees no CUDA GPU "
                              f"(torch {torch.__version__}); use --device cpu. "
                              f"Available here: {', '.join(available_devices())}.")
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ConfigError(f"device {device!r} was asked for, but this machine has {count} CUDA GPU(s) "
                              f"(cuda:0 … cuda:{count - 1}). Available here: {', '.join(available_devices())}.")
    elif kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if not (mps is not None and mps.is_available()):
            raise ConfigError("device 'mps' was asked for, but this torch has no Apple GPU; use --device cpu. "
                              f"Available here: {', '.join(available_devices())}.")
        if index and int(index) != 0:
            raise ConfigError(f"device {device!r}: there is one Apple GPU, use 'mps'.")
    elif index and int(index) != 0:
        raise ConfigError(f"device {device!r}: the CPU has no index, use 'cpu'.")
    return device


def move_reward(reward, device: str):
    """Put a reward's model on ``device`` as its backend does it (``torch`` moves the model; ``onnx`` leaves it
    to onnxruntime's providers). A reward without a ``model`` stays put; one without a ``backend`` attribute
    runs on the one ``"auto"`` gives a reward without a directory (``torch``); one naming a backend nobody registers
    stays put too."""
    from .rewards.backends import DEFAULT_BACKEND, get_backend, resolve_backend

    model = getattr(reward, "model", None)
    if model is None:
        return reward
    try:
        backend = get_backend(resolve_backend(getattr(reward, "backend", DEFAULT_BACKEND)))
    except InvalidArgumentError:  # a custom reward's own notion of a backend: not ours to move
        return reward
    backend.to_device(model, device)
    return reward


def place(model, terms, device: str | None):
    """Put an LM and its steering terms' (or rewards') torch reward models on ``device``; returns the LM there."""
    device = resolve_device(device)
    for term in terms:
        move_reward(getattr(term, "reward", term), device)
    return model.to(device)

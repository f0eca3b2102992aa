"""The one seam where a reward reference becomes a decoding-time :class:`~steerkit.rewards.base.Reward`.

A reference is a registered reward name (``toxicity``), a qualified one (``steerkit-toxicity:toxicity``), a
reward-model directory, or a directory in a backend's own format (an ONNX export). A directory's kind
(sequence or token-level) is looked up in the table of reward kinds (:mod:`steerkit.rewards.kinds`), the backend
in the table of registered backends (:mod:`steerkit.rewards.backends`): it loads a directory's model and
builds its scoring cache. ``generate``, config files, ``steerkit eval``, ``steerkit export``, the CLI and
``RewardAugmentedLogitsProcessor`` users all come through :func:`load_reward`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgumentError, PluginError
from ..registry import get_registry
from .backends import DEFAULT_BACKEND, FALLBACK_BACKEND, check_backend, resolve_backend
from .base import Reward
from .kinds import kind_of
from .model import CONFIG_NAME
from .onnx.manifest import MANIFEST_NAME

CONTEXTS = ("continuation", "full")


def load_reward(reference: str, *, backend: str = DEFAULT_BACKEND, context: str = "continuation"):
    """A reward from a registered name (see ``steerkit plugins``), ``PLUGIN:NAME``, or a path to a reward-model
    directory (or an export the backend reads, such as an ONNX export for ``backend="onnx"``).

    ``backend="auto"`` (the default) runs an ONNX export on ``onnx`` and anything else on ``torch``
    (:func:`~steerkit.rewards.backends.resolve_backend`); a named backend is used as named."""
    if not isinstance(reference, str) or not reference.strip():
        raise InvalidArgumentError(f"A reward reference must be a registered name or a reward-model directory, "
                                   f"got {reference!r}.")
    check_backend(backend)
    if context not in CONTEXTS:
        raise InvalidArgumentError(f"Unknown reward context {context!r}; use one of: {', '.join(CONTEXTS)}.")
    path = Path(reference).expanduser()
    explicit_path = "/" in reference or reference.startswith(".")
    if path.is_dir() and not explicit_path and not holds_a_model(path) and _is_registered(reference):
        # a bare registered name that is also an unrelated folder in the working directory: the name wins
        return get_reward(reference, backend=backend, context=context)
    if path.is_dir() or (path.exists() and path.name == CONFIG_NAME) or explicit_path:
        return load_directory(path.parent if path.name == CONFIG_NAME else path, backend=backend, context=context)
    return get_reward(reference, backend=backend, context=context)


def holds_a_model(directory: Path) -> bool:
    """True for a reward-model directory or an export (a config or a manifest in it)."""
    return (directory / CONFIG_NAME).is_file() or (directory / MANIFEST_NAME).is_file()


def _is_registered(name: str) -> bool:
    return name in get_registry().entries["reward"] or name in get_registry().conflicts["reward"]


def load_directory(directory: Path, *, backend: str = DEFAULT_BACKEND, context: str = "continuation",
                   name: str | None = None) -> Reward:
    """The reward of a reward-model directory (or a backend's export directory) run by ``backend`` (``"auto"``: the
    backend its format asks for), as its kind (:func:`~steerkit.rewards.kinds.kind_of`) loads it: the model once
    per process while the directory's files stay as they are (a retrained directory loads again)."""
    return kind_of(directory).load_reward(Path(directory), backend=backend, context=context, name=name, cached=True)


def get_reward(name: str, *, backend: str = DEFAULT_BACKEND, context: str = "continuation"):
    """Build the registered reward ``name`` or ``PLUGIN:NAME`` (see ``HookSpecs.register_reward_models``).

    The factory receives a registered backend name, never ``"auto"`` (which runs a registered reward on
    ``torch``). Raises :class:`~steerkit.errors.PluginConflictError` if several plugins register ``name`` and none
    is picked.
    """
    backend = resolve_backend(check_backend(backend))
    entry = get_registry().get("reward", name)
    kwargs = entry.accepted({"backend": backend, "context": context})
    if "backend" not in kwargs and backend != FALLBACK_BACKEND:
        raise PluginError(f"Reward {name!r} (plugin {entry.plugin!r}) does not support the {backend!r} backend; "
                          f"use --backend {FALLBACK_BACKEND}.")
    reward = entry.build(kwargs)
    if not isinstance(reward, Reward):
        raise PluginError(f"The factory of reward {name!r} (plugin {entry.plugin!r}) returned "
                          f"{type(reward).__name__}, which lacks `name` and `start(prefixes, lm_tokenizer)`.")
    return reward

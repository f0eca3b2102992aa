"""The table of reward backends: the ways a reward model can run, looked up by name.

A backend is registered through the ``register_reward_backends`` hook (:mod:`steerkit.hookspecs`); steerkit's
own ``torch`` and ``onnx`` come from the built-in plugin :mod:`steerkit.rewards.builtin_backends`, on the same
path as any plugin. Every place that takes a backend name (``load_reward``, ``generate``, config files,
``steerkit eval``, the CLI's ``--backend``) validates it with :func:`check_backend` and uses it through
:func:`get_backend`; nothing in steerkit compares backend names.

Where no backend is named the backend is ``"auto"`` (:data:`DEFAULT_BACKEND`), which :func:`resolve_backend`
turns into a registered one per reward: the backend that :meth:`~RewardBackend.recognizes` a directory as its own
format (``onnx`` for an ONNX export), ``torch`` for anything else. A named backend is used as named.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import InvalidArgumentError, PluginError, SteerkitError
from ..registry import get_registry

#: Where no backend is named: each reward picks its own (:func:`resolve_backend`). Never given to a backend table
#: lookup or to a reward factory, which always receive a registered name.
AUTO_BACKEND = "auto"
DEFAULT_BACKEND = AUTO_BACKEND

#: What ``"auto"`` runs a reward on when no backend recognizes its directory (a reward-model directory, a
#: registered name, a model object), and the only backend a reward factory without a ``backend`` argument serves.
FALLBACK_BACKEND = "torch"


class RewardBackend(ABC):
    """How reward models run. A plugin subclasses it and registers the subclass (its factory) by name.

    Example::

        @hookimpl
        def register_reward_backends(register):
            register("mine", MyBackend, description="reward models on my runtime")
    """

    #: The name it is registered under (informational; the registration decides).
    name: str = ""

    @abstractmethod
    def load(self, directory: Path):
        """The model of a reward-model directory (or of a directory in this backend's own format): an object
        with ``config`` (:class:`~steerkit.rewards.model.RewardModelConfig`), ``tokenizer`` and
        ``encode(texts) -> {"input_ids", "attention_mask"}`` (start token, if the config has one, + text, left
        padded). Raise a :class:`~steerkit.errors.SteerkitError` that says what to pass instead for a directory it
        cannot run."""

    @abstractmethod
    def new_cache(self, model, input_ids, attention_mask):
        """The :class:`~steerkit.rewards.base.ScoringCache` of ``model`` over B rows, prefilled with
        ``input_ids`` [B, L] (``attention_mask`` [B, L], left padded). ``model`` is what :meth:`load` returned,
        or a torch :class:`~steerkit.rewards.model.RewardModel` handed to a scorer directly."""

    def to_device(self, model, device: str) -> None:
        """Put ``model`` on the torch ``device`` when the backend runs there; by default it stays where it is."""

    def recognizes(self, directory: Path) -> bool:
        """True when ``directory`` is in this backend's own format (an ONNX export for ``onnx``): the default
        backend ``"auto"`` then runs it on this backend. By default a backend claims no directory."""
        return False

    #: ``load_token(directory)``: the model of a token-level reward-model directory (kind: token, see
    #: :mod:`steerkit.rewards.kinds`), or of this backend's export of one, with the runner interface that
    #: :class:`~steerkit.rewards.token.session.TokenSession` drives. None: this backend runs no token-level models.
    #: (Each kind names the backend method that loads it; :func:`backends_with` lists the backends that have it.)
    load_token = None


_lock = threading.RLock()
_built: dict[tuple, RewardBackend] = {}


def backend_names() -> list[str]:
    """Every registered backend name, in registration order (steerkit's ``torch`` and ``onnx`` first)."""
    return list(get_registry().claims["backend"])


def backends_with(method: str) -> list[str]:
    """The registered backends that have ``method`` (``load_token``: those that run token-level reward models), in
    registration order; a name that two plugins register, or whose factory fails, is left out."""
    names = []
    for name in backend_names():
        try:
            backend = get_backend(name)
        except SteerkitError:
            continue
        if callable(getattr(backend, method, None)):
            names.append(name)
    return names


def check_backend(name) -> str:
    """``name`` if a plugin registers it (or a ``PLUGIN:NAME`` reference), or ``"auto"``; otherwise an
    :class:`~steerkit.errors.InvalidArgumentError` (a ``ValueError``, so it also serves as a pydantic validator)
    listing the registered backends."""
    if isinstance(name, str) and (name == AUTO_BACKEND or name in get_registry().claims["backend"]
                                  or ":" in name.strip(":")):
        return name
    names = backend_names()
    choices = (", ".join(map(repr, names[:-1])) + f" or {names[-1]!r}") if len(names) > 1 else ", ".join(map(repr, names))
    raise InvalidArgumentError(f"Unknown reward backend {name!r}; use {choices or '(none registered)'}, or "
                               f"{AUTO_BACKEND!r} (the default: an ONNX export runs on onnx, anything else on torch). "
                               "Plugins add backends through the register_reward_backends hook; `steerkit plugins` "
                               "lists them.")


def get_backend(name: str) -> RewardBackend:
    """The backend registered as ``name`` (or ``PLUGIN:NAME``), built once per process and registration.

    Raises :class:`~steerkit.errors.InvalidArgumentError` for a name nobody registers and
    :class:`~steerkit.errors.PluginConflictError` for a name two plugins register (until the user picks one).
    """
    entry = get_registry().get("backend", check_backend(name))
    key = (entry.plugin, entry.name, entry.factory)
    with _lock:
        backend = _built.get(key)
        if backend is None:
            backend = entry.build({})
            missing = [m for m in ("load", "new_cache", "to_device") if not callable(getattr(backend, m, None))]
            if missing:
                raise PluginError(f"The factory of backend {entry.name!r} (plugin {entry.plugin!r}) returned "
                                  f"{type(backend).__name__}, which lacks {', '.join(missing)}; subclass "
                                  "steerkit.rewards.backends.RewardBackend.")
            _built[key] = backend
    return backend


def resolve_backend(backend: str = DEFAULT_BACKEND, directory: str | Path | None = None) -> str:
    """The backend that runs a reward: ``backend`` itself when it names one (as asked: where it is used, a name
    nobody registers raises); for ``"auto"``, the first registered backend that :meth:`~RewardBackend.recognizes`
    ``directory`` (``onnx`` for an ONNX export), else :data:`FALLBACK_BACKEND` (``torch``: a reward-model directory,
    a registered name, a model object).

    The one place ``"auto"`` is decided: loaders call it before a backend or a reward factory sees the name.
    """
    if backend != AUTO_BACKEND:
        return backend
    directory = Path(directory).expanduser() if directory is not None else None
    if directory is not None and directory.is_dir():
        for name in backend_names():
            try:
                if get_backend(name).recognizes(directory):
                    return name
            except SteerkitError:  # a plugin's broken or ambiguous backend claims nothing
                continue
    return FALLBACK_BACKEND

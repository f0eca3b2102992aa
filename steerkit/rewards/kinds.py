"""The table of reward-model kinds: what a reward-model directory is, looked up, never compared by name.

A reward-model directory is of a *kind*, the ``kind`` its ``reward_config.json`` (or an ONNX export's manifest)
states. steerkit has two:

* ``sequence``: a causal reward model read after each candidate text (:mod:`.model`, :mod:`.scorer`);
* ``token``: a token-level head that scores every next token from the prefix alone (:mod:`.token_model`,
  :mod:`.token_session`).

Each is a :class:`RewardKind` record: how a directory of that kind is detected, its model class, the backend
method that loads it, the decoding-time reward that wraps it, how it is exported to ONNX, how training builds it
and what the model card says about it. Loading (:func:`steerkit.rewards.loading.load_directory`), packaged
rewards, ``steerkit train`` (and ``--assess``), model cards and ``steerkit export onnx`` look the kind up here
(:func:`kind_of` for a directory, :func:`get_kind` for a config's ``kind``). A new kind is one module (its model
and reward) plus one :func:`register_kind` call::

    register_kind(RewardKind("mine", "my-level", model="mypkg.model:MyModel", reward="mypkg.model:MyReward",
                             loader=lambda directory, backend: MyModel.load(directory)))

References to classes and functions may be ``"module:attribute"`` strings, imported when first used, so the
table stays cheap to import.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ExportError, InvalidArgumentError, RewardModelFormatError
from ..files import file_identity
from .backends import DEFAULT_BACKEND, backend_names, backends_with, check_backend, get_backend, resolve_backend
from .model_config import CONFIG_NAME
from .onnx.manifest import MANIFEST_NAME

#: The kind of a directory whose config states none (every directory written before kinds existed).
DEFAULT_KIND = "sequence"


def _resolve(reference):
    """``reference`` itself, or the object a ``"module:attribute"`` string names."""
    if isinstance(reference, str):
        module, _, attribute = reference.partition(":")
        return functools.reduce(getattr, attribute.split("."), importlib.import_module(module))
    return reference


@dataclass(frozen=True)
class RewardKind:
    """One kind of reward model. Class and function fields may be ``"module:attribute"`` strings."""

    #: the ``kind`` a reward-model config states
    name: str
    #: how messages name its models: "sequence-level", "token-level"
    label: str
    #: the torch model class: ``from_pretrained(directory)``, ``from_backbone(reference, num_layers, **options)``
    model: Any
    #: the decoding-time reward: ``reward(model, name=..., backend=..., context=...)``
    reward: Any
    #: the method of a backend (:mod:`.backends`) that loads a directory of this kind; backends without it do not
    #: run this kind
    backend_method: str = "load"
    #: ``loader(directory, backend) -> model`` instead of asking the backend table (a kind with its own runtime)
    loader: Any = None
    #: ``detect(directory) -> bool``; None: the directory's config (or export manifest) states this kind's name
    detect: Any = None
    #: ``export(model, out_dir, source_hash=, source=, opset=, overwrite=, check=) -> Path`` (ONNX); None: none
    exporter: Any = None
    #: ``export_source(reference) -> (model, reward hash, provenance)`` for ``steerkit export onnx``
    export_source: Any = None
    #: ``train_options(train_config) -> dict``: keyword arguments of ``model.from_backbone`` beyond the common ones
    train_options: Any = None
    #: ``card_method(train_config, method) -> str``: the model card's "Method" phrase; None: ``method`` as it is
    card_method: Any = None
    #: what ``describe_reward_model`` appends to a packaged model's description ("" for nothing)
    summary: str = ""

    # -- what the sites ask ----------------------------------------------------------------------
    @property
    def model_class(self) -> type:
        return _resolve(self.model)

    @property
    def reward_class(self) -> type:
        return _resolve(self.reward)

    @property
    def model_path(self) -> str:
        """The model class's dotted name, for messages."""
        cls = self.model_class
        return f"{cls.__module__}.{cls.__qualname__}"

    def detects(self, directory) -> bool:
        """True when ``directory`` is a reward-model directory (or an export) of this kind."""
        if self.detect is not None:
            return bool(_resolve(self.detect)(Path(directory)))
        return declared_kind(directory) == self.name

    def backends(self) -> list[str]:
        """The registered backends that run this kind (all of them for a kind with its own ``loader``)."""
        return backend_names() if self.loader is not None else backends_with(self.backend_method)

    def load_model(self, directory, backend: str = DEFAULT_BACKEND, *, cached: bool = False):
        """The model of ``directory`` run by ``backend`` (``"auto"``: the backend its format asks for); ``cached``:
        once per process, kind, backend and directory as its files are (:func:`_cached_model`)."""
        directory = Path(directory)
        backend = resolve_backend(backend, directory)
        if cached:
            return _cached_model(self, str(directory.resolve()), backend)
        if self.loader is not None:
            return _resolve(self.loader)(directory, check_backend(backend))
        return self._backend_loader(backend)(directory)

    def _backend_loader(self, backend: str) -> Callable:
        """The backend's method that loads this kind; a backend without one (or an unknown name) raises
        :class:`InvalidArgumentError` naming the backends that run this kind."""
        try:
            check_backend(backend)
        except InvalidArgumentError:
            loader, problem = None, "Unknown reward backend {backend!r}: {label} reward models (kind: {kind}) run on "
        else:  # a conflict between plugins over the name raises here, as everywhere a backend is used
            loader = getattr(get_backend(backend), self.backend_method, None)
            problem = "Backend {backend!r} does not run {label} reward models (kind: {kind}); use "
        if not callable(loader):
            names = " or ".join(map(repr, backends_with(self.backend_method))) or "(no registered backend)"
            raise InvalidArgumentError(problem.format(backend=backend, label=self.label, kind=self.name) + names + ".")
        return loader

    def load_reward(self, directory, *, backend: str = DEFAULT_BACKEND, context: str = "continuation",
                    name: str | None = None, cached: bool = False):
        """The decoding-time reward of ``directory`` run by ``backend`` (``"auto"``: the backend its format asks for)."""
        backend = resolve_backend(backend, directory)
        model = self.load_model(directory, backend, cached=cached)
        return self.reward_class(model, name=name or model.config.name, backend=backend, context=context)

    def new_model(self, config):
        """A fresh model for a training config (:class:`~steerkit.training.config.TrainConfig`)."""
        options = _resolve(self.train_options)(config) if self.train_options is not None else {}
        return self.model_class.from_backbone(config.backbone, config.num_layers, name=config.name,
                                              attribute=config.attribute, max_length=config.max_length, **options)

    def source(self, reference: str):
        """(model, reward hash, provenance) of ``reference`` for export."""
        if self.export_source is None:
            raise ExportError(f"{self.label} reward models (kind: {self.name}) cannot be exported.")
        return _resolve(self.export_source)(reference)

    def export(self, model, out_dir, **options) -> Path:
        """Export ``model`` to ONNX in ``out_dir`` (see :func:`~steerkit.rewards.onnx.export.export_onnx`)."""
        if self.exporter is None:
            raise ExportError(f"{self.label} reward models (kind: {self.name}) cannot be exported.")
        return _resolve(self.exporter)(model, out_dir, **options)

    def describe_method(self, config, method: str) -> str:
        """The model card's phrase for how a model of this kind was trained (``method``: the method's phrase)."""
        return _resolve(self.card_method)(config, method) if self.card_method is not None else method


#: loaded models kept for :func:`_cached_model` (the least recently used goes first)
MAX_CACHED_MODELS = 16
_models: OrderedDict[tuple, tuple[tuple, Any]] = OrderedDict()
_models_lock = threading.Lock()


def _cached_model(kind: RewardKind, directory: str, backend: str):
    """``kind.load_model(directory, backend)``, loaded once while the directory's files stay as they are: a
    directory whose files changed since (a model trained or saved into it again) loads again and replaces the
    entry. Every ``generate`` with a reward-model directory comes here, so a loop of calls loads it once."""
    key = (kind.name, directory, backend)
    stamp = _directory_stamp(Path(directory))
    with _models_lock:
        entry = _models.get(key)
        if entry is not None and stamp is not None and entry[0] == stamp:
            _models.move_to_end(key)
            return entry[1]
    model = kind.load_model(directory, backend)  # outside the lock: loading takes seconds
    if stamp is not None:
        with _models_lock:
            _models[key] = (stamp, model)
            _models.move_to_end(key)
            while len(_models) > MAX_CACHED_MODELS:
                _models.popitem(last=False)
    return model


def clear_model_cache(kind: str | None = None) -> None:
    """Forget the models :func:`_cached_model` holds (of kind ``kind`` only, when given): the next load of each
    directory reads it from disk."""
    with _models_lock:
        for key in [key for key in _models if kind is None or key[0] == kind]:
            del _models[key]


def _directory_stamp(directory: Path, limit: int = 1000) -> tuple | None:
    """Each file under ``directory`` with its :func:`~steerkit.files.file_identity` (changed by any write or
    replacement); None (not cached) where it cannot be read or holds more than ``limit`` files (a reward-model
    directory or an export holds a handful)."""
    try:
        files = []
        for p in directory.rglob("*"):  # stops at the limit: a large folder is not walked on every load
            if p.is_file():
                files.append(p)
                if len(files) > limit:
                    return None
        return tuple(sorted((str(p.relative_to(directory)), file_identity(p)) for p in files))
    except OSError:
        return None


# -- the table ------------------------------------------------------------------------------------------
_lock = threading.RLock()
_KINDS: dict[str, RewardKind] = {}


def register_kind(kind: RewardKind) -> RewardKind:
    """Add ``kind`` to the table; a name already registered raises :class:`InvalidArgumentError`."""
    with _lock:
        if kind.name in _KINDS:
            raise InvalidArgumentError(f"Reward kind {kind.name!r} is already registered.")
        _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove kind ``name`` from the table (no error if it is not there)."""
    with _lock:
        _KINDS.pop(name, None)
    clear_model_cache(name)


def kind_names() -> list[str]:
    """Every registered kind, in registration order (``sequence`` and ``token`` first)."""
    return list(_KINDS)


def find_kind(name) -> RewardKind | None:
    """The kind registered as ``name``, or None."""
    return _KINDS.get(name) if isinstance(name, str) else None


def get_kind(name: str) -> RewardKind:
    """The kind registered as ``name``; an unknown one raises :class:`InvalidArgumentError` listing the kinds."""
    kind = find_kind(name)
    if kind is None:
        raise InvalidArgumentError(f"Unknown reward-model kind {name!r}; registered: {', '.join(kind_names())}.")
    return kind


def declared_kind(directory) -> str | None:
    """The ``kind`` a reward-model directory's config (or an ONNX export's manifest) states, ``sequence`` when
    it states none; None when it has neither file, or an unreadable one (the loaders then report it)."""
    directory = Path(directory)
    for name, key in ((CONFIG_NAME, None), (MANIFEST_NAME, "reward_config")):
        path = directory / name
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            config = data.get(key) if key and isinstance(data, dict) else data
            kind = config.get("kind", DEFAULT_KIND) if isinstance(config, dict) else None
            return kind if isinstance(kind, str) else None
    return None


def kind_of(directory) -> RewardKind:
    """The kind of a reward-model directory (or of an export of one): the latest registered kind that detects
    it; the default kind for a directory that states none (its loader says what is missing). A directory that
    states a kind nobody registers raises :class:`~steerkit.errors.RewardModelFormatError`."""
    with _lock:
        kinds = list(_KINDS.values())
    for kind in reversed(kinds):
        if kind.detects(directory):
            return kind
    declared = declared_kind(directory)
    if declared is None:
        return get_kind(DEFAULT_KIND)
    raise RewardModelFormatError(f"{directory} is a reward model of kind {declared!r}, which this steerkit does not "
                                 f"know (registered kinds: {', '.join(kind_names())}); is a plugin missing?")


def source_directory(reference: str) -> tuple[Path | None, dict]:
    """The directory a reward reference names (a path, its config file, or a registered reward whose factory has
    a ``directory``: :func:`~steerkit.rewards.packaged.reward_model_factory`), with its provenance; (None, {})
    when it names none."""
    path = Path(reference).expanduser()
    if path.name == CONFIG_NAME:
        path = path.parent
    if path.is_dir():
        return path, {"kind": "directory"}
    try:
        from ..registry import get_registry

        directory = getattr(get_registry().get("reward", reference).factory, "directory", None)
    except Exception:  # not registered: the default kind's export_source raises the helpful error
        return None, {}
    if directory is None or not Path(directory).is_dir():
        return None, {}
    return Path(directory), {"kind": "registered", "name": reference}


def kind_of_reference(reference: str) -> RewardKind:
    """The kind of the directory a reward reference names (:func:`source_directory`); the default kind when it
    names none (a registered reward built in code, or an unknown name: the default kind reports it)."""
    directory, _ = source_directory(reference)
    return get_kind(DEFAULT_KIND) if directory is None else kind_of(directory)


# -- steerkit's kinds -------------------------------------------------------------------------------------
def _token_options(config) -> dict:
    return {"head": config.token_head}


def _token_card_method(config, method: str) -> str:
    """A token-level head names its parametrisation (and its teacher, when distilled)."""
    rank = config.token_head.rank
    return method.replace("scalar head", "token-level head") + (
        f" (ρ(prefix, v) = σ(⟨W h, e_v⟩{' + b·h' if config.token_head.baseline else ''} + c), W "
        f"{'d×d' if rank is None else f'of rank {rank}'}, e_v the frozen output embeddings"
        + (f"; distilled from `{config.distill.teacher}`" if getattr(config, "distill", None) else "") + ")")


SEQUENCE = register_kind(RewardKind(
    "sequence", "sequence-level", model="steerkit.rewards.model:RewardModel",
    reward="steerkit.rewards.sequence.scorer:RewardModelScorer", backend_method="load",
    exporter="steerkit.rewards.onnx.export:export_onnx", export_source="steerkit.rewards.onnx.export:export_source"))

TOKEN = register_kind(RewardKind(
    "token", "token-level", model="steerkit.rewards.token.model:TokenRewardModel",
    reward="steerkit.rewards.token.session:TokenReward", backend_method="load_token",
    exporter="steerkit.rewards.onnx.token:export_token_onnx",
    export_source="steerkit.rewards.onnx.token:token_export_source",
    train_options=_token_options, card_method=_token_card_method, summary="token-level head"))

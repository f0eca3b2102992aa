"""The plugin registry: pluggy hookspecs, one plugin manager, and the lookups the rest of steerkit uses.

Plugins are Python packages that declare an entry point in the ``steerkit`` group::

    [project.entry-points.steerkit]
    example = "steerkit_example"

and implement one or more of the hooks below with :data:`hookimpl` (``from steerkit import hookimpl``).
The rewards shipped with steerkit (``toxicity``, ``sentiment``) are separate packages under ``plugins/``
that register on exactly this public path. ``docs/plugins.md`` is the tutorial; the hookspec docstrings
below are the reference.

Loading is lazy (the first lookup loads every plugin) and isolated: a plugin that fails to import,
implements a misspelled hook (caught by pluggy's ``check_pending``) or raises inside its hook is
recorded with its error, skipped, and reported by ``steerkit plugins``; every other plugin still works.

``STEERKIT_PLUGINS=a,b`` loads only the named plugins (entry-point or distribution names);
``STEERKIT_PLUGINS=`` (set but empty) loads none.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pluggy

from .errors import PluginError, SteerkitError

GROUP = "steerkit"
ENV_ALLOWLIST = "STEERKIT_PLUGINS"

hookspec = pluggy.HookspecMarker(GROUP)
hookimpl = pluggy.HookimplMarker(GROUP)

#: Modules inside steerkit registered as plugins on the same path as installed packages.
BUILTIN_PLUGINS: tuple[str, ...] = ("steerkit.evaluation.builtin_scorers",)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class HookSpecs:
    """The hooks a steerkit plugin may implement. Each docstring is that hook's reference documentation."""

    @hookspec
    def register_reward_models(self, register):
        """Register rewards that steer decoding: ``register(name, factory, description="")``.

        ``name`` is what users pass to ``--reward NAME=BETA``, ``generate(rewards={NAME: beta})`` and
        ``SteeringConfig`` files: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.

        ``factory`` is called when the reward is used, never at registration, so registering stays cheap.
        It is called with the keyword arguments ``backend`` (``"torch"`` or ``"onnx"``) and ``context``
        (``"continuation"`` scores only the generated text, ``"full"`` the prompt plus generated text),
        but only those it declares (or all of them if it takes ``**kwargs``); a factory that does not
        declare ``backend`` only supports ``"torch"``. It returns a :class:`steerkit.rewards.base.Reward`:
        an object with a ``name`` and ``start(prefixes, lm_tokenizer) -> RewardSession``, whose session
        has ``score(candidates [B, k] LM token ids) -> [B, k]`` rewards in [0, 1] and
        ``commit(tokens [B])``. :func:`reward_model_factory` builds a factory for a trained reward-model
        directory shipped inside a package.

        ``description`` is one line shown by ``steerkit plugins``.
        """

    @hookspec
    def register_scorers(self, register):
        """Register evaluation scorers: ``register(name, factory, description="")``.

        Scorers measure finished texts in ``steerkit eval`` (toxicity, sentiment, fluency...), independently
        of the reward models used for steering. ``name`` follows the same rules as reward names.
        ``factory(**options)`` is called when the scorer is used, with the options the user passed to
        :func:`get_scorer`, and returns the scorer: an object with a ``name`` and
        ``score(texts: list[str]) -> list[float]``.

        ``description`` is one line shown by ``steerkit plugins``.
        """


@dataclass(frozen=True)
class Registration:
    """One reward or scorer registered by a plugin."""

    kind: str  # "reward" | "scorer"
    name: str
    factory: Callable[..., Any]
    description: str
    plugin: str


@dataclass
class PluginInfo:
    """What ``steerkit plugins`` shows for one plugin."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    hooks: list[str] = field(default_factory=list)
    rewards: list[str] = field(default_factory=list)
    scorers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.module is not None

    def to_dict(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "module": self.module, "loaded": self.loaded, "hooks": self.hooks, "rewards": self.rewards,
                "scorers": self.scorers, "errors": self.errors}


_KINDS = {"reward": "register_reward_models", "scorer": "register_scorers"}


class Registry:
    """One pluggy ``PluginManager`` plus what its plugins registered. Use :func:`get_registry`."""

    def __init__(self, *, entry_points: bool = True, allowlist: str | None = None):
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(HookSpecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.entries: dict[str, dict[str, Registration]] = {kind: {} for kind in _KINDS}
        for module in BUILTIN_PLUGINS:
            self._register_module(module, lambda module=module: importlib.import_module(module))
        if entry_points:
            self._load_entry_points(allowlist)
        self.collect()

    # -- loading --------------------------------------------------------------------------------
    def _load_entry_points(self, allowlist: str | None) -> None:
        found: dict[str, tuple[importlib.metadata.EntryPoint, importlib.metadata.Distribution]] = {}
        duplicates: dict[str, list[str]] = {}
        for dist in importlib.metadata.distributions():
            for ep in dist.entry_points:
                if ep.group != GROUP:
                    continue
                if ep.name in found:
                    if _dist_name(found[ep.name][1]) != _dist_name(dist):
                        duplicates.setdefault(ep.name, []).append(_dist_name(dist))
                    continue
                found[ep.name] = (ep, dist)
        allowed = None if allowlist is None else {_norm(n) for n in allowlist.split(",") if n.strip()}
        for name in sorted(found):
            ep, dist = found[name]
            info = PluginInfo(name, _dist_name(dist), dist.version)
            if allowed is not None and _norm(name) not in allowed and _norm(info.distribution or "") not in allowed:
                self.pm.set_blocked(name)
                continue
            self.plugins[name] = info
            for other in duplicates.get(name, []):
                info.errors.append(f"another installed package, {other}, also declares the entry point "
                                   f"{name!r}; it was ignored. Uninstall one of them.")
            self._register(info, lambda: self.pm.load_setuptools_entrypoints(GROUP, name=name))
        if allowed is not None:
            known = {_norm(n) for n in found} | {_norm(_dist_name(d)) for _, d in found.values()}
            for missing in sorted(allowed - known):
                self.plugins[missing] = PluginInfo(missing, errors=[
                    f"{ENV_ALLOWLIST} names {missing!r} but no installed package declares a {GROUP!r} entry point "
                    "of that name (see `pip list` and the package's pyproject.toml)."])

    def _register_module(self, name: str, load: Callable[[], Any]) -> None:
        info = PluginInfo(name, "steerkit", _steerkit_version())

        def register():
            self.pm.register(load(), name=name)

        self.plugins[name] = info
        self._register(info, register)

    def _register(self, info: PluginInfo, register: Callable[[], Any]) -> None:
        """Import and register one plugin; on any failure record the error and leave it out."""
        try:
            register()
            plugin = self.pm.get_plugin(info.name)
            if plugin is None:
                raise PluginError("the entry point did not resolve to a module or object")
            self.pm.check_pending()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must never break the others
            if self.pm.get_plugin(info.name) is not None:
                self.pm.unregister(name=info.name)
            info.errors.append(f"failed to load: {_describe(exc)}")
            return
        info.module = getattr(plugin, "__name__", type(plugin).__name__)
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])

    def register_plugin(self, plugin: Any, name: str | None = None) -> PluginInfo:
        """Register an in-process plugin (a module or object with ``@hookimpl`` functions)."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in self.plugins and self.pm.get_plugin(name) is not None:
            raise PluginError(f"A plugin named {name!r} is already registered; pass another name.")
        info = PluginInfo(name, module=None)
        self.plugins[name] = info

        def register():
            self.pm.register(plugin, name=name)

        self._register(info, register)
        self.collect()
        if info.errors:
            raise PluginError(f"Plugin {name!r} {info.errors[0]}")
        return info

    def unregister_plugin(self, name: str) -> None:
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        self.plugins.pop(name, None)
        self.collect()

    # -- hooks ----------------------------------------------------------------------------------
    def collect(self) -> None:
        """Call every registration hook, one plugin at a time, so that one failing plugin spoils nothing else."""
        for info in self.plugins.values():
            info.rewards, info.scorers = [], []
            info.errors = [e for e in info.errors if not e.startswith(tuple(f"{h}:" for h in _KINDS.values()))]
        for kind, hook_name in _KINDS.items():
            entries: dict[str, Registration] = {}
            hook = getattr(self.pm.hook, hook_name)
            # pluggy calls hooks in reverse registration order; registration order is the one users expect
            for impl in hook.get_hookimpls():
                info = self.plugins.setdefault(impl.plugin_name, PluginInfo(impl.plugin_name))
                added: list[Registration] = []

                def register(name, factory, description="", *, _kind=kind, _plugin=impl.plugin_name, _added=added):
                    _added.append(_validate(_kind, name, factory, description, _plugin))

                try:
                    impl.function(**{arg: register for arg in impl.argnames})
                except Exception as exc:  # noqa: BLE001
                    info.errors.append(f"{hook_name}: {_describe(exc)} (nothing it registered is used)")
                    continue
                for reg in added:
                    if reg.name in entries:
                        first = entries[reg.name].plugin
                        info.errors.append(f"{hook_name}: {kind} {reg.name!r} is already registered by plugin "
                                           f"{first!r}; this one is ignored.")
                        continue
                    entries[reg.name] = reg
                    getattr(info, f"{kind}s").append(reg.name)
            self.entries[kind] = entries

    # -- lookups --------------------------------------------------------------------------------
    def get(self, kind: str, name: str) -> Registration:
        entries = self.entries[kind]
        if name in entries:
            return entries[name]
        available = sorted(entries)
        lines = [f"Unknown {kind} {name!r}."]
        close = difflib.get_close_matches(name, available, n=1)
        if close:
            lines[0] += f" Did you mean {close[0]!r}?"
        lines.append(f"Registered {kind}s: {', '.join(available) if available else '(none)'}.")
        if kind == "reward":
            lines.append("A reward can also be the path to a trained reward-model directory (e.g. ./runs/toxicity).")
        broken = [f"  {p.name}: {p.errors[0]}" for p in self.plugins.values() if p.errors]
        if broken:
            lines += ["Plugins with errors:", *broken]
        lines.append("Run `steerkit plugins` to see installed plugins; install reward plugins with "
                     "`pip install ./plugins/steerkit-toxicity` or any package that registers on the 'steerkit' "
                     "entry-point group.")
        if os.environ.get(ENV_ALLOWLIST) is not None:
            lines.append(f"Only plugins listed in {ENV_ALLOWLIST}={os.environ[ENV_ALLOWLIST]!r} were loaded.")
        raise PluginError("\n".join(lines))

    @property
    def errors(self) -> dict[str, list[str]]:
        return {name: info.errors for name, info in self.plugins.items() if info.errors}


def _validate(kind: str, name, factory, description, plugin: str) -> Registration:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginError(f"invalid {kind} name {name!r}: use letters, digits, '.', '_' and '-', starting with a "
                          "letter or digit")
    if not callable(factory):
        raise PluginError(f"the factory registered for {kind} {name!r} is not callable ({type(factory).__name__})")
    if not isinstance(description, str):
        raise PluginError(f"the description of {kind} {name!r} must be a string")
    return Registration(kind, name, factory, " ".join(description.split()), plugin)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, pluggy.PluginValidationError):  # a misspelled hook or a wrong hook signature
        first = re.sub(r" in plugin <.*?>", "", first).replace("\n", " ")
        hooks = ", ".join(n for n in dir(HookSpecs) if n.startswith("register_"))
        return f"{first} (steerkit hooks: {hooks})"
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _dist_name(dist) -> str:
    return dist.metadata["Name"] or "?"


@functools.lru_cache(maxsize=1)
def _steerkit_version() -> str:
    try:
        return importlib.metadata.version("steerkit")
    except importlib.metadata.PackageNotFoundError:
        return "0"


# -- module-level API ------------------------------------------------------------------------------
_lock = threading.RLock()
_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loading installed plugins on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry(allowlist=os.environ.get(ENV_ALLOWLIST))
        return _registry


def reset() -> None:
    """Forget loaded plugins; the next lookup rescans installed packages (after ``pip install``, in tests)."""
    global _registry
    with _lock:
        _registry = None


def get_plugin_manager() -> pluggy.PluginManager:
    return get_registry().pm


def register_plugin(plugin: Any, name: str | None = None) -> PluginInfo:
    """Register an in-process plugin (a module or object with ``@hookimpl`` functions), e.g. in a notebook."""
    return get_registry().register_plugin(plugin, name)


def unregister_plugin(name: str) -> None:
    get_registry().unregister_plugin(name)


def list_plugins() -> list[PluginInfo]:
    return list(get_registry().plugins.values())


def list_rewards() -> list[Registration]:
    return sorted(get_registry().entries["reward"].values(), key=lambda r: r.name)


def list_scorers() -> list[Registration]:
    return sorted(get_registry().entries["scorer"].values(), key=lambda r: r.name)


def get_reward(name: str, *, backend: str = "torch", context: str = "continuation"):
    """Build the registered reward ``name`` (see :meth:`HookSpecs.register_reward_models`)."""
    from .rewards.base import Reward

    entry = get_registry().get("reward", name)
    kwargs = _accepted(entry.factory, {"backend": backend, "context": context})
    if "backend" not in kwargs and backend != "torch":
        raise PluginError(f"Reward {name!r} (plugin {entry.plugin!r}) does not support the {backend!r} backend; "
                          "use --backend torch.")
    reward = _build(entry, kwargs)
    if not isinstance(reward, Reward):
        raise PluginError(f"The factory of reward {name!r} (plugin {entry.plugin!r}) returned "
                          f"{type(reward).__name__}, which lacks `name` and `start(prefixes, lm_tokenizer)`.")
    return reward


def get_scorer(name: str, **options):
    """Build the registered evaluation scorer ``name`` with ``options`` (see :meth:`HookSpecs.register_scorers`)."""
    entry = get_registry().get("scorer", name)
    scorer = _build(entry, options)
    if not callable(getattr(scorer, "score", None)):
        raise PluginError(f"The factory of scorer {name!r} (plugin {entry.plugin!r}) returned "
                          f"{type(scorer).__name__}, which has no `score(texts)` method.")
    return scorer


def _accepted(factory: Callable, kwargs: dict) -> dict:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in kwargs.items() if k in names}


def _build(entry: Registration, kwargs: dict):
    try:
        return entry.factory(**kwargs)
    except SteerkitError:
        raise
    except Exception as exc:
        raise PluginError(f"{entry.kind.capitalize()} {entry.name!r} from plugin {entry.plugin!r} failed to load: "
                          f"{_describe(exc)}") from exc


# -- helpers for plugin authors --------------------------------------------------------------------
def reward_model_factory(directory: str | os.PathLike, *, name: str, package: str | None = None):
    """A ``register_reward_models`` factory for a trained reward-model directory shipped in a package.

    The directory is checked when the reward is used, not at registration: if its files are missing the
    factory raises :class:`~steerkit.errors.PluginError` saying so. The model is loaded once per process;
    each call wraps it in a fresh :class:`~steerkit.rewards.scorer.RewardModelScorer`.
    """
    directory = Path(directory)

    def factory(backend: str = "torch", context: str = "continuation"):
        from .rewards.model import CONFIG_NAME
        from .rewards.scorer import RewardModelScorer

        if not (directory / CONFIG_NAME).is_file():
            where = f"the {package} package" if package else "this plugin"
            raise PluginError(
                f"Reward {name!r}: the model files are missing from {where} ({directory} has no {CONFIG_NAME}). "
                "Train it (`steerkit train ...`), copy the reward-model directory there, and reinstall the "
                "package; or pass a reward-model directory path instead of the name."
            )
        if backend == "onnx":  # the ONNX path needs no torch weights: it checks files by hash
            from .rewards.loading import load_reward

            scorer = load_reward(str(directory), backend="onnx", context=context)
            scorer.name = name
            return scorer
        return RewardModelScorer(_load_reward_model(str(directory.resolve())), name=name, backend=backend,
                                 context=context)

    factory.directory = directory
    return factory


def describe_reward_model(directory: str | os.PathLike, attribute: str) -> str:
    """A one-line description of a reward-model directory for ``register(..., description=...)``.

    Reads only its small JSON config, so registration stays cheap; ``attribute`` is used when the config does
    not state one, or when the files are missing or unreadable (the description then says so).
    """
    from .rewards.model import CONFIG_NAME

    config = Path(directory) / CONFIG_NAME
    if not config.is_file():
        return f"{attribute} (model files missing from {directory})"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{attribute} (unreadable {config})"
    return (f"{data.get('attribute') or attribute} ({data.get('backbone', '?')}, {data.get('num_layers')} layers, "
            f"{data.get('method', '?')})")


@functools.lru_cache(maxsize=8)
def _load_reward_model(directory: str):
    from .rewards.model import RewardModel

    return RewardModel.from_pretrained(directory)

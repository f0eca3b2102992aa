"""The plugin registry: pluggy hookspecs, one plugin manager, and the lookups the rest of steerkit uses.

Plugins are Python packages that declare an entry point in the ``steerkit`` group::

    [project.entry-points.steerkit]
    example = "steerkit_example"

and implement one or more of the hooks of :class:`~steerkit.hookspecs.HookSpecs` with :data:`hookimpl`
(``from steerkit import hookimpl``).
The rewards shipped with steerkit (``toxicity``, ``sentiment``) are separate packages under ``plugins/``
that register on exactly this public path. ``docs/plugins.md`` is the tutorial; the hookspec docstrings
(:mod:`steerkit.hookspecs`) are the reference. This module loads plugins and answers lookups of what they
registered; it builds nothing (rewards are built by :mod:`steerkit.rewards.loading`).

Loading is lazy (the first lookup loads every plugin) and isolated: a plugin that fails to import,
implements a misspelled hook (caught by pluggy's ``check_pending``) or raises inside its hook is
recorded with its error, skipped, and reported by ``steerkit plugins``; every other plugin still works.
Before loading any installed plugin the registry refuses a ``steerkit`` package shared with another
distribution, such as the unrelated PyPI project ``steerkit`` (:func:`steerkit.provenance.check_distribution`).

``STEERKIT_PLUGINS=a,b`` loads only the named plugins (entry-point or distribution names);
``STEERKIT_PLUGINS=`` (set but empty) loads none.

A reward, scorer or backend name registered by two plugins is never resolved by load order (see
:mod:`steerkit.plugin_conflicts`): looking it up raises
:class:`~steerkit.errors.PluginConflictError` naming both, until the user picks one with a qualified
reference ``PLUGIN:NAME`` (entry-point or distribution name, e.g. ``steerkit-toxicity:toxicity``), with
``STEERKIT_PLUGINS``, or with ``STEERKIT_PREFER=NAME=PLUGIN[,NAME=PLUGIN...]``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

from .errors import PluginError
from .hookspecs import (  # noqa: F401 - GROUP, hookspec, hookimpl and HookSpecs are this module's public API too
    ENV_ALLOWLIST, ENV_PREFER, GROUP, KINDS, HookSpecs, Registration, describe_error, hookimpl, hookspec,
)
from .plugin_conflicts import NAME, Conflict, ConflictResolution, norm, parse_preferences
from .provenance import DISTRIBUTION, check_distribution

#: Modules inside steerkit registered as plugins on the same path as installed packages.
BUILTIN_PLUGINS: tuple[str, ...] = ("steerkit.evaluation.builtin_scorers", "steerkit.rewards.builtin_backends",
                                     "steerkit.rewards.llama_cpp.backend")


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
    backends: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: "entry-point" (an installed package), "builtin" (inside steerkit) or "in-process" (:func:`register_plugin`)
    source: str = "entry-point"
    #: one line per reward/scorer/backend name this plugin shares with another plugin (see :class:`Conflict`)
    conflicts: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.module is not None

    def to_dict(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "module": self.module, "loaded": self.loaded, "source": self.source, "hooks": self.hooks,
                "rewards": self.rewards, "scorers": self.scorers, "backends": self.backends, "errors": self.errors,
                "conflicts": self.conflicts}


class Registry(ConflictResolution):
    """One pluggy ``PluginManager`` plus what its plugins registered. Use :func:`get_registry`.

    ``claims[kind][name]`` lists every registration of a name, in load order; ``entries[kind][name]`` is what a
    bare-name lookup returns (names with one provider, and shared names a preference resolves);
    ``conflicts[kind][name]`` describes every name shared by two or more plugins, resolved or not.
    """

    def __init__(self, *, entry_points: bool = True, allowlist: str | None = None,
                 prefer: str | dict[str, str] | None = None):
        if entry_points:
            check_distribution()  # ForeignDistributionError: another distribution shares the steerkit package
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(HookSpecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.blocked: dict[str, str] = {}  # entry-point name -> distribution, left out by the allowlist
        self.claims: dict[str, dict[str, list[Registration]]] = {kind: {} for kind in KINDS}
        self.entries: dict[str, dict[str, Registration]] = {kind: {} for kind in KINDS}
        self.conflicts: dict[str, dict[str, Conflict]] = {kind: {} for kind in KINDS}
        self._unmet: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
        self.prefer, self.prefer_errors = parse_preferences(prefer)
        for module in BUILTIN_PLUGINS:
            self._register_module(module, lambda module=module: importlib.import_module(module))
        if entry_points:
            self._load_entry_points(allowlist)
        self.collect()

    # -- loading --------------------------------------------------------------------------------
    def _load_entry_points(self, allowlist: str | None) -> None:
        found: dict[str, tuple[importlib.metadata.EntryPoint, importlib.metadata.Distribution]] = {}
        for dist in importlib.metadata.distributions():
            for ep in dist.entry_points:
                if ep.group != GROUP:
                    continue
                name = ep.name
                if name in found:
                    if _dist_name(found[name][1]) == _dist_name(dist):
                        continue  # the same package twice on sys.path: the first copy is the one Python imports
                    # another package declares the same entry-point name: load it too, under a distinct plugin
                    # name, so that what both register is reported as a conflict instead of one vanishing
                    name = f"{ep.name}@{_dist_name(dist)}"
                    if name in found:
                        continue
                found[name] = (ep, dist)
        allowed = None if allowlist is None else {norm(n) for n in allowlist.split(",") if n.strip()}
        for name in sorted(found):
            ep, dist = found[name]
            info = PluginInfo(name, _dist_name(dist), dist.version)
            # a plugin renamed NAME@DIST (a clashing entry-point name) is allowed by that name or its distribution
            keys = {norm(name), norm(info.distribution or "")} | ({norm(ep.name)} if name == ep.name else set())
            if allowed is not None and not keys & allowed:
                self.pm.set_blocked(name)
                self.blocked[name] = info.distribution or ""
                continue
            self.plugins[name] = info
            if name != ep.name:
                info.errors.append(f"the package {info.distribution} declares the entry point {ep.name!r}, like the "
                                   f"package {_dist_name(found[ep.name][1])}; it is loaded as plugin {name!r}. "
                                   "Uninstall one of them if you did not mean to install both.")
            self._register(info, lambda ep=ep, name=name: self.pm.register(ep.load(), name=name))
        if allowed is not None:
            known = ({norm(n) for n in found} | {norm(ep.name) for ep, _ in found.values()}
                     | {norm(_dist_name(d)) for _, d in found.values()})
            for missing in sorted(allowed - known):
                self.plugins[missing] = PluginInfo(missing, source="allowlist", errors=[
                    f"{ENV_ALLOWLIST} names {missing!r} but no installed package declares a {GROUP!r} entry point "
                    "of that name (see `pip list` and the package's pyproject.toml)."])

    def _register_module(self, name: str, load: Callable[[], Any]) -> None:
        info = PluginInfo(name, DISTRIBUTION, _steerkit_version(), source="builtin")

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
            info.errors.append(f"failed to load: {describe_error(exc)}")
            return
        info.module = getattr(plugin, "__name__", type(plugin).__name__)
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])

    def register_plugin(self, plugin: Any, name: str | None = None) -> PluginInfo:
        """Register an in-process plugin (a module or object with ``@hookimpl`` functions).

        A name it shares with another plugin is not an error here; looking that name up is, until the user picks
        one (:class:`Conflict`). ``info.conflicts`` lists such names.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in self.plugins and self.pm.get_plugin(name) is not None:
            raise PluginError(f"A plugin named {name!r} is already registered; pass another name.")
        if ":" in name or "/" in name:
            raise PluginError(f"Plugin name {name!r} must not contain ':' or '/' (they separate PLUGIN:NAME "
                              "references and paths); pass another name.")
        info = PluginInfo(name, module=None, source="in-process")
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

    def set_preference(self, name: str, plugin: str) -> None:
        """Make the bare name ``name`` mean ``plugin``'s registration (entry-point or distribution name), like
        ``STEERKIT_PREFER=name=plugin``; lasts until :func:`reset`."""
        if not isinstance(name, str) or not NAME.match(name) or not isinstance(plugin, str) or not plugin.strip():
            raise PluginError(f"A preference needs a reward/scorer name and a plugin name, got {name!r} and {plugin!r}.")
        self.prefer[name] = plugin.strip()
        self.collect()

    # -- hooks ----------------------------------------------------------------------------------
    def collect(self) -> None:
        """Call every registration hook, one plugin at a time, so that one failing plugin spoils nothing else;
        then decide what each name resolves to."""
        for info in self.plugins.values():
            info.rewards, info.scorers, info.backends, info.conflicts = [], [], [], []
            info.errors = [e for e in info.errors if not e.startswith(tuple(f"{h}:" for h in KINDS.values()))]
        order: list[tuple[str, list[Registration]]] = []  # (plugin, what it registered) in registration order
        for kind, hook_name in KINDS.items():
            claims: dict[str, list[Registration]] = {}
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
                    info.errors.append(f"{hook_name}: {describe_error(exc)} (nothing it registered is used)")
                    continue
                kept: list[Registration] = []
                for reg in added:
                    if any(k.name == reg.name for k in kept):
                        info.errors.append(f"{hook_name}: {kind} {reg.name!r} is registered twice by this plugin; "
                                           "the first registration is used.")
                        continue
                    kept.append(reg)
                    claims.setdefault(reg.name, []).append(reg)
                order.append((impl.plugin_name, kept))
            self.claims[kind] = claims
        for kind in KINDS:
            self._resolve(kind)
        for plugin, regs in order:
            info = self.plugins[plugin]
            for reg in regs:
                if self.entries[reg.kind].get(reg.name) is reg:
                    getattr(info, f"{reg.kind}s").append(reg.name)
                conflict = self.conflicts[reg.kind].get(reg.name)
                if conflict is not None:
                    info.conflicts.append(self._conflict_line(conflict, reg))

    @property
    def errors(self) -> dict[str, list[str]]:
        return {name: info.errors for name, info in self.plugins.items() if info.errors}


def _validate(kind: str, name, factory, description, plugin: str) -> Registration:
    if not isinstance(name, str) or not NAME.match(name):
        raise PluginError(f"invalid {kind} name {name!r}: use letters, digits, '.', '_' and '-', starting with a "
                          "letter or digit")
    if not callable(factory):
        raise PluginError(f"the factory registered for {kind} {name!r} is not callable ({type(factory).__name__})")
    if not isinstance(description, str):
        raise PluginError(f"the description of {kind} {name!r} must be a string")
    return Registration(kind, name, factory, " ".join(description.split()), plugin)



def _dist_name(dist) -> str:
    return dist.metadata["Name"] or "?"


@functools.lru_cache(maxsize=1)
def _steerkit_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
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
            _registry = Registry(allowlist=os.environ.get(ENV_ALLOWLIST), prefer=os.environ.get(ENV_PREFER))
        return _registry


def reset() -> None:
    """Forget loaded plugins; the next lookup rescans installed packages (after ``pip install``, in tests)."""
    global _registry
    with _lock:
        _registry = None


def register_plugin(plugin: Any, name: str | None = None) -> PluginInfo:
    """Register an in-process plugin (a module or object with ``@hookimpl`` functions), e.g. in a notebook."""
    return get_registry().register_plugin(plugin, name)


def unregister_plugin(name: str) -> None:
    get_registry().unregister_plugin(name)


def prefer(name: str, plugin: str) -> None:
    """Resolve a reward/scorer name shared by several plugins to ``plugin`` (entry-point or distribution name)
    in this process, like ``STEERKIT_PREFER=name=plugin``; :func:`reset` forgets it."""
    get_registry().set_preference(name, plugin)


def list_conflicts() -> list[Conflict]:
    """Every reward or scorer name registered by more than one plugin (resolved by a preference or not)."""
    reg = get_registry()
    return [c for kind in KINDS for _, c in sorted(reg.conflicts[kind].items())]


def list_plugins() -> list[PluginInfo]:
    return list(get_registry().plugins.values())


def list_rewards() -> list[Registration]:
    return sorted(get_registry().entries["reward"].values(), key=lambda r: r.name)


def list_scorers() -> list[Registration]:
    return sorted(get_registry().entries["scorer"].values(), key=lambda r: r.name)


def list_backends() -> list[Registration]:
    """The reward backends a bare name selects, in registration order (steerkit's torch and onnx first)."""
    return list(get_registry().entries["backend"].values())




def get_scorer(name: str, **options):
    """Build the registered evaluation scorer ``name`` (or ``PLUGIN:NAME``) with ``options``
    (see :meth:`HookSpecs.register_scorers`); a shared name raises as in :func:`get_reward`."""
    entry = get_registry().get("scorer", name)
    scorer = entry.build(options)
    if not callable(getattr(scorer, "score", None)):
        raise PluginError(f"The factory of scorer {name!r} (plugin {entry.plugin!r}) returned "
                          f"{type(scorer).__name__}, which has no `score(texts)` method.")
    return scorer


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

A reward or scorer name registered by two plugins is never resolved by load order: looking it up raises
:class:`~steerkit.errors.PluginConflictError` naming both, until the user picks one with a qualified
reference ``PLUGIN:NAME`` (entry-point or distribution name, e.g. ``steerkit-toxicity:toxicity``), with
``STEERKIT_PLUGINS``, or with ``STEERKIT_PREFER=NAME=PLUGIN[,NAME=PLUGIN...]``.
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
from typing import Any, Callable, NoReturn

import pluggy

from .errors import PluginConflictError, PluginError, SteerkitError

GROUP = "steerkit"
ENV_ALLOWLIST = "STEERKIT_PLUGINS"
ENV_PREFER = "STEERKIT_PREFER"

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
        A name another plugin also registers is ambiguous until the user picks one (``PLUGIN:NAME``,
        ``STEERKIT_PLUGINS`` or ``STEERKIT_PREFER``); lookups of the bare name raise
        :class:`~steerkit.errors.PluginConflictError` until then.

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

    @hookspec
    def register_commands(self, cli):
        """Add subcommands to the ``steerkit`` command line: ``cli`` is its root typer app.

        Decorate functions with ``@cli.command()`` (or add a group with ``cli.add_typer(...)``). Called once
        when the command line starts, after steerkit's own commands are registered; a command name that is
        already taken is an error reported by ``steerkit plugins``, and the plugin's other commands still load.
        Raise :class:`steerkit.SteerkitError` subclasses for user mistakes so the CLI prints one line and
        exits 2.
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
    #: "entry-point" (an installed package), "builtin" (inside steerkit) or "in-process" (:func:`register_plugin`)
    source: str = "entry-point"
    #: one line per reward/scorer name this plugin shares with another plugin (see :class:`Conflict`)
    conflicts: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.module is not None

    def to_dict(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "module": self.module, "loaded": self.loaded, "source": self.source, "hooks": self.hooks,
                "rewards": self.rewards, "scorers": self.scorers, "errors": self.errors,
                "conflicts": self.conflicts}


@dataclass(frozen=True)
class Conflict:
    """A reward or scorer name registered by more than one plugin.

    ``selected`` is the registration a bare-name lookup returns because of a ``STEERKIT_PREFER`` entry, or
    ``None`` while the name is ambiguous (lookups raise :class:`~steerkit.errors.PluginConflictError`).
    ``problem`` says why a preference for this name could not be honoured.
    """

    kind: str
    name: str
    providers: tuple[Registration, ...]
    selected: Registration | None = None
    problem: str | None = None


_KINDS = {"reward": "register_reward_models", "scorer": "register_scorers"}


class Registry:
    """One pluggy ``PluginManager`` plus what its plugins registered. Use :func:`get_registry`.

    ``claims[kind][name]`` lists every registration of a name, in load order; ``entries[kind][name]`` is what a
    bare-name lookup returns (names with one provider, and shared names a preference resolves);
    ``conflicts[kind][name]`` describes every name shared by two or more plugins, resolved or not.
    """

    def __init__(self, *, entry_points: bool = True, allowlist: str | None = None,
                 prefer: str | dict[str, str] | None = None):
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(HookSpecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.blocked: dict[str, str] = {}  # entry-point name -> distribution, left out by the allowlist
        self.claims: dict[str, dict[str, list[Registration]]] = {kind: {} for kind in _KINDS}
        self.entries: dict[str, dict[str, Registration]] = {kind: {} for kind in _KINDS}
        self.conflicts: dict[str, dict[str, Conflict]] = {kind: {} for kind in _KINDS}
        self._unmet: dict[str, dict[str, str]] = {kind: {} for kind in _KINDS}
        self.prefer, self.prefer_errors = _parse_preferences(prefer)
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
        allowed = None if allowlist is None else {_norm(n) for n in allowlist.split(",") if n.strip()}
        for name in sorted(found):
            ep, dist = found[name]
            info = PluginInfo(name, _dist_name(dist), dist.version)
            # a plugin renamed NAME@DIST (a clashing entry-point name) is allowed by that name or its distribution
            keys = {_norm(name), _norm(info.distribution or "")} | ({_norm(ep.name)} if name == ep.name else set())
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
            known = ({_norm(n) for n in found} | {_norm(ep.name) for ep, _ in found.values()}
                     | {_norm(_dist_name(d)) for _, d in found.values()})
            for missing in sorted(allowed - known):
                self.plugins[missing] = PluginInfo(missing, source="allowlist", errors=[
                    f"{ENV_ALLOWLIST} names {missing!r} but no installed package declares a {GROUP!r} entry point "
                    "of that name (see `pip list` and the package's pyproject.toml)."])

    def _register_module(self, name: str, load: Callable[[], Any]) -> None:
        info = PluginInfo(name, "steerkit", _steerkit_version(), source="builtin")

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
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(plugin, str) or not plugin.strip():
            raise PluginError(f"A preference needs a reward/scorer name and a plugin name, got {name!r} and {plugin!r}.")
        self.prefer[name] = plugin.strip()
        self.collect()

    # -- hooks ----------------------------------------------------------------------------------
    def collect(self) -> None:
        """Call every registration hook, one plugin at a time, so that one failing plugin spoils nothing else;
        then decide what each name resolves to."""
        for info in self.plugins.values():
            info.rewards, info.scorers, info.conflicts = [], [], []
            info.errors = [e for e in info.errors if not e.startswith(tuple(f"{h}:" for h in _KINDS.values()))]
        order: list[tuple[str, list[Registration]]] = []  # (plugin, what it registered) in registration order
        for kind, hook_name in _KINDS.items():
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
                    info.errors.append(f"{hook_name}: {_describe(exc)} (nothing it registered is used)")
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
        for kind in _KINDS:
            self._resolve(kind)
        for plugin, regs in order:
            info = self.plugins[plugin]
            for reg in regs:
                if self.entries[reg.kind].get(reg.name) is reg:
                    getattr(info, f"{reg.kind}s").append(reg.name)
                conflict = self.conflicts[reg.kind].get(reg.name)
                if conflict is not None:
                    info.conflicts.append(self._conflict_line(conflict, reg))

    def _resolve(self, kind: str) -> None:
        entries: dict[str, Registration] = {}
        conflicts: dict[str, Conflict] = {}
        unmet: dict[str, str] = {}
        for name, providers in self.claims[kind].items():
            selected, problem = None, None
            ref = self.prefer.get(name)
            if ref is not None:
                matches = self._match(providers, ref)
                if len(matches) == 1:
                    selected = matches[0]
                elif matches:
                    problem = (f"{ENV_PREFER} picks {ref!r} for {kind} {name!r}, which matches several of its "
                               f"providers ({', '.join(repr(m.plugin) for m in matches)}); name the entry point.")
                elif not any(self._match(self.claims[other].get(name, []), ref) for other in _KINDS if other != kind):
                    problem = f"{ENV_PREFER} picks {ref!r} for {kind} {name!r}, but {self._absent(ref, kind, name)}"
                # else: the preferred plugin registers `name` as the other kind; the preference is about that one
            if problem is not None:
                unmet[name] = problem
            elif selected is not None or len(providers) == 1:
                entries[name] = selected or providers[0]
            if len(providers) > 1:
                conflicts[name] = Conflict(kind, name, tuple(providers), selected, problem)
        self.entries[kind], self.conflicts[kind], self._unmet[kind] = entries, conflicts, unmet

    # -- lookups --------------------------------------------------------------------------------
    def get(self, kind: str, name: str) -> Registration:
        """The registration a reference means: ``NAME`` or ``PLUGIN:NAME`` (entry-point or distribution name).

        Raises :class:`~steerkit.errors.PluginConflictError` for a bare name that several plugins register and
        no preference resolves, and :class:`~steerkit.errors.PluginError` for anything else that does not resolve.
        """
        if self.prefer_errors:
            raise PluginError("\n".join([f"{ENV_PREFER}={os.environ.get(ENV_PREFER, '')!r} is not valid:",
                                         *(f"  {e}" for e in self.prefer_errors),
                                         f"Write {ENV_PREFER}=NAME=PLUGIN[,NAME=PLUGIN...], e.g. "
                                         f"{ENV_PREFER}=toxicity=steerkit-toxicity."]))
        if isinstance(name, str) and ":" in name:
            return self._get_qualified(kind, name)
        entries = self.entries[kind]
        if name in entries:
            return entries[name]
        if name in self.conflicts[kind]:
            raise PluginConflictError(self.conflict_message(self.conflicts[kind][name]))
        if name in self._unmet[kind]:
            providers = self.claims[kind][name]
            raise PluginError(f"{self._unmet[kind][name]}\n{kind.capitalize()} {name!r} is registered by "
                              f"{', '.join(self._who(r) for r in providers)}: refer to it as "
                              f"{self.qualified(providers[0])!r} to use it anyway, or fix {ENV_PREFER}.")
        self._unknown(kind, name)

    def _get_qualified(self, kind: str, reference: str) -> Registration:
        plugin, _, name = reference.rpartition(":")
        plugin, name = plugin.strip(), name.strip()
        if not plugin or not name:
            raise PluginError(f"{kind.capitalize()} reference {reference!r}: write NAME or PLUGIN:NAME, where PLUGIN "
                              "is an entry-point or distribution name (e.g. steerkit-toxicity:toxicity).")
        providers = self.claims[kind].get(name, [])
        matches = self._match(providers, plugin)
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise PluginConflictError(
                f"{kind.capitalize()} reference {reference!r} matches {len(matches)} plugins of the distribution "
                f"{plugin!r}: {', '.join(repr(m.plugin) for m in matches)}. Use the entry-point name instead, e.g. "
                f"{matches[0].plugin}:{name}.")
        if not providers:
            self._unknown(kind, name, plugin=plugin)
        raise PluginError(f"{kind.capitalize()} reference {reference!r}: {kind} {name!r} is registered by "
                          f"{', '.join(self._who(r) for r in providers)}, not by {plugin!r}: "
                          f"{self._absent(plugin, kind, name)} Use one of: "
                          f"{', '.join(self.qualified(r) for r in providers)}.")

    def _unknown(self, kind: str, name: str, plugin: str | None = None) -> NoReturn:
        entries = self.entries[kind]
        available = sorted({*entries, *self.conflicts[kind]})
        where = f" (from plugin {plugin!r})" if plugin else ""
        lines = [f"Unknown {kind} {name!r}{where}."]
        close = difflib.get_close_matches(name, available, n=1) if isinstance(name, str) else []
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

    # -- conflicts ------------------------------------------------------------------------------
    def qualified(self, reg: Registration) -> str:
        """The ``PLUGIN:NAME`` reference that always means ``reg``: its distribution name when no other provider
        of the name shares the distribution, else its entry-point (plugin) name."""
        info = self.plugins.get(reg.plugin)
        dist = info.distribution if info else None
        if dist and len(self._match(self.claims[reg.kind].get(reg.name, [reg]), dist)) == 1:
            return f"{dist}:{reg.name}"
        return f"{reg.plugin}:{reg.name}"

    def conflict_message(self, conflict: Conflict) -> str:
        """What a lookup of an ambiguous name raises: both providers and the three ways to pick one."""
        kind, name = conflict.kind, conflict.name
        providers = sorted(conflict.providers, key=self.qualified)
        refs = [self.qualified(r) for r in providers]
        lines = [f"{kind.capitalize()} {name!r} is registered by {len(providers)} plugins, so steerkit will not guess "
                 "which one you mean:"]
        for reg in providers:
            lines.append(f"  - {self._who(reg)}" + (f": {reg.description}" if reg.description else ""))
        if conflict.problem:
            lines.append(conflict.problem)
        lines.append("Pick one:")
        example = " (in --reward, config files and generate(rewards=...) alike)" if kind == "reward" else ""
        lines.append(f"  (a) refer to it as PLUGIN:NAME: {' or '.join(refs)}{example};")
        allow = self._allowlists(conflict)
        if allow:
            lines.append(f"  (b) load only one of them: {' or '.join(f'{ENV_ALLOWLIST}={a}' for a in allow)} "
                         f"({ENV_ALLOWLIST} lists every plugin to load);")
        else:
            lines.append(f"  (b) {ENV_ALLOWLIST} cannot help here: built-in and in-process plugins always load;")
        prefs = ' or '.join(f"{ENV_PREFER}={name}={ref.rpartition(':')[0]}" for ref in refs)
        lines.append(f"  (c) prefer one for this name: {prefs} (comma-separate several NAME=PLUGIN pairs).")
        dists = sorted({self.plugins[r.plugin].distribution for r in providers
                        if self.plugins[r.plugin].source == "entry-point" and self.plugins[r.plugin].distribution})
        if dists:
            lines.append(f"If you did not mean to install one of them, uninstall it (pip uninstall {' / '.join(dists)}).")
        return "\n".join(lines)

    def _allowlists(self, conflict: Conflict) -> list[str]:
        """For each provider, a ``STEERKIT_PLUGINS`` value that keeps every installed plugin but the other providers."""
        if any(self.plugins[r.plugin].source != "entry-point" for r in conflict.providers):
            return []
        providers = sorted(conflict.providers, key=self.qualified)
        names = {r.plugin for r in providers}
        installed = [p.name for p in self.plugins.values() if p.source == "entry-point"]
        return [",".join(n for n in installed if n == keep.plugin or n not in names) for keep in providers]

    def _conflict_line(self, conflict: Conflict, reg: Registration) -> str:
        others = ", ".join(self._who(r) for r in conflict.providers if r is not reg)
        line = f"{conflict.kind} {reg.name!r} is also registered by {others}; "
        if conflict.selected is reg:
            return line + f"{ENV_PREFER} selects this one."
        if conflict.selected is not None:
            return line + f"{ENV_PREFER} selects {conflict.selected.plugin!r}; use {self.qualified(reg)!r} for this one."
        return line + (f"the bare name is ambiguous: use {self.qualified(reg)!r}, or pick one with {ENV_PREFER} or "
                       f"{ENV_ALLOWLIST}.")

    def _who(self, reg: Registration) -> str:
        info = self.plugins.get(reg.plugin)
        if info is None or not info.distribution:
            return f"plugin {reg.plugin!r} (registered in-process)"
        return f"plugin {reg.plugin!r} ({info.distribution} {info.version or '?'})"

    def _match(self, providers: list[Registration] | tuple[Registration, ...], ref: str) -> list[Registration]:
        """The providers ``ref`` names: by exact plugin name, else normalized entry-point name, else distribution."""
        exact = [r for r in providers if r.plugin == ref]
        if exact:
            return exact
        key = _norm(ref)
        by_plugin = [r for r in providers if _norm(r.plugin) == key]
        if by_plugin:
            return by_plugin
        return [r for r in providers if (info := self.plugins.get(r.plugin)) is not None
                and info.distribution and _norm(info.distribution) == key]

    def _absent(self, ref: str, kind: str, name: str) -> str:
        """Why plugin ``ref`` does not provide ``kind name``."""
        key = _norm(ref)
        infos = [p for p in self.plugins.values() if _norm(p.name) == key or _norm(p.distribution or "") == key]
        if not infos:
            blocked = [n for n, d in self.blocked.items() if _norm(n) == key or _norm(d) == key]
            if blocked:
                return (f"plugin {blocked[0]!r} is installed but not loaded: {ENV_ALLOWLIST}="
                        f"{os.environ.get(ENV_ALLOWLIST, '')!r} does not list it.")
            return (f"no loaded plugin is named {ref!r} (entry-point or distribution name; "
                    f"loaded: {', '.join(sorted(p.name for p in self.plugins.values() if p.loaded)) or 'none'}).")
        info = infos[0]
        if not info.loaded:
            return f"plugin {info.name!r} failed to load: {info.errors[0] if info.errors else 'unknown error'}"
        provides = [r.name for regs in self.claims[kind].values() for r in regs if r.plugin == info.name]
        return (f"plugin {info.name!r} does not register a {kind} named {name!r} "
                f"(its {kind}s: {', '.join(provides) or 'none'}).")

    @property
    def errors(self) -> dict[str, list[str]]:
        return {name: info.errors for name, info in self.plugins.items() if info.errors}


def _parse_preferences(prefer: str | dict[str, str] | None) -> tuple[dict[str, str], list[str]]:
    """``"toxicity=steerkit-toxicity, sentiment=sentiment"`` -> ({name: plugin}, [what is wrong with it])."""
    if prefer is None:
        return {}, []
    items = list(prefer.items()) if isinstance(prefer, dict) else []
    errors: list[str] = []
    if isinstance(prefer, str):
        for part in (p.strip() for p in prefer.split(",")):
            if not part:
                continue
            name, eq, plugin = part.partition("=")
            if not eq:
                errors.append(f"{part!r} needs the form NAME=PLUGIN")
                continue
            items.append((name.strip(), plugin.strip()))
    result: dict[str, str] = {}
    for name, plugin in items:
        if not isinstance(name, str) or not _NAME.match(name):
            errors.append(f"{name!r} is not a reward or scorer name")
        elif not isinstance(plugin, str) or not plugin.strip():
            errors.append(f"{name!r} needs a plugin (entry-point or distribution name) after '='")
        elif name in result and result[name] != plugin:
            errors.append(f"{name!r} is given twice ({result[name]!r} and {plugin!r})")
        else:
            result[name] = plugin.strip()
    return result, errors


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
            _registry = Registry(allowlist=os.environ.get(ENV_ALLOWLIST), prefer=os.environ.get(ENV_PREFER))
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


def prefer(name: str, plugin: str) -> None:
    """Resolve a reward/scorer name shared by several plugins to ``plugin`` (entry-point or distribution name)
    in this process, like ``STEERKIT_PREFER=name=plugin``; :func:`reset` forgets it."""
    get_registry().set_preference(name, plugin)


def list_conflicts() -> list[Conflict]:
    """Every reward or scorer name registered by more than one plugin (resolved by a preference or not)."""
    reg = get_registry()
    return [c for kind in _KINDS for _, c in sorted(reg.conflicts[kind].items())]


def list_plugins() -> list[PluginInfo]:
    return list(get_registry().plugins.values())


def list_rewards() -> list[Registration]:
    return sorted(get_registry().entries["reward"].values(), key=lambda r: r.name)


def list_scorers() -> list[Registration]:
    return sorted(get_registry().entries["scorer"].values(), key=lambda r: r.name)


def get_reward(name: str, *, backend: str = "torch", context: str = "continuation"):
    """Build the registered reward ``name`` or ``PLUGIN:NAME`` (see :meth:`HookSpecs.register_reward_models`).

    Raises :class:`~steerkit.errors.PluginConflictError` if several plugins register ``name`` and none is picked.
    """
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
    """Build the registered evaluation scorer ``name`` (or ``PLUGIN:NAME``) with ``options``
    (see :meth:`HookSpecs.register_scorers`); a shared name raises as in :func:`get_reward`."""
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

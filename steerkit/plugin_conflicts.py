"""How a name that plugins register resolves: the lookups of :class:`~steerkit.registry.Registry`.

A reward, scorer or backend name registered by one plugin means that registration. A name registered by two or
more plugins is a :class:`Conflict`: it is never resolved by load order, and looking it up raises
:class:`~steerkit.errors.PluginConflictError` naming every provider, until the user picks one with a qualified
reference ``PLUGIN:NAME`` (entry-point or distribution name, e.g. ``steerkit-toxicity:toxicity``), with
``STEERKIT_PLUGINS``, or with ``STEERKIT_PREFER=NAME=PLUGIN[,NAME=PLUGIN...]``. The messages say which.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import NoReturn

from .errors import PluginConflictError, PluginError
from .hookspecs import ENV_ALLOWLIST, ENV_PREFER, KINDS, Registration

#: A reward, scorer or backend name: letters, digits, '.', '_' and '-', starting with a letter or digit.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Conflict:
    """A reward, scorer or backend name registered by more than one plugin.

    ``selected`` is the registration a bare-name lookup returns because of a ``STEERKIT_PREFER`` entry, or
    ``None`` while the name is ambiguous (lookups raise :class:`~steerkit.errors.PluginConflictError`).
    ``problem`` says why a preference for this name could not be honoured.
    """

    kind: str
    name: str
    providers: tuple[Registration, ...]
    selected: Registration | None = None
    problem: str | None = None


class ConflictResolution:
    """The name resolution and conflict reporting half of :class:`~steerkit.registry.Registry`.

    Works on the registry's ``plugins``, ``blocked``, ``claims``, ``entries``, ``conflicts``, ``prefer`` and
    ``prefer_errors`` (see there); :meth:`_resolve` fills ``entries``, ``conflicts`` and ``_unmet`` for a kind.
    """

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
                elif not any(self._match(self.claims[other].get(name, []), ref) for other in KINDS if other != kind):
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
        lines.append("Run `steerkit plugins` to see installed plugins; `steerkit setup` installs the bundled "
                     "toxicity and sentiment plugins, and any package that registers on the 'steerkit' entry-point "
                     "group adds its own.")
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
        key = norm(ref)
        by_plugin = [r for r in providers if norm(r.plugin) == key]
        if by_plugin:
            return by_plugin
        return [r for r in providers if (info := self.plugins.get(r.plugin)) is not None
                and key in _distribution_keys(info)]

    def _absent(self, ref: str, kind: str, name: str) -> str:
        """Why plugin ``ref`` does not provide ``kind name``."""
        key = norm(ref)
        infos = [p for p in self.plugins.values() if norm(p.name) == key or key in _distribution_keys(p)]
        if not infos:
            blocked = [n for n, d in self.blocked.items() if norm(n) == key or norm(d) == key]
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



def parse_preferences(prefer: str | dict[str, str] | None) -> tuple[dict[str, str], list[str]]:
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
        if not isinstance(name, str) or not NAME.match(name):
            errors.append(f"{name!r} is not a reward or scorer name")
        elif not isinstance(plugin, str) or not plugin.strip():
            errors.append(f"{name!r} needs a plugin (entry-point or distribution name) after '='")
        elif name in result and result[name] != plugin:
            errors.append(f"{name!r} is given twice ({result[name]!r} and {plugin!r})")
        else:
            result[name] = plugin.strip()
    return result, errors



def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _distribution_keys(info) -> set[str]:
    """The distribution names that select ``info``'s registrations: its own, and for steerkit's built-in plugins
    (distribution ``steerkit-rad``) the import package's name too, so ``steerkit:vader`` keeps working."""
    keys = {norm(info.distribution)} if info.distribution else set()
    return (keys | {"steerkit"}) if info.source == "builtin" else keys


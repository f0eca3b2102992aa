"""steerkit: controlled text generation with Reward-Augmented Decoding (RAD).

    import steerkit
    out = steerkit.generate(["The movie was"], rewards={"sentiment": 20}, k=20, max_new_tokens=20)
"""

from .assembly import generate
from .decoding import GenerationOutput, RewardAugmentedGenerator
from .errors import (
    CheckpointError, ConfigError, DataError, ExportError, InvalidArgumentError, ModelFormatError, ModelIntegrityError,
    ModelNotFoundError, ModelNotInstalledError, NonFiniteRewardError, OutputExistsError, PluginConflictError,
    PluginError, PromptTooLongError, RewardModelFormatError, SteerkitError, SteerkitWarning, UnsafeModelError,
)
from .hf import RewardAugmentedLogitsProcessor
from .models import load_causal_lm, load_tokenizer, resolve
from .registry import hookimpl
from .rewards.loading import load_reward
from .rewards.model import RewardModel
from .rewards.sequence.scorer import RewardModelScorer
from .steering import BetaSchedule, SteeringTerm

__version__ = "0.1.0"

__all__ = [
    "generate", "GenerationOutput", "RewardAugmentedGenerator", "RewardAugmentedLogitsProcessor",
    "RewardModel", "RewardModelScorer", "SteeringTerm", "BetaSchedule", "load_reward", "load_causal_lm",
    "load_tokenizer", "resolve", "hookimpl", "SteerkitError", "InvalidArgumentError", "PromptTooLongError",
    "ModelNotFoundError", "ModelNotInstalledError", "ModelIntegrityError", "RewardModelFormatError",
    "PluginError", "ConfigError", "DataError", "CheckpointError", "ExportError", "ModelFormatError",
    "UnsafeModelError", "PluginConflictError", "SteerkitWarning", "NonFiniteRewardError", "OutputExistsError",
]

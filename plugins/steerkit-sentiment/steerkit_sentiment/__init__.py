"""steerkit-sentiment: registers the ``sentiment`` reward (probability that the text expresses positive sentiment) with steerkit.

The reward model is the directory ``model/`` next to this file, shipped as package data. Registration
only reads its small JSON config (for the description); the weights load when the reward is first used.
"""

from __future__ import annotations

from pathlib import Path

try:  # first: the steerkit Python imports must be steerkit-rad's (PyPI's 'steerkit' is another project)
    from steerkit.provenance import check_distribution
except ImportError as exc:  # the unrelated project's 'steerkit' package (or a mix of both), or none at all
    raise ImportError(f"steerkit-sentiment needs steerkit-rad, which is not what `import steerkit` finds ({exc}): "
                      "pip uninstall steerkit, then pip install --force-reinstall --no-deps steerkit-rad") from exc
check_distribution(needed_by="steerkit-sentiment")  # ForeignDistributionError if another distribution shares it

from steerkit import hookimpl
from steerkit.rewards.packaged import describe_reward_model, reward_model_factory

__version__ = "0.2.0"

NAME = "sentiment"
ATTRIBUTE = "probability that the text expresses positive sentiment"
MODEL_DIR = Path(__file__).resolve().parent / "model"
#: the token-level variant (kind: token, ``sentiment-token``): one reward-model token per step at any k, LM of the
#: SmolLM2 tokenizer family only (train_token.yaml)
TOKEN_NAME = "sentiment-token"
TOKEN_MODEL_DIR = Path(__file__).resolve().parent / "model_token"


@hookimpl
def register_reward_models(register):
    register(NAME, reward_model_factory(MODEL_DIR, name=NAME, package="steerkit-sentiment"),
             description=describe_reward_model(MODEL_DIR, ATTRIBUTE))
    register(TOKEN_NAME, reward_model_factory(TOKEN_MODEL_DIR, name=TOKEN_NAME, package="steerkit-sentiment"),
             description=describe_reward_model(TOKEN_MODEL_DIR, ATTRIBUTE))

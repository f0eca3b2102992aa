"""steerkit-toxicity: registers the ``toxicity`` reward (probability that the text is toxic) with steerkit.

The reward model is the directory ``model/`` next to this file, shipped as package data. Registration
only reads its small JSON config (for the description); the weights load when the reward is first used.
"""

from __future__ import annotations

from pathlib import Path

try:  # first: the steerkit Python imports must be steerkit-rad's (PyPI's 'steerkit' is another project)
    from steerkit.provenance import check_distribution
except ImportError as exc:  # the unrelated project's 'steerkit' package (or a mix of both), or none at all
    raise ImportError(f"steerkit-toxicity needs steerkit-rad, which is not what `import steerkit` finds ({exc}): "
                      "pip uninstall steerkit, then pip install --force-reinstall --no-deps steerkit-rad") from exc
check_distribution(needed_by="steerkit-toxicity")  # ForeignDistributionError if another distribution shares it

from steerkit import hookimpl
from steerkit.rewards.packaged import describe_reward_model, reward_model_factory

__version__ = "0.8.0"

NAME = "toxicity"
ATTRIBUTE = "probability that the text is toxic"
MODEL_DIR = Path(__file__).resolve().parent / "model"
#: the token-level variant (kind: token, ``toxicity-token``): one reward-model token per step at any k, LM of the
#: SmolLM2 tokenizer family only (train_token.yaml)
TOKEN_NAME = "toxicity-token"
TOKEN_MODEL_DIR = Path(__file__).resolve().parent / "model_token"
#: the same student distilled from ``toxicity``'s rewards of sampled top-k candidates (train_token_distill.yaml):
#: steers like ``toxicity`` at the same beta and fluency, a weaker classifier of human text (docs/results.md)
DISTILLED_NAME = "toxicity-token-distilled"
DISTILLED_MODEL_DIR = Path(__file__).resolve().parent / "model_token_distilled"
#: a rank-64 token-level head on SmolLM2-135M-Instruct's own final hidden state (train_lm_state.yaml): in steerkit's
#: engine it scores from the state the LM has already computed, so a step costs one small product; that LM only
LM_STATE_NAME = "toxicity-lm"
LM_STATE_MODEL_DIR = Path(__file__).resolve().parent / "model_lm_state"


@hookimpl
def register_reward_models(register):
    register(NAME, reward_model_factory(MODEL_DIR, name=NAME, package="steerkit-toxicity"),
             description=describe_reward_model(MODEL_DIR, ATTRIBUTE))
    register(TOKEN_NAME, reward_model_factory(TOKEN_MODEL_DIR, name=TOKEN_NAME, package="steerkit-toxicity"),
             description=describe_reward_model(TOKEN_MODEL_DIR, ATTRIBUTE))
    register(DISTILLED_NAME, reward_model_factory(DISTILLED_MODEL_DIR, name=DISTILLED_NAME, package="steerkit-toxicity"),
             description=describe_reward_model(DISTILLED_MODEL_DIR, ATTRIBUTE))
    register(LM_STATE_NAME, reward_model_factory(LM_STATE_MODEL_DIR, name=LM_STATE_NAME, package="steerkit-toxicity"),
             description=describe_reward_model(LM_STATE_MODEL_DIR, ATTRIBUTE))

"""steerkit-sentiment: registers the ``sentiment`` reward (probability that the text expresses positive sentiment) with steerkit.

The reward model is the directory ``model/`` next to this file, shipped as package data. Registration
only reads its small JSON config (for the description); the weights load when the reward is first used.
"""

from __future__ import annotations

import json
from pathlib import Path

from steerkit import hookimpl
from steerkit.registry import reward_model_factory

__version__ = "0.1.0"

NAME = "sentiment"
MODEL_DIR = Path(__file__).resolve().parent / "model"


def describe() -> str:
    config = MODEL_DIR / "reward_config.json"
    if not config.is_file():
        return f"probability that the text expresses positive sentiment (model files missing from {MODEL_DIR})"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"probability that the text expresses positive sentiment (unreadable {config})"
    layers = data.get("num_layers")
    backbone = data.get("backbone", "?")
    return f"{data.get('attribute') or 'probability that the text expresses positive sentiment'} ({backbone}, {layers} layers, {data.get('method', '?')})"


@hookimpl
def register_reward_models(register):
    register(NAME, reward_model_factory(MODEL_DIR, name=NAME, package="steerkit-sentiment"), description=describe())

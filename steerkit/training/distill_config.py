"""``distill:`` in a training config: fit a token-level reward model (``kind: token``) to a sequence reward model.

The teacher (a registered reward name or a reward-model directory) scores the top-k candidates of every step of
continuations sampled from ``lm`` (prompts: the first words of the training texts); the student learns to give
each candidate the teacher's reward (:mod:`steerkit.training.distill`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..models import DEFAULT_LM


class DistillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str = Field(min_length=1, description="Sequence reward model: a registered name or a directory")
    lm: str = Field(default=DEFAULT_LM, min_length=1, description="LM whose continuations are sampled")
    prompts: int = Field(default=512, ge=2, description="Prompts drawn (seeded) from the training texts")
    prompt_words: int = Field(default=8, ge=1, description="Words of a training text used as its prompt")
    max_new_tokens: int = Field(default=20, ge=1)
    k: int = Field(default=20, ge=1, description="Candidates per step scored by the teacher")
    temperature: float = Field(default=1.0, gt=0)
    steer_betas: list[float] = Field(default=[0.0], min_length=1, description="Teacher β while sampling, round "
                                     "robin over prompts (non-zero values spread the rewards seen)")
    context: Literal["continuation", "full"] = "continuation"
    generation_batch_size: int = Field(default=32, ge=1)
    holdout_fraction: float = Field(default=0.1, ge=0, lt=1, description="Samples kept out to measure the "
                                    "student's agreement with the teacher")
    label_weight: float = Field(default=0.0, ge=0, description="Also apply the label loss on the training data "
                                "with this weight (0: pure distillation)")

"""One optimizer update of a training loop, shared by ``trainer.train`` and ``distill.train_distilled``."""

from __future__ import annotations

import torch


def apply_update(loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                 grad_clip: float, lr: float) -> None:
    """Backpropagate ``loss``, clip the gradient norm of ``params`` to ``grad_clip`` (0: no clipping), set every
    parameter group's learning rate to ``lr``, step the optimizer and clear the gradients."""
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

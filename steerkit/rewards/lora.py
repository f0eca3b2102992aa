"""LoRA for reward models: the settings' targets, peft's config for training, and steerkit's own merge for loading.

Training attaches the adapter with peft (the ``train`` extra); the adapter file a trained reward model ships,
``adapter.safetensors``, holds what peft's ``get_peft_model_state_dict`` writes for the (truncated) backbone::

    base_model.model.<module path>.lora_A.weight    r × in
    base_model.model.<module path>.lora_B.weight    out × r

Loading needs no peft: :func:`merge_lora` adds ``(alpha / r) · B A`` to each adapted module's weight (transposed
for GPT-2's ``Conv1D``, whose weight is in × out), which is what peft's ``merge_and_unload`` computes, and leaves
a plain transformers backbone. It is strict: the adapted modules must be exactly those the settings'
``target_modules`` name in the truncated backbone, with the settings' rank and the modules' shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import RewardModelFormatError
from .backbones import _adaptable, default_lora_targets, uses_conv1d
from .model_config import LoraSettings

#: what peft puts before a module's path in the saved adapter (PeftModel.base_model.model is the backbone)
KEY_PREFIX = "base_model.model."
FACTORS = ("lora_A", "lora_B")


def resolve_lora(settings: LoraSettings, backbone: nn.Module) -> LoraSettings:
    """``settings`` with ``target_modules`` filled in from the backbone's family when it names none."""
    if settings.target_modules is not None:
        return settings
    return settings.model_copy(update={"target_modules": default_lora_targets(backbone)})


def lora_config(settings: LoraSettings, backbone: nn.Module | None = None):
    """A peft LoraConfig (training only); ``backbone`` resolves default targets and GPT-2's Conv1D layout
    (fan_in_fan_out)."""
    from peft import LoraConfig

    if backbone is not None:
        settings = resolve_lora(settings, backbone)
    if settings.target_modules is None:
        raise RewardModelFormatError("LoRA settings name no target_modules; pass the backbone to resolve its defaults.")
    targets = list(settings.target_modules)
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=targets, bias="none",
                      fan_in_fan_out=backbone is not None and uses_conv1d(backbone, targets))


def targeted_modules(backbone: nn.Module, targets: list[str]) -> dict[str, nn.Module]:
    """The Linear / Conv1D modules a target list adapts, as peft matches them (the name, or its last parts)."""
    return {name: module for name, module in backbone.named_modules() if _adaptable(module)
            and any(name == t or name.endswith("." + t) for t in targets)}


def merge_lora(backbone: nn.Module, settings: LoraSettings, state: dict[str, torch.Tensor],
               source: str = "the LoRA adapter") -> nn.Module:
    """Merge a saved adapter into ``backbone`` in place (``W += alpha / r · B A``) and return it; no peft needed.

    Every mismatch (a key that is no LoRA factor of a targeted module, a targeted module without both factors,
    another rank or shape) raises :class:`RewardModelFormatError` naming ``source``; nothing is merged then."""
    settings = resolve_lora(settings, backbone)
    if settings.r < 1:
        raise RewardModelFormatError(f"{source}: LoRA rank r must be at least 1, got {settings.r}.")
    modules = targeted_modules(backbone, list(settings.target_modules))
    if not modules:
        raise RewardModelFormatError(f"{source}: lora.target_modules {settings.target_modules} name no Linear or "
                                     f"Conv1D layer of {type(backbone).__name__}.")
    factors = adapter_factors(state, source)
    stray, missing = sorted(set(factors) - set(modules)), sorted(set(modules) - set(factors))
    if stray or missing:
        raise RewardModelFormatError(
            f"{source} does not match the backbone and its lora.target_modules {settings.target_modules}: "
            f"{'it adapts ' + ', '.join(stray[:3]) + ' (not targeted or not in the backbone)' if stray else ''}"
            f"{'; ' if stray and missing else ''}"
            f"{'it lacks ' + ', '.join(missing[:3]) if missing else ''}. It was saved from another backbone, depth "
            "or LoRA configuration.")
    deltas = {name: _delta(name, modules[name], *factors[name], settings, source) for name in modules}
    with torch.no_grad():
        for name, delta in deltas.items():
            weight = modules[name].weight
            weight.add_(delta.to(device=weight.device, dtype=weight.dtype))
    return backbone


def adapter_factors(state: dict[str, torch.Tensor], source: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module path: (A, B)}`` from peft's adapter keys; any other key, or a lone factor, is refused."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        path, _, tail = key.removeprefix(KEY_PREFIX).rpartition(".")
        module, _, factor = path.rpartition(".")
        if not key.startswith(KEY_PREFIX) or tail != "weight" or factor not in FACTORS or not module:
            raise RewardModelFormatError(
                f"{source} holds {key!r}, which is no LoRA factor steerkit merges (expected "
                f"'{KEY_PREFIX}<module>.lora_A.weight' / '.lora_B.weight', as peft saves a plain LoRA adapter).")
        found.setdefault(module, {})[factor] = tensor
    lone = sorted(m for m, f in found.items() if len(f) != 2)
    if lone:
        raise RewardModelFormatError(f"{source} holds only one of lora_A / lora_B for {', '.join(lone[:3])}.")
    return {m: (f["lora_A"], f["lora_B"]) for m, f in found.items()}


def _delta(name: str, module: nn.Module, a: torch.Tensor, b: torch.Tensor, settings: LoraSettings,
           source: str) -> torch.Tensor:
    """``alpha / r · B A`` in the layout of the module's weight (checked against it)."""
    conv1d = type(module).__name__ == "Conv1D"  # transformers' Conv1D: weight is in × out
    in_features, out_features = module.weight.shape[::-1] if not conv1d else module.weight.shape
    expected_a, expected_b = (settings.r, in_features), (out_features, settings.r)
    floating = a.is_floating_point() and b.is_floating_point()
    if (tuple(a.shape), tuple(b.shape)) != (expected_a, expected_b) or not floating:
        raise RewardModelFormatError(
            f"{source}: the factors of {name} have shapes {tuple(a.shape)} / {tuple(b.shape)} ({a.dtype}); the "
            f"module and lora.r={settings.r} need floating-point {expected_a} / {expected_b}.")
    delta = (b.float() @ a.float()) * (settings.alpha / settings.r)
    return delta.T if conv1d else delta

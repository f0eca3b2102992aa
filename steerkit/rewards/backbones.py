"""Any causal decoder as a reward-model backbone: find its blocks, truncate them, pick LoRA targets.

A backbone is the *base model* of an ``AutoModelForCausalLM`` (``lm.base_model``: ``LlamaModel``,
``GPT2Model``, ``GPTNeoXModel``, ``OPTModel``, ``PhiModel``, ...). Its transformer blocks are the one
``nn.ModuleList`` inside it whose length is the config's layer count, wherever it lives
(``layers``, ``h``, ``decoder.layers``, ...). Truncating keeps the first N blocks and updates every
config field that counts or lists layers, so that ``DynamicCache(config=...)`` allocates N layers.
"""

from __future__ import annotations

from torch import nn

from ..errors import RewardModelFormatError

#: config fields that count the decoder's layers in some family (aliases resolve through attribute_map)
LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
#: config fields that list one entry per layer
PER_LAYER_FIELDS = ("layer_types", "attention_layers")
#: LoRA targets tried in order when a config names none: the first set present in the backbone wins
LORA_TARGET_CANDIDATES = (
    ["q_proj", "v_proj"],  # Llama, Qwen, Gemma, SmolLM, Mistral, Phi, OPT
    ["c_attn"],  # GPT-2 (fused QKV, a Conv1D)
    ["query_key_value"],  # GPT-NeoX, Falcon, Bloom
    ["qkv_proj"],  # Phi-3
    ["Wqkv"],  # MPT-style
)


def layer_count(config) -> int | None:
    for field in LAYER_COUNT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int):
            return value
    return None


def find_blocks(backbone: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """``(owner, attribute, blocks)``: the ModuleList of transformer blocks and where it is attached."""
    expected = layer_count(backbone.config)
    lists = [(name, module) for name, module in backbone.named_modules()
             if isinstance(module, nn.ModuleList) and len(module) > 0]
    matching = [(n, m) for n, m in lists if expected is None or len(m) == expected]
    if len(matching) > 1:  # e.g. per-layer norms next to the blocks: the blocks are the list of the largest modules
        top = [(n, m) for n, m in matching if "." not in n]
        matching = top if len(top) == 1 else matching
    if len(matching) != 1:
        found = ", ".join(f"{n or '<root>'} ({len(m)})" for n, m in lists) or "none"
        raise RewardModelFormatError(
            f"Cannot find the transformer blocks of {type(backbone).__name__}: a reward-model backbone must hold "
            f"exactly one nn.ModuleList of {expected} blocks (ModuleLists found: {found}). Use a causal decoder "
            "whose blocks form a list (Llama, Qwen, Gemma, GPT-2, GPT-NeoX, Phi, OPT, ...).")
    name, blocks = matching[0]
    owner_name, _, attribute = name.rpartition(".")
    owner = backbone.get_submodule(owner_name) if owner_name else backbone
    return owner, attribute, blocks


def num_blocks(backbone: nn.Module) -> int:
    return len(find_blocks(backbone)[2])


def truncate(backbone: nn.Module, num_layers: int) -> None:
    """Keep the first ``num_layers`` blocks and update the config's layer counts and per-layer lists."""
    owner, attribute, blocks = find_blocks(backbone)
    total = len(blocks)
    if not 1 <= num_layers <= total:
        raise RewardModelFormatError(f"num_layers must be in [1, {total}] for this backbone, got {num_layers}.")
    setattr(owner, attribute, blocks[:num_layers])
    configs = {id(backbone.config): backbone.config}
    for module in backbone.modules():  # sub-modules (OPT's decoder) may hold their own config object
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            configs[id(cfg)] = cfg
    for cfg in configs.values():
        for field in LAYER_COUNT_FIELDS:
            if getattr(cfg, field, None) == total:
                setattr(cfg, field, num_layers)
        for field in PER_LAYER_FIELDS:
            value = getattr(cfg, field, None)
            if isinstance(value, list) and len(value) == total:
                setattr(cfg, field, value[:num_layers])


def output_hidden_size(lm: nn.Module) -> int:
    """Width of the base model's last hidden state (OPT may project it out to word_embed_proj_dim)."""
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[1])
    return int(lm.config.hidden_size)


def default_lora_targets(backbone: nn.Module) -> list[str]:
    """The attention projections to adapt when a LoRA config names none (see LORA_TARGET_CANDIDATES)."""
    names = {name.rpartition(".")[2] for name, module in backbone.named_modules() if _adaptable(module)}
    for candidate in LORA_TARGET_CANDIDATES:
        if all(c in names for c in candidate):
            return list(candidate)
    raise RewardModelFormatError(
        f"No default LoRA targets for {type(backbone).__name__}: none of "
        f"{', '.join('/'.join(c) for c in LORA_TARGET_CANDIDATES)} is a layer of it. Set lora.target_modules to "
        "its attention projection names, or use method 'head' or 'full'.")


def uses_conv1d(backbone: nn.Module, targets: list[str]) -> bool:
    """True when a targeted layer is transformers' Conv1D (GPT-2): LoRA then needs fan_in_fan_out."""
    return any(type(m).__name__ == "Conv1D" and n.rpartition(".")[2] in targets for n, m in backbone.named_modules())


def _adaptable(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"

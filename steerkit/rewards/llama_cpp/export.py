"""Write a reward model's backbone (a truncated Llama-architecture model, LoRA merged) to a GGUF llama.cpp runs.

The GGUF holds the transformer blocks and the final norm only: llama.cpp's ``embeddings`` output (the final-norm
hidden state of every token) is all the reward heads need, and they stay in torch on top of it
(:mod:`.runtime`). The token embeddings are *not* looked up by llama.cpp either: steerkit feeds each token's
input embedding (float32, from the torch model's embedding matrix) through ``llama_batch.embd``. That lets the GGUF
carry a stub vocabulary of a few tokens, so llama.cpp's output projection (which it computes for every output
token, embeddings or not) is a [d, 8] product instead of a [d, 49 152] one: at k = 20 outputs a step, the full
projection would cost as much as the whole 6-layer backbone.

Weights: ``f32`` (every tensor as float32) or ``q8_0`` (the 2-D projections in llama.cpp's Q8_0, norms float32).
The q/k projection rows are permuted from Hugging Face's rotate-half layout to llama.cpp's interleaved RoPE, as
llama.cpp's ``convert_hf_to_gguf.py`` does (``LlamaModel.permute``).

Exports are cached in ``$STEERKIT_CACHE/llama_cpp/<key>/`` keyed by the reward hash (the ONNX export's
:func:`~steerkit.rewards.onnx.export.reward_dir_hash` of a directory, or the content hash of an in-memory model),
:data:`FORMAT_VERSION` and the weight type, written to a temporary file and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from ...errors import ExportError
from ...files import atomic_path, cache_dir

#: bump when the GGUF layout written here changes (old cache entries are then ignored)
FORMAT_VERSION = 1
PRECISIONS = {"f32": "F32", "q8_0": "Q8_0"}
#: the stub vocabulary's size (llama.cpp never tokenizes; it only needs a valid vocabulary to load)
STUB_VOCAB = 8
#: Hugging Face model types written as llama.cpp's ``llama`` architecture
LLAMA_TYPES = ("llama",)


class UnsupportedBackboneError(ExportError):
    """The reward model's backbone is no architecture the llama.cpp reward backend can write to GGUF."""


def check_precision(precision: str) -> str:
    p = str(precision).lower().replace("-", "_")
    if p not in PRECISIONS:
        raise ExportError(f"llama.cpp reward weights: precision {precision!r} is not one of "
                          f"{', '.join(map(repr, PRECISIONS))}.")
    return p


def llama_backbone(model):
    """The backbone of a torch reward model if llama.cpp's ``llama`` architecture can run it exactly, else an
    :class:`UnsupportedBackboneError` saying what to use instead."""
    backbone = model.backbone
    cfg = backbone.config
    kind = getattr(cfg, "model_type", "?")
    problems = []
    if kind not in LLAMA_TYPES:
        problems.append(f"model type {kind!r}")
    else:
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            problems.append("biases in attention or MLP")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            problems.append(f"activation {cfg.hidden_act!r}")
        scaling = getattr(cfg, "rope_scaling", None) or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "?"
        if rope_type not in ("default", None):
            problems.append(f"RoPE scaling {rope_type!r}")
        if getattr(backbone, "layers", None) is None or getattr(backbone, "embed_tokens", None) is None:
            problems.append("no Llama-style module layout")
    if problems:
        raise UnsupportedBackboneError(
            f"Backend 'llama.cpp' runs reward models on Llama-architecture backbones (SmolLM2, Llama); "
            f"{model.config.name!r} has a {kind!r} backbone ({'; '.join(problems)}). Use backend 'torch' or "
            "'onnx' for it.")
    return backbone


def rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0) if isinstance(params, dict) else 10000.0
    return float(theta)


def permute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotate-half q/k rows -> llama.cpp's interleaved pairs (convert_hf_to_gguf's ``permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def geometry(backbone) -> dict:
    cfg = backbone.config
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return {"hidden": int(cfg.hidden_size), "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "layers": len(backbone.layers), "ffn": int(cfg.intermediate_size),
            "eps": float(cfg.rms_norm_eps), "theta": rope_theta(cfg),
            "context": int(getattr(cfg, "max_position_embeddings", 2048) or 2048)}


def write_gguf(model, path: str | os.PathLike, precision: str = "f32") -> Path:
    """Write ``model``'s backbone (blocks + final norm; see the module docstring) to ``path`` as a GGUF."""
    import gguf

    precision = check_precision(precision)
    backbone = llama_backbone(model)
    g = geometry(backbone)
    qtype = gguf.GGMLQuantizationType[PRECISIONS[precision]]
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"steerkit reward backbone {model.config.name}")
    writer.add_context_length(g["context"])
    writer.add_embedding_length(g["hidden"])
    writer.add_block_count(g["layers"])
    writer.add_feed_forward_length(g["ffn"])
    writer.add_head_count(g["heads"])
    writer.add_head_count_kv(g["kv_heads"])
    writer.add_key_length(g["head_dim"])
    writer.add_value_length(g["head_dim"])
    writer.add_rope_dimension_count(g["head_dim"])
    writer.add_rope_freq_base(g["theta"])
    writer.add_layer_norm_rms_eps(g["eps"])
    writer.add_vocab_size(STUB_VOCAB)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if precision == "q8_0" else gguf.LlamaFileType.ALL_F32)
    # a stub SentencePiece-style vocabulary: llama.cpp needs one to load, steerkit never lets it tokenize
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>"] + [f"<stub{i}>" for i in range(STUB_VOCAB - 4)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * STUB_VOCAB)
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                            gguf.TokenType.BYTE] + [gguf.TokenType.NORMAL] * (STUB_VOCAB - 4))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)

    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float32).cpu().contiguous().numpy()

    def matrix(name: str, w: np.ndarray) -> None:
        if qtype == gguf.GGMLQuantizationType.F32 or w.shape[-1] % 32:
            writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype),
                              raw_dtype=qtype)

    stub = np.zeros((STUB_VOCAB, g["hidden"]), dtype=np.float32)
    writer.add_tensor("token_embd.weight", stub)  # never read: inputs are embeddings (tied output: [d, 8])
    writer.add_tensor("output_norm.weight", f32(backbone.norm.weight))
    for i, layer in enumerate(backbone.layers):
        att, mlp = layer.self_attn, layer.mlp
        writer.add_tensor(f"blk.{i}.attn_norm.weight", f32(layer.input_layernorm.weight))
        matrix(f"blk.{i}.attn_q.weight", permute_rope(f32(att.q_proj.weight), g["heads"]))
        matrix(f"blk.{i}.attn_k.weight", permute_rope(f32(att.k_proj.weight), g["kv_heads"]))
        matrix(f"blk.{i}.attn_v.weight", f32(att.v_proj.weight))
        matrix(f"blk.{i}.attn_output.weight", f32(att.o_proj.weight))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", f32(layer.post_attention_layernorm.weight))
        matrix(f"blk.{i}.ffn_gate.weight", f32(mlp.gate_proj.weight))
        matrix(f"blk.{i}.ffn_up.weight", f32(mlp.up_proj.weight))
        matrix(f"blk.{i}.ffn_down.weight", f32(mlp.down_proj.weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def cache_path(reward_hash: str, precision: str) -> Path:
    key = hashlib.sha256(f"{reward_hash}|llama.cpp|{FORMAT_VERSION}".encode()).hexdigest()
    return cache_dir() / "llama_cpp" / key[:32] / f"backbone-{check_precision(precision)}.gguf"


def ensure_gguf(model, reward_hash: str, precision: str = "f32") -> Path:
    """The cached GGUF of ``model`` (whose reward hash is ``reward_hash``), written on first use: to a private
    temporary file in the entry's directory, renamed into place (a concurrent writer's file wins, never half a file)."""
    target = cache_path(reward_hash, precision)
    if target.is_file():
        return target
    with atomic_path(target) as tmp:
        write_gguf(model, tmp, precision)
    return target

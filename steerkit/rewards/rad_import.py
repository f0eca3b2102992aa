"""Import the paper authors' reward models (r-three/RAD) as steerkit reward-model directories.

An official RAD reward model is the state dict of ``GPT2RewardModel``: a ``GPT2LMHeadModel`` whose
``lm_head`` was replaced by ``nn.Linear(d, n, bias=True)`` (``n = 1`` for sentiment, 7 for toxicity, of
which RAD reads output 0), saved as ``pytorch_model.bin``. Its keys are ``model.transformer.h.0...`` and
``model.lm_head.weight`` / ``model.lm_head.bias`` (a bare ``GPT2LMHeadModel``-like dict has no ``model.``
prefix; a ``score`` head is accepted too). RAD reads ``clamp(lm_head(h_t)[output], 0, 1)`` from the last
hidden state, so the imported directory has ``output_function: clamp``, ``method: full`` (the fine-tuned
backbone weights) and the head row of the chosen output.

Weights are read with ``torch.load(weights_only=True)`` (``.bin``/``.pt``/``.pth``/``.ckpt``) or from
safetensors; nothing is ever unpickled beyond tensors. Any other layout is a :class:`RewardModelFormatError`.

The paper's code feeds the reward model a text's own GPT-2 ids, with no start token (in training and in
decoding), so the imported directory has ``start_token_id: null``: steerkit reads exactly those ids, and the
reward of a text ``t`` (from scratch or through the decoding cache) equals the original module's output on
``tokenizer(t).input_ids``. An empty text has no reward (``score_texts`` refuses it); while decoding, the first
step after an empty text scores each candidate token on its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from ..errors import ModelNotFoundError, OutputExistsError, RewardModelFormatError
from ..files import atomic_write_text, sha256_file
from ..models import load_causal_lm, resolve
from .backbones import find_blocks, output_hidden_size
from .model import CONFIG_NAME, RewardModel

HEAD_NAMES = ("lm_head", "score")
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
CHECKPOINT_FILES = ("pytorch_model.bin", "model.safetensors")  # what a RAD / HF Trainer output directory holds
PROVENANCE_NAME = "rad_import.json"
#: causal-mask buffers that older transformers versions saved in GPT-2 state dicts (not weights)
LEGACY_BUFFERS = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


def read_state_dict(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A flat ``{name: tensor}`` dict from a .safetensors file or a torch state dict (weights_only)."""
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        found = [path / f for f in CHECKPOINT_FILES if (path / f).is_file()]
        if not found:
            raise RewardModelFormatError(f"{path} holds none of {', '.join(CHECKPOINT_FILES)}; pass the checkpoint file.")
        path = found[0]
    if not path.is_file():
        raise RewardModelFormatError(f"Checkpoint {path} does not exist.")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise RewardModelFormatError(f"{path} is not a readable safetensors file: {exc}") from None
    elif path.suffix in TORCH_SUFFIXES:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle.UnpicklingError (objects other than tensors), zip/EOF errors, ...
            raise RewardModelFormatError(
                f"{path} is not a plain state dict of tensors ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
                "steerkit reads torch checkpoints with weights_only=True and never unpickles objects; save "
                "`model.state_dict()` with torch.save, or convert it to safetensors.") from None
    else:
        raise RewardModelFormatError(
            f"{path}: unknown checkpoint type {path.suffix or '(no suffix)'!r}; pass a torch state dict "
            f"({', '.join(TORCH_SUFFIXES)}) or a .safetensors file.")
    if isinstance(state, dict) and set(state) == {"state_dict"} and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise RewardModelFormatError(
            f"{path} is not a state dict (a non-empty mapping of names to tensors); it holds a "
            f"{type(state).__name__}. Save the reward model's `state_dict()`.")
    return state


def find_head(state: dict[str, torch.Tensor]) -> tuple[str, str]:
    """(key prefix, head name) of the checkpoint's one head: ``model.`` + ``lm_head`` for RAD's own files."""
    heads = [(k[: -len(f"{h}.weight")], h) for k in state for h in HEAD_NAMES
             if k == f"{h}.weight" or k.endswith(f".{h}.weight")]
    if len(heads) != 1:
        raise RewardModelFormatError(
            "A RAD reward model has exactly one head, `lm_head.weight` (or `score.weight`), optionally under a "
            f"prefix such as `model.`; this checkpoint has {len(heads)} ({', '.join(p + h for p, h in heads) or 'none'}). "
            f"First keys: {', '.join(list(state)[:5])}.")
    return heads[0]


def split_checkpoint(state: dict[str, torch.Tensor], base_prefix: str) -> tuple[dict, torch.Tensor, torch.Tensor | None, str]:
    """(backbone tensors named as in the base model, head weight [n, d], head bias [n] or None, key prefix)."""
    prefix, head_name = find_head(state)
    weight, bias = state[f"{prefix}{head_name}.weight"], state.get(f"{prefix}{head_name}.bias")
    body = f"{prefix}{base_prefix}."
    backbone = {k[len(body):]: v for k, v in state.items() if k.startswith(body)}
    others = [k for k in state if not k.startswith(body) and k not in {f"{prefix}{head_name}.weight", f"{prefix}{head_name}.bias"}]
    if not backbone or others:
        raise RewardModelFormatError(
            f"Expected the backbone's weights under `{body}` next to the head `{prefix}{head_name}`; "
            + (f"found other keys: {', '.join(others[:5])}." if others else "found none.")
            + " Is the checkpoint a GPT-2 reward model and --backbone the model it was fine-tuned from?")
    return backbone, weight, bias, prefix


def import_rad_checkpoint(checkpoint: str | os.PathLike, backbone: str, out: str | os.PathLike, *,
                          name: str = "rad", attribute: str = "", output_index: int = 0,
                          overwrite: bool = False) -> Path:
    """Convert an official RAD reward model into a steerkit reward-model directory; returns ``out``.

    Args:
        checkpoint: the RAD state dict (``pytorch_model.bin``, ``.pt``, ``.safetensors``, or a directory
            holding ``pytorch_model.bin`` / ``model.safetensors``).
        backbone: model reference of the architecture it was fine-tuned from (packaged name, directory, hub
            id; a bare hub name such as ``gpt2`` is read as ``hf:gpt2``). Gives the config and tokenizer;
            its fingerprint is written. The checkpoint's weights replace its first N blocks.
        out: the reward-model directory to write (must not exist or be empty; with ``overwrite``, an
            existing steerkit reward-model directory is replaced).
        output_index: which head output is ρ when the head has several (RAD's code reads output 0).
    """
    out = Path(out).expanduser()
    _check_out(out, overwrite)
    state = read_state_dict(checkpoint)
    find_head(state)  # a file that is no reward model fails before the backbone is loaded
    lm, tokenizer, source = load_causal_lm(_backbone_reference(backbone))
    base = lm.base_model
    body, weight, bias, prefix = split_checkpoint(state, lm.base_model_prefix)
    hidden = output_hidden_size(lm)
    if weight.dim() != 2 or weight.shape[1] != hidden or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
        raise RewardModelFormatError(
            f"The head has weight {tuple(weight.shape)} and bias {None if bias is None else tuple(bias.shape)}; a "
            f"reward head over backbone {backbone!r} must be [n, {hidden}] with bias [n]. Pass the backbone the "
            "checkpoint was fine-tuned from (e.g. gpt2 for the paper's models).")
    if not 0 <= output_index < weight.shape[0]:
        raise RewardModelFormatError(f"output_index {output_index} is out of range: the head has {weight.shape[0]} outputs.")
    num_layers = _checkpoint_depth(base, body)
    rm = RewardModel.from_causal_lm(lm, tokenizer, num_layers, reference=source.reference,
                                    fingerprint=source.fingerprint, name=name, attribute=attribute)
    # no start token: RAD trained and decodes on the text's own ids (steerkit's default prepends the backbone's BOS)
    rm.config = rm.config.model_copy(update={"method": "full", "output_function": "clamp", "start_token_id": None})
    expected = rm.backbone.state_dict()
    body = {k: v for k, v in body.items() if k in expected or not LEGACY_BUFFERS.search(k)}
    missing, unexpected = sorted(set(expected) - set(body)), sorted(set(body) - set(expected))
    shapes = [k for k in expected if k in body and body[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        raise RewardModelFormatError(
            f"The checkpoint's backbone does not match {backbone!r} cut to {num_layers} blocks: missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}, wrong shapes {shapes[:3]}. Pass the backbone the "
            "checkpoint was fine-tuned from.")
    with torch.no_grad():
        rm.backbone.load_state_dict({k: v.to(expected[k].dtype) for k, v in body.items()})
        rm.head.weight.copy_(weight[output_index:output_index + 1])
        rm.head.bias.copy_(bias[output_index:output_index + 1] if bias is not None else torch.zeros(1))
    provenance = {"source": "r-three/RAD", "checkpoint": str(Path(checkpoint).expanduser().resolve()),
                  "checkpoint_sha256": _checkpoint_hash(checkpoint), "key_prefix": prefix,
                  "head_outputs": int(weight.shape[0]), "output_index": output_index, "num_layers": num_layers}
    return _write(rm, out, provenance)


def _backbone_reference(reference: str) -> str:
    try:
        resolve(reference)
    except ModelNotFoundError:
        if "/" not in reference and not Path(reference).expanduser().exists() and not reference.startswith("hf:"):
            return f"hf:{reference}"  # RAD names its backbone "gpt2": a hub id without an owner
        raise
    return reference


def _checkpoint_depth(base, body: dict) -> int:
    owner, attribute, blocks = find_blocks(base)
    path = next(n for n, m in base.named_modules() if m is blocks)
    indices = {int(m.group(1)) for k in body if (m := re.match(rf"{re.escape(path)}\.(\d+)\.", k))}
    if not indices or indices != set(range(len(indices))) or len(indices) > len(blocks):
        raise RewardModelFormatError(
            f"The checkpoint's blocks under `{path}.` are {sorted(indices)[:8] or 'missing'}; expected 0..N-1 with "
            f"N <= {len(blocks)} (the backbone's depth). Pass the backbone the checkpoint was fine-tuned from.")
    return len(indices)


def _checkpoint_hash(checkpoint) -> str:
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        path = next(path / f for f in CHECKPOINT_FILES if (path / f).is_file())
    return sha256_file(path)


def _check_out(out: Path, overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputExistsError(f"--out {out} exists and is not a directory; choose another --out.")
    if out.is_dir() and any(out.iterdir()):
        if not (out / CONFIG_NAME).is_file():
            raise OutputExistsError(f"--out {out} is not empty and is not a steerkit reward model; steerkit will not "
                                    "replace it, even with --overwrite. Choose another --out.")
        if not overwrite:
            raise OutputExistsError(f"--out {out} already holds a reward model; pass --overwrite to replace it.")


def _write(rm: RewardModel, out: Path, provenance: dict) -> Path:
    """Write next to ``out``, then swap it in (a failure leaves any previous directory intact)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.import"))
    try:
        rm.save_pretrained(tmp)
        atomic_write_text(tmp / PROVENANCE_NAME, json.dumps(provenance, indent=2))
        os.chmod(tmp, 0o755)
        old = out.with_name(f".{out.name}.old{os.getpid()}") if out.exists() else None
        if old is not None:
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


"""ONNX export and onnxruntime model of token-level reward models (``kind: token``).

An export directory is a sequence model's (:mod:`.onnx_export`) plus the frozen output embeddings::

    model.onnx              backbone + token head, past KV in, present KV out
    embeddings.safetensors  the output embeddings e_v [V, d] the query is matched against
    tokenizer/              the reward model's tokenizer
    steerkit_onnx.json      the manifest, with "kind": "token" and the SHA-256 of the graph and the embeddings

Graph signature: the inputs of a sequence export (``input_ids``, ``position_ids``, the additive 4D
``attention_mask``, ``past_key_i`` / ``past_value_i``), and as outputs::

    query     float32 ["batch", "new", d]   W h at every new position
    offset    float32 ["batch", "new"]      b·h + c at every new position
    present_key_i / present_value_i         past ++ new

A candidate's reward ``f(⟨query, e_v⟩ + offset)`` is a gather and a dot product outside the graph
(:func:`~steerkit.rewards.token.model.candidate_logits`), the same code as for torch, so k can be the whole
vocabulary without a second graph. :class:`OnnxTokenModel` has the runner interface of
:class:`~steerkit.rewards.token.model.TokenRewardModel` that :class:`~steerkit.rewards.token.session.TokenSession`
drives; parity with torch is checked at export (≤ 1e-4 on probes) and tested.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from ...errors import ExportError
from ..model import OUTPUT_FUNCTIONS, RewardModel
from ..model import score_from_scratch
from .backend import OnnxRuntime, load_export
from .export import (DEFAULT_OPSET, EXTERNAL_DATA_THRESHOLD, _check_against_torch, _check_out_dir,
                          _dynamic_axes, _export_into_cache, _ExportWrapper, _make_tmp_dir, _manifest, _require,
                          _write_graph, _write_manifest_and_publish, cache_entry, model_content_hash, reward_dir_hash)
from .manifest import (DATA_FILE, MANIFEST_NAME, MODEL_FILE, TOKENIZER_DIR, input_names, is_export_dir,
                            output_names, verify_export)
from ..token.model import TokenRewardModel, TokenVocabulary, realized_logits

EMBEDDINGS_FILE = "embeddings.safetensors"


class _TokenExportWrapper(_ExportWrapper):
    """Flat-tensor signature around :meth:`TokenRewardModel.project` with a transformers DynamicCache."""

    def forward(self, input_ids, position_ids, attention_mask, *past):
        cache = self._cache(past)
        query, offset, cache = self.model.project(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                                  past_key_values=cache, use_cache=True)
        return (query, offset, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


def export_token_onnx(model: TokenRewardModel, out_dir, *, source_hash: str | None = None, source: dict | None = None,
                      opset: int = DEFAULT_OPSET, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
                      overwrite: bool = False, check: bool = True) -> Path:
    """Export a token-level reward model to ``out_dir`` (a temporary sibling renamed into place); with ``check``
    onnxruntime must reproduce torch to 1e-4 on probe inputs first. Same arguments as
    :func:`~steerkit.rewards.onnx.export.export_onnx`."""
    onnx = _require("onnx")
    from safetensors.torch import save_file

    out = _check_out_dir(out_dir, overwrite)
    started = time.perf_counter()
    source_hash = source_hash or model_content_hash(model)
    names_in, names_out = input_names(model.config.num_layers), output_names(model.config.num_layers, "token")
    wrapper = _TokenExportWrapper(model).eval()
    tmp = _make_tmp_dir(out)
    try:
        external = _write_graph(onnx, wrapper, model, tmp, names_in, names_out, _dynamic_axes(names_in, names_out, 2),
                                opset, external_data_threshold)
        save_file({"embeddings": model.output_embeddings.detach().float().contiguous().cpu()},
                  str(tmp / EMBEDDINGS_FILE))
        model.tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
        files = [MODEL_FILE] + ([DATA_FILE] if external else []) + [EMBEDDINGS_FILE]
        manifest = _manifest(onnx, model, tmp, files, source_hash, source, opset, names_in, names_out, external,
                             kind="token", embeddings=EMBEDDINGS_FILE)
        if check:
            _check_against_torch(tmp, wrapper, names_in, model)
        _write_manifest_and_publish(tmp, out, manifest, started)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_token_export(directory, *, reward_hash: str | None = None, opset: int = DEFAULT_OPSET) -> Path:
    """The cached export of a token-level reward-model directory, made on first use (as for sequence models)."""
    directory = Path(directory)
    reward_hash = reward_hash or reward_dir_hash(directory)
    entry = cache_entry(reward_hash, opset)
    if (entry / MANIFEST_NAME).is_file():
        return entry
    return _export_into_cache(entry, lambda staging: export_token_onnx(
        TokenRewardModel.from_pretrained(directory), staging, source_hash=reward_hash,
        source={"kind": "directory", "directory": str(directory.resolve())}, opset=opset))


def token_export_source(reference: str) -> tuple[TokenRewardModel, str, dict]:
    """(model, reward hash, provenance) of a token-level reward model: a directory, or a registered name whose
    factory ships one (the ``export_source`` of the ``token`` kind, :mod:`steerkit.rewards.kinds`)."""
    from ..kinds import source_directory

    path, provenance = source_directory(reference)
    if path is None:
        raise ExportError(f"{reference!r} is neither a reward-model directory nor a registered reward that ships one.")
    if is_export_dir(path):
        raise ExportError(f"{path} is already an ONNX export; pass the source reward-model directory.")
    return (TokenRewardModel.from_pretrained(path), reward_dir_hash(path),
            {**provenance, "directory": str(path.resolve())})


class OnnxTokenModel(TokenVocabulary):
    """A verified token-level ONNX export run by onnxruntime, with the runner interface of
    :class:`~steerkit.rewards.token.model.TokenRewardModel` (``run``, ``empty_past``, ``output_embeddings``,
    ``output``, ``encode``, ``score_texts``). Loading needs neither torch weights nor the backbone."""

    backend = "onnx"
    kind = "token"

    def __init__(self, directory, *, expected_hash: str | None = None, tokenizer=None,
                 providers: list[str] | None = None, threads: int | None = None):
        from safetensors.torch import load_file

        self.directory = Path(directory).expanduser()
        self.manifest, self.config, self.tokenizer = verify_export(self.directory, expected_hash=expected_hash,
                                                                   tokenizer=tokenizer)
        self.precision = self.manifest.get("precision", "fp32")
        if self.manifest.get("kind") != "token":
            raise ExportError(f"{self.directory} is a sequence-level export; load it with load_reward(..., "
                              "backend='onnx').")
        self.runtime = OnnxRuntime(self.directory, self.manifest, providers, threads)
        self.output_embeddings = load_file(str(self.directory / EMBEDDINGS_FILE))["embeddings"]
        self.device = torch.device("cpu")

    @classmethod
    def load(cls, reference, *, precision: str = "fp32", **kwargs) -> "OnnxTokenModel":
        """A token-level export directory, or a token-level reward-model directory (exported on first use); with
        ``precision="int8"`` its cached int8 export (:mod:`.quantize`)."""
        return load_export(cls, reference, ensure_token_export,
                           "{path} is neither an ONNX export nor a reward-model directory.", precision=precision,
                           **kwargs)

    def __repr__(self) -> str:
        return f"OnnxTokenModel({self.config.name!r}, {self.directory}, layers={self.config.num_layers})"


    def empty_past(self, batch: int) -> list[torch.Tensor]:
        return [t.cpu() for t in self.runtime.empty_past(batch)]

    def run(self, input_ids, position_ids, mask, past):
        """Same as :meth:`TokenRewardModel.run`: (query [B, n, d], offset [B, n], present KV)."""
        inputs = [input_ids.long(), position_ids.long(), mask.float(), *past]
        feeds = {n: t.detach().cpu().contiguous().numpy() for n, t in zip(self.runtime.input_names, inputs)}
        with self.runtime._lock:
            outputs = self.runtime.session.run(self.runtime.output_names, feeds)
        tensors = [torch.from_numpy(o) for o in outputs]
        return tensors[0], tensors[1], tensors[2:]

    def output(self, logits: torch.Tensor) -> torch.Tensor:
        return OUTPUT_FUNCTIONS[self.config.output_function](logits)

    def encode(self, texts: list[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        return RewardModel.encode(self, texts, max_length)

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32, per_prefix: bool = False):
        """Reward of each text (and with ``per_prefix`` of every prefix), from scratch."""
        def rewards(ids, positions, mask4d, mask):
            query, offset, _ = self.run(ids, positions, mask4d, self.empty_past(ids.shape[0]))
            return self.output(realized_logits(query, offset, self.output_embeddings, ids, mask.long(),
                                               self.textless_ids))

        return score_from_scratch(self.encode, texts, batch_size, per_prefix, rewards, config=self.config)

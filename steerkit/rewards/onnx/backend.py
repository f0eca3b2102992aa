"""onnxruntime backend: the same shared-prefix cached scoring as :mod:`.torch_cache`, on an ONNX export.

* :class:`OnnxRewardModel` stands in for :class:`~steerkit.rewards.model.RewardModel` wherever the scorer
  and the sessions need one (``config``, ``tokenizer``, ``encode``, ``score_texts``) but runs the verified
  export (see :mod:`.onnx_export`) in onnxruntime. Loading it needs neither torch weights nor the backbone.
* :class:`OnnxScoringCache` is a :class:`~steerkit.rewards.cache.SharedPrefixCache`, like
  :class:`~steerkit.rewards.sequence.torch_cache.TorchScoringCache`: the same hole and rollback bookkeeping. The k candidate blocks
  are one forward over the shared prefix; their KV comes back as ``present_*`` outputs and stays pending
  until :meth:`~OnnxScoringCache.commit_choice` keeps the chosen block's KV.

KV storage: the cache keeps torch tensors. On CPU they are zero-copy views of the numpy arrays that
onnxruntime returns (``torch.from_numpy``) and are handed back as numpy views, so the step logic is written
once for CPU and CUDA. With onnxruntime-gpu, the CUDA execution provider and a CUDA build of torch, the KV
lives on the GPU between steps and every run goes through IO binding (inputs and outputs bound to device
buffers, no host round trip). That path is written but **untested on a GPU** (no GPU where it was written);
with the CUDA provider but a CPU-only torch, runs fall back to host arrays (correct, slower).

Which export is used: ``OnnxRewardModel.load(ref)`` accepts an export directory (verified against its
manifest), or a reward-model directory, whose export is made on first use into the steerkit cache
(``$STEERKIT_CACHE/onnx/<key>``, keyed by the reward hash, written atomically) and verified on every load.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from ...errors import ExportError
from ...model_copies import converted_copy
from ..attention import additive
from ..cache import SharedPrefixCache, left_pad_kv, pick_columns
from ..model import CONFIG_NAME, RewardModel, score_from_scratch
from .export import INSTALL_HINT, ensure_cached_export, model_content_hash, reward_dir_hash
from .manifest import MODEL_FILE, is_export_dir, verify_export
from .quantize import PRECISION_FP32, PRECISION_INT8, ensure_int8_export, export_precision

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ExportError(f"backend 'onnx' needs onnxruntime: {INSTALL_HINT}") from None
    return onnxruntime


def default_providers() -> list[str]:
    """``$STEERKIT_ONNX_PROVIDERS`` (comma separated), else CUDA when onnxruntime-gpu offers it, else CPU."""
    ort = _onnxruntime()
    env = os.environ.get("STEERKIT_ONNX_PROVIDERS")
    if env:
        return [p.strip() for p in env.split(",") if p.strip()]
    available = ort.get_available_providers()
    return [CUDA, CPU] if CUDA in available else [CPU]


class OnnxRuntime:
    """One onnxruntime session over an export, and the device-specific way of running it.

    ``run`` takes and returns torch tensors on :attr:`device`: rewards [B, n] and the present KV
    (2·L tensors [B, H, past + n, d], key then value per layer).
    """

    def __init__(self, directory: Path, manifest: dict, providers: list[str] | None = None,
                 threads: int | None = None):
        ort = self._ort = _onnxruntime()
        self.num_layers = int(manifest["num_layers"])
        self.kv_heads = int(manifest["num_kv_heads"])
        self.head_dim = int(manifest["head_dim"])
        self.input_names = list(manifest["inputs"])
        self.output_names = list(manifest["outputs"])
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        threads = threads or int(os.environ.get("STEERKIT_ONNX_THREADS", "0")) or torch.get_num_threads()
        options.intra_op_num_threads = self.threads = threads
        options.inter_op_num_threads = 1
        # Do not keep spinning after a run: the LM's torch forward runs right after on the same cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = providers or default_providers()
        try:
            self.session = ort.InferenceSession(str(Path(directory) / MODEL_FILE), sess_options=options,
                                                providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ExportError(f"onnxruntime could not load {Path(directory) / MODEL_FILE}: {exc}") from None
        self.providers = self.session.get_providers()
        self.device = torch.device("cpu")
        self.io_binding = os.environ.get("STEERKIT_ONNX_IOBINDING") == "1"
        if self.providers and self.providers[0] == CUDA:
            if torch.cuda.is_available():
                options = dict(self.session.get_provider_options().get(CUDA, {}))
                self.device = torch.device("cuda", int(options.get("device_id", 0)))
                self.io_binding = True
            else:
                warnings.warn("onnxruntime runs on CUDA but torch has no CUDA, so the reward KV cache is "
                              "copied between host and device at every step. Install a CUDA build of torch "
                              "to keep it on the GPU.", RuntimeWarning, stacklevel=2)
        self._lock = threading.Lock()

    def empty_past(self, batch: int) -> list[torch.Tensor]:
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [torch.zeros(shape, dtype=torch.float32, device=self.device) for _ in range(2 * self.num_layers)]

    def run(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
            past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        inputs = [input_ids.long(), position_ids.long(), mask.float(), *past]
        if self.io_binding:
            return self._run_bound(inputs)
        feeds = {name: t.detach().cpu().contiguous().numpy() for name, t in zip(self.input_names, inputs)}
        with self._lock:
            outputs = self.session.run(self.output_names, feeds)
        tensors = [torch.from_numpy(o) for o in outputs]
        return tensors[0], tensors[1:]

    def _run_bound(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """IO binding: inputs and outputs are torch buffers on :attr:`device` bound by pointer, so nothing is
        copied between steps. Used for CUDA (untested on a GPU); on CPU only when ``STEERKIT_ONNX_IOBINDING=1``
        (the tests exercise the binding code that way)."""
        device = self.device
        inputs = [t.to(device).contiguous() for t in inputs]
        B, n = inputs[0].shape
        total = inputs[3].shape[2] + n
        outputs = [torch.empty((B, n), dtype=torch.float32, device=device)] + [
            torch.empty((B, self.kv_heads, total, self.head_dim), dtype=torch.float32, device=device)
            for _ in range(2 * self.num_layers)]
        kind, index = device.type, device.index or 0
        binding, keep = self.session.io_binding(), []
        for name, t in zip(self.input_names, inputs):
            if t.numel() == 0:  # the zero-length past of a prefill has no buffer to point at
                value = self._ort.OrtValue.ortvalue_from_shape_and_type(tuple(t.shape), _numpy_dtype(t), kind, index)
                keep.append(value)
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_input(name, kind, index, _numpy_dtype(t), tuple(t.shape), t.data_ptr())
        for name, t in zip(self.output_names, outputs):
            binding.bind_output(name, kind, index, np.float32, tuple(t.shape), t.data_ptr())
        if kind == "cuda":
            torch.cuda.synchronize(device)  # inputs written on torch's stream are complete before ORT reads them
        with self._lock:
            self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return outputs[0], outputs[1:]


def _numpy_dtype(t: torch.Tensor):
    return {torch.float32: np.float32, torch.int64: np.int64}[t.dtype]


class OnnxRewardModel:
    """A verified ONNX export of a reward model, usable wherever the scorer expects a ``RewardModel``."""

    backend = "onnx"

    def __init__(self, directory: str | os.PathLike, *, expected_hash: str | None = None, tokenizer=None,
                 providers: list[str] | None = None, threads: int | None = None):
        self.directory = Path(directory).expanduser()
        self.manifest, self.config, self.tokenizer = verify_export(self.directory, expected_hash=expected_hash,
                                                                   tokenizer=tokenizer)
        self.reward_hash = self.manifest["source"]["reward_hash"]
        self.precision = export_precision(self.manifest)
        self.runtime = OnnxRuntime(self.directory, self.manifest, providers, threads)

    @classmethod
    def load(cls, reference: str | os.PathLike, *, precision: str = PRECISION_FP32, **kwargs) -> "OnnxRewardModel":
        """An export directory, or a reward-model directory (exported into the cache on first use). With
        ``precision="int8"`` an fp32 export (given, or made) is replaced by its cached int8 export
        (:mod:`.quantize`)."""
        return load_export(cls, reference, ensure_cached_export, "{path} is neither an ONNX export (no "
                           f"steerkit_onnx.json) nor a reward-model directory (no {CONFIG_NAME}).",
                           precision=precision, **kwargs)

    @classmethod
    def from_torch(cls, model: RewardModel, *, precision: str = PRECISION_FP32, **kwargs) -> "OnnxRewardModel":
        """The cached export of an in-memory reward model (keyed by its content hash), int8 with ``precision``."""
        if model.tokenizer is None:
            raise ExportError("The reward model has no tokenizer; it cannot be exported.")
        reward_hash = model_content_hash(model)
        directory = with_precision(ensure_cached_export(model, reward_hash=reward_hash), precision)
        return cls(directory, expected_hash=reward_hash, tokenizer=model.tokenizer, **kwargs)

    def __repr__(self) -> str:
        return (f"OnnxRewardModel({self.config.name!r}, {self.directory}, layers={self.config.num_layers}, "
                f"providers={self.runtime.providers})")

    def encode(self, texts: list[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Start token (if the config has one) + text, left padded: exactly :meth:`RewardModel.encode`."""
        return RewardModel.encode(self, texts, max_length)

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32, per_prefix: bool = False):
        """Reward of each text (from scratch: one prefill per batch, zero-length past)."""
        def rewards(ids, positions, mask4d, mask):
            return self.runtime.run(ids, positions, mask4d, self.runtime.empty_past(mask.shape[0]))[0].cpu()

        return score_from_scratch(self.encode, texts, batch_size, per_prefix, rewards, config=self.config)


class OnnxScoringCache(SharedPrefixCache):
    """Incremental KV state over B rows in onnxruntime (bookkeeping: :class:`SharedPrefixCache`).

    The KV is a list of torch tensors ``past`` (``past_key_i``, ``past_value_i`` interleaved). A forward
    returns the extended KV as new ``present_*`` tensors, so the pending blocks' KV stays aside until a commit
    keeps the chosen block's columns.
    """

    def __init__(self, model: OnnxRewardModel, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model = model
        self.runtime = model.runtime
        super().__init__(input_ids.shape[0], self.runtime.device)
        self.past = self.runtime.empty_past(input_ids.shape[0])
        self.append(input_ids, attention_mask)

    @classmethod
    def for_model(cls, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                  precision: str = PRECISION_FP32) -> "OnnxScoringCache":
        """A cache over an :class:`OnnxRewardModel`, or over the (cached, memoised) export of a torch model (int8
        with ``precision="int8"``).

        A torch model is exported the first time it is used with this backend; changing its weights
        afterwards is not seen by the memoised export (build a new model object, or use backend "torch").
        """
        if isinstance(model, RewardModel):
            model = converted_copy(model, f"onnx:{precision}",
                                   lambda m: OnnxRewardModel.from_torch(m, precision=precision))
        elif precision != PRECISION_FP32 and isinstance(model, OnnxRewardModel) and model.precision != precision:
            raise ExportError(f"{model.directory} is an {model.precision} export; the {precision} backend needs "
                              f"its {precision} export: load the reward with that backend.")
        if not isinstance(model, OnnxRewardModel):
            raise ExportError(f"backend 'onnx' needs a RewardModel or an OnnxRewardModel, got {type(model).__name__}.")
        return cls(model, input_ids, attention_mask)

    def _forward(self, ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor, past=None):
        past = self.past if past is None else past
        return self.runtime.run(ids, position_ids, additive(allowed.cpu()).to(self.device), past)

    def _forward_rows(self, rows: torch.Tensor, ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor):
        return self._forward(ids, position_ids, allowed, [t.index_select(0, rows.to(t.device)) for t in self.past])

    def _keep_columns(self, columns: list[torch.Tensor]) -> None:
        self.past = [torch.cat([t, c.to(t.device)], dim=2) for t, c in zip(self.past, columns)]

    def _store(self, kv: list[torch.Tensor]) -> None:
        self.past = kv

    def _discard_blocks(self, kv, count: int) -> None:
        pass  # the pending KV is a separate output; self.past never held it

    def _keep_block(self, kv: list[torch.Tensor], index: torch.Tensor) -> None:
        T = self.length
        self.past = [torch.cat([t[:, :, :T], pick_columns(t, index)], dim=2) for t in kv]  # t: [B, H, T + k*m, d]

    def _truncate(self, keep: int) -> None:
        self.past = [t[:, :, :keep] for t in self.past]

    def _take_rows(self, index: torch.Tensor, start: int) -> None:
        self.past = [t.index_select(0, index.to(t.device))[:, :, start:] for t in self.past]

    def _join_rows(self, other: "OnnxScoringCache", pad_self: int, pad_other: int) -> None:
        self.past = [torch.cat([left_pad_kv(a, pad_self), left_pad_kv(b.to(a.device), pad_other)])
                     for a, b in zip(self.past, other.past)]


def with_precision(export_dir: Path, precision: str) -> Path:
    """The export to run for ``precision``: ``export_dir`` itself for fp32 (an export runs as it was made), its
    cached int8 export (made on first use, :func:`~.quantize.ensure_int8_export`) for int8."""
    if precision == PRECISION_FP32:
        return export_dir
    if precision == PRECISION_INT8:
        return ensure_int8_export(export_dir)
    raise ExportError(f"Unknown ONNX precision {precision!r}; use {PRECISION_FP32!r} or {PRECISION_INT8!r}.")


def load_export(cls, reference, ensure_export, error: str, *, precision: str = PRECISION_FP32, **kwargs):
    """``cls`` loaded from ``reference``: an export directory, or a reward-model directory (or its config file)
    exported by ``ensure_export(path, reward_hash=...)`` on first use; else an ExportError, ``error`` formatted
    with ``path``. With ``precision="int8"`` the export's int8 export (:func:`with_precision`) is loaded."""
    path = Path(reference).expanduser()
    if path.name == CONFIG_NAME:
        path = path.parent
    if is_export_dir(path):
        return cls(with_precision(path, precision), **kwargs)
    if (path / CONFIG_NAME).is_file():
        reward_hash = reward_dir_hash(path)
        directory = with_precision(ensure_export(path, reward_hash=reward_hash), precision)
        return cls(directory, expected_hash=reward_hash, **kwargs)
    raise ExportError(error.format(path=path))

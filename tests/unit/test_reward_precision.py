"""Reduced-precision reward backends (issue 25, item 2): ``onnx-int8``, ``torch-bf16``, ``torch-bf16-compute`` and
``torch-int8`` on tiny random models.

Each precision must stay near fp32 (within a stated bound) and must *not* be bit-identical to it, so a quantization
that is silently skipped fails as surely as a broken one. The int8 export is cached next to the fp32 export and
written atomically; bad choices raise typed errors; steering runs end to end through every surface a backend name
reaches (Python, config, CLI).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import steerkit
from steerkit.errors import ConfigError, ExportError, InvalidArgumentError
from steerkit.rewards.kinds import clear_model_cache
from steerkit.rewards.model import RewardModel, TokenHeadSettings
from steerkit.rewards.precision import (BF16, BF16_COMPUTE, INT8, Bf16Linear, Bf16MatmulLinear, Int8MatmulLinear,
                                        as_reduced, reduced_weights)
from steerkit.rewards.token.model import TokenRewardModel

TEXTS = ["The quick brown fox jumps over", "You are a wonderful friend", "I hate", "Café déjà vu 🙂",
         "Numbers 1 2 3"]
#: |Δρ| bounds against fp32 on these tiny models, over scored texts, their prefixes and 6 decoding steps of 7
#: candidates (measured with onnxruntime 1.32 / torch 2.13: int8 0.017 sequence, 0.006 token; bf16 0.0023 sequence,
#: 0.0011 token). A broken quantization is off by 0.1 or more (the export's own probe refuses it beyond 0.1).
INT8_BOUND = 0.05
BF16_BOUND = 0.01
#: bf16 matmuls round each product's input and output to bf16 too (measured: 0.0058 sequence, 0.0026 token)
BF16_COMPUTE_BOUND = 0.015
#: int8 matmuls quantize each product's input per row too (measured: 0.018 sequence, 0.0068 token), as onnx-int8 does
TORCH_INT8_BOUND = 0.05
#: backend -> (precision, its linear layer, the weights' dtype, |Δρ| bound)
TORCH_BACKENDS = {"torch-bf16": (BF16, Bf16Linear, torch.bfloat16, BF16_BOUND),
                  "torch-bf16-compute": (BF16_COMPUTE, Bf16MatmulLinear, torch.bfloat16, BF16_COMPUTE_BOUND),
                  "torch-int8": (INT8, Int8MatmulLinear, torch.int8, TORCH_INT8_BOUND)}


def _int8_ready():
    try:
        from steerkit.rewards.onnx.quantize import _int8_support
    except ImportError as exc:  # no onnx in this environment
        return str(exc)
    return _int8_support()


_problem = _int8_ready()
requires_int8 = pytest.mark.skipif(_problem is not None, reason=f"onnx-int8 unavailable here: {_problem}")


@pytest.fixture(scope="module")
def backbone(tmp_path_factory, tokenizer):
    from steerkit.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("precision-backbone"), tokenizer, seed=5)


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory, backbone):
    rm = RewardModel.from_backbone(str(backbone), name="tiny-precision")
    torch.manual_seed(11)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm.save_pretrained(tmp_path_factory.mktemp("rm") / "tiny-rm")


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory, backbone):
    rm = TokenRewardModel.from_backbone(str(backbone), name="tiny-precision-token", head=TokenHeadSettings(rank=6))
    torch.manual_seed(0)
    for p in rm.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return rm.save_pretrained(tmp_path_factory.mktemp("rm-token") / "tiny-token")


def _decoding_rewards(reward, tokenizer, steps: int = 6, k: int = 7) -> torch.Tensor:
    """The rewards of k random candidates at each of ``steps`` steps over two rows (committing candidate 0)."""
    session = reward.start(["I hate it", "You are a wonderful friend"], tokenizer)
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        candidates = torch.randint(3, len(tokenizer), (2, k), generator=g)
        out.append(session.score(candidates))
        session.commit(candidates[:, 0])
    return torch.stack(out)


def _gap(reference, reduced, tokenizer) -> tuple[float, bool]:
    """(max |Δρ| over scored texts, their prefixes and decoding-time candidates; whether all were identical)."""
    a, pa = reference.model.score_texts(TEXTS, per_prefix=True)
    b, pb = reduced.model.score_texts(TEXTS, per_prefix=True)
    flat_a = torch.tensor(a + [x for r in pa for x in r])
    flat_b = torch.tensor(b + [x for r in pb for x in r])
    da, db = _decoding_rewards(reference, tokenizer), _decoding_rewards(reduced, tokenizer)
    gap = max(float((flat_a - flat_b).abs().max()), float((da - db).abs().max()))
    return gap, bool(torch.equal(flat_a, flat_b) and torch.equal(da, db))


# -- ρ near fp32, never identical ---------------------------------------------------------------------------------
@requires_int8
@pytest.mark.parametrize("which", ["reward_dir", "token_dir"], ids=["sequence", "token"])
def test_int8_rewards_are_near_fp32_and_not_identical(which, request, tokenizer, steerkit_cache):
    directory = request.getfixturevalue(which)
    fp32, int8 = steerkit.load_reward(str(directory)), steerkit.load_reward(str(directory), backend="onnx-int8")
    assert int8.backend == "onnx-int8" and int8.model.precision == "int8"
    gap, identical = _gap(fp32, int8, tokenizer)
    assert not identical, "the int8 rewards are exactly fp32's: the quantization was skipped"
    assert 0 < gap <= INT8_BOUND, gap


@pytest.mark.parametrize("backend", sorted(TORCH_BACKENDS))
@pytest.mark.parametrize("which", ["reward_dir", "token_dir"], ids=["sequence", "token"])
def test_reduced_torch_rewards_are_near_fp32_and_not_identical(which, backend, request, tokenizer):
    directory = request.getfixturevalue(which)
    _, layer, dtype, bound = TORCH_BACKENDS[backend]
    fp32, reduced = steerkit.load_reward(str(directory)), steerkit.load_reward(str(directory), backend=backend)
    assert reduced.backend == backend
    linears = [m for m in reduced.model.backbone.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is layer and m.weight.dtype == dtype for m in linears)
    # only the backbone's matmul weights: embeddings, norms, the head, activations and the KV cache stay fp32
    assert reduced.model.backbone.get_input_embeddings().weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in reduced.model.head.parameters())
    gap, identical = _gap(fp32, reduced, tokenizer)
    assert not identical, f"the {backend} rewards are exactly fp32's: the weights were not converted"
    assert 0 < gap <= bound, gap


@pytest.mark.parametrize("backend", sorted(TORCH_BACKENDS))
def test_reduced_torch_of_an_in_memory_model_converts_a_copy_once(backend, reward_dir):
    precision, layer, _, _ = TORCH_BACKENDS[backend]
    model = RewardModel.from_pretrained(reward_dir)
    scorer = steerkit.RewardModelScorer(model, backend=backend)
    enc = model.encode(["I hate it"])
    cache = scorer.new_cache(enc["input_ids"], enc["attention_mask"])
    assert cache.model is not model and cache.model is as_reduced(model, precision)
    assert reduced_weights(cache.model, precision) is cache.model
    assert any(type(m) is layer for m in cache.model.backbone.modules())
    assert all(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32  # the caller's model is untouched
               for m in model.backbone.modules() if isinstance(m, torch.nn.Linear))


# -- the int8 export: cached next to the fp32 export, atomically, verified -------------------------------------------
@requires_int8
def test_int8_export_is_cached_next_to_the_fp32_export_and_made_once(reward_dir, steerkit_cache, capfd):
    from steerkit.rewards.onnx.export import cache_entry, reward_dir_hash
    from steerkit.rewards.onnx.manifest import MANIFEST_NAME, MODEL_FILE, read_manifest
    from steerkit.rewards.onnx.quantize import BLOCK_SIZE, int8_cache_entry

    copy = shutil.copytree(reward_dir, steerkit_cache.parent / "rm-cache-test")
    rm = RewardModel.from_pretrained(copy)
    torch.nn.init.normal_(rm.head.weight, std=0.3)  # its own hash: nothing cached for it yet
    rm.save_pretrained(copy)
    capfd.readouterr()
    first = steerkit.load_reward(str(copy), backend="onnx-int8")
    err = capfd.readouterr().err
    assert "exporting" in err and "quantizing" in err and "int8" in err
    fp32_entry = cache_entry(reward_dir_hash(copy))
    fp32_manifest = read_manifest(fp32_entry)
    assert first.model.directory == int8_cache_entry(fp32_manifest)
    assert first.model.directory.parent == fp32_entry.parent  # next to the fp32 export
    manifest = json.loads((first.model.directory / MANIFEST_NAME).read_text())
    assert manifest["precision"] == "int8" and fp32_manifest.get("precision", "fp32") == "fp32"
    q = manifest["quantization"]
    assert q["method"] == "MatMulNBits" and q["bits"] == 8 and q["block_size"] == BLOCK_SIZE and q["nodes"] > 0
    assert q["source_export"]["model_sha256"] == fp32_manifest["files"][MODEL_FILE]["sha256"]
    assert manifest["source"]["reward_hash"] == reward_dir_hash(copy)
    # no staging or temporary directories are left behind
    assert not [p.name for p in fp32_entry.parent.iterdir() if "staging" in p.name or ".tmp" in p.name]
    mtime = (first.model.directory / MODEL_FILE).stat().st_mtime_ns
    again = steerkit.load_reward(str(copy), backend="onnx-int8")
    assert "quantizing" not in capfd.readouterr().err and again.model.directory == first.model.directory
    assert (again.model.directory / MODEL_FILE).stat().st_mtime_ns == mtime


@requires_int8
def test_a_failed_quantization_publishes_nothing(reward_dir, steerkit_cache, monkeypatch):
    from steerkit.rewards.onnx import quantize
    from steerkit.rewards.onnx.backend import OnnxRewardModel

    fp32 = OnnxRewardModel.load(reward_dir).directory
    entry = quantize.int8_cache_entry(quantize.read_manifest(fp32))
    shutil.rmtree(entry, ignore_errors=True)

    def broken(model, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(quantize, "quantize_graph", broken)
    clear_model_cache()  # as in a process that has not loaded this directory on onnx-int8 yet
    with pytest.raises(RuntimeError, match="disk full"):
        steerkit.load_reward(str(reward_dir), backend="onnx-int8")
    assert not entry.exists()
    assert not [p.name for p in entry.parent.iterdir() if entry.name in p.name or "staging" in p.name]


@requires_int8
def test_a_skipped_or_broken_quantization_is_refused(reward_dir, steerkit_cache, tmp_path, monkeypatch):
    from steerkit.rewards.onnx import quantize
    from steerkit.rewards.onnx.backend import OnnxRewardModel

    fp32 = OnnxRewardModel.load(reward_dir).directory
    monkeypatch.setattr(quantize, "quantize_graph", lambda model, **kw: 1)  # claims a node, changes nothing
    with pytest.raises(ExportError, match="quantization had no effect"):
        quantize.quantize_export(fp32, tmp_path / "skipped")
    monkeypatch.undo()
    real = quantize._quantized_weight
    monkeypatch.setattr(quantize, "_quantized_weight", lambda w, b: (real(w, b)[0], real(w, b)[1] * 40))
    with pytest.raises(ExportError, match="differs from fp32"):
        quantize.quantize_export(fp32, tmp_path / "broken")
    assert not (tmp_path / "skipped").exists() and not (tmp_path / "broken").exists()


@requires_int8
def test_int8_export_dir_runs_on_onnx_int8_under_auto_and_is_verified(reward_dir, steerkit_cache, tmp_path):
    from steerkit.rewards.backends import resolve_backend
    from steerkit.rewards.onnx.backend import OnnxRewardModel
    from steerkit.rewards.onnx.manifest import MODEL_FILE
    from steerkit.rewards.onnx.quantize import quantize_export

    fp32 = OnnxRewardModel.load(reward_dir).directory
    out = quantize_export(fp32, tmp_path / "tiny-int8")
    assert resolve_backend("auto", out) == "onnx-int8" and resolve_backend("auto", fp32) == "onnx"
    auto = steerkit.load_reward(str(out))
    assert auto.backend == "onnx-int8" and auto.model.precision == "int8" and auto.model.directory == out
    # an fp32 export named with onnx-int8 is quantized; an int8 export is used as it is
    assert steerkit.load_reward(str(fp32), backend="onnx-int8").model.precision == "int8"
    with pytest.raises(ExportError, match="already an int8 export"):
        quantize_export(out, tmp_path / "twice")
    bad = shutil.copytree(out, tmp_path / "corrupt")
    data = bytearray((bad / MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(ExportError, match="corrupted"):
        steerkit.load_reward(str(bad))


# -- typed errors ------------------------------------------------------------------------------------------------
def test_an_unknown_precision_backend_is_a_typed_error_listing_the_choices(reward_dir):
    from steerkit.config import SteeringConfig

    for bad in ("onnx-int4", "int8", "bf16"):
        with pytest.raises(InvalidArgumentError, match=f"Unknown reward backend '{bad}'; use 'torch', 'onnx', "
                                                       "'torch-bf16', 'torch-bf16-compute', 'torch-int8'(,| or) 'onnx-int8'"):
            steerkit.load_reward(str(reward_dir), backend=bad)
        with pytest.raises(ConfigError, match=f"backend: Unknown reward backend '{bad}'"):
            SteeringConfig.from_dict({"backend": bad})
    from steerkit.rewards.onnx.backend import with_precision

    with pytest.raises(ExportError, match="Unknown ONNX precision 'int4'"):
        with_precision(reward_dir, "int4")


def test_an_onnxruntime_without_8bit_kernels_says_which_version_to_install(reward_dir, steerkit_cache, monkeypatch):
    pytest.importorskip("onnx")
    from steerkit.rewards.onnx import quantize

    monkeypatch.setattr(quantize, "_int8_support", lambda: "backend 'onnx-int8' needs onnxruntime >= 1.22 (8-bit "
                                                           "MatMulNBits kernels); this is onnxruntime 1.19.0")
    clear_model_cache()  # as in a process that has not loaded this directory on onnx-int8 yet
    with pytest.raises(ExportError, match=r"needs onnxruntime >= 1\.22"):
        steerkit.load_reward(str(reward_dir), backend="onnx-int8")
    assert not quantize.int8_supported()


def test_a_reduced_torch_model_without_linear_layers_is_a_typed_error():
    from steerkit.errors import RewardModelFormatError

    class NoLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Embedding(4, 4)
            self.config = type("C", (), {"name": "odd"})()

    with pytest.raises(RewardModelFormatError, match="no linear layer"):
        reduced_weights(NoLinear())
    with pytest.raises(RewardModelFormatError, match="needs a steerkit reward model"):
        reduced_weights(torch.nn.Linear(2, 2))


def test_a_model_converted_for_one_reduced_backend_is_refused_by_another(reward_dir):
    from steerkit.errors import RewardModelFormatError

    stored = steerkit.load_reward(str(reward_dir), backend="torch-bf16").model
    with pytest.raises(RewardModelFormatError, match="already converted for 'torch-bf16'; load it again"):
        reduced_weights(stored, BF16_COMPUTE)
    stored = steerkit.load_reward(str(reward_dir), backend="torch-int8").model
    with pytest.raises(RewardModelFormatError, match="already converted for 'torch-int8'; load it again"):
        reduced_weights(stored, BF16)


def test_torch_int8_refuses_a_gpu(reward_dir):
    from steerkit.devices import move_reward

    reward = steerkit.load_reward(str(reward_dir), backend="torch-int8")
    assert move_reward(reward, "cpu") is reward
    with pytest.raises(InvalidArgumentError, match="'torch-int8' runs on the CPU only, not on device 'cuda'"):
        move_reward(reward, "cuda")


# -- steering end to end, through every surface a backend name reaches ----------------------------------------------
@pytest.mark.parametrize("backend", [pytest.param("onnx-int8", marks=requires_int8), *sorted(TORCH_BACKENDS)])
def test_steering_runs_end_to_end(backend, reward_dir, token_dir, lm, tokenizer, steerkit_cache, tmp_path):
    from typer.testing import CliRunner

    from steerkit.cli import app
    from steerkit.config import SteeringConfig

    kw = dict(lm=(lm, tokenizer), rewards={str(reward_dir): -8.0, str(token_dir): -4.0}, k=8, max_new_tokens=10,
              seed=3, eos_token_id=[], return_traces=True)
    reduced = steerkit.generate(["The quick", "You are"], backend=backend, **kw)
    fp32 = steerkit.generate(["The quick", "You are"], backend="torch", **kw)
    assert reduced.sequences.shape == fp32.sequences.shape
    step = reduced.traces[0][0]
    assert all(((r >= 0) & (r <= 1)).all() for r in step.rewards.values())
    # a config file names it as it names any backend
    config = SteeringConfig.from_dict({"backend": backend, "rewards": [{"name": str(reward_dir), "beta": -8}]})
    (term,) = config.build_terms()
    assert term.reward.backend == backend
    # and so does the command line
    result = CliRunner().invoke(app, ["score", "I hate it", "hello", "-r", str(reward_dir), "--backend", backend,
                                      "--json"])
    assert result.exit_code == 0, result.output
    rewards = [r["reward"] for r in json.loads(result.stdout)["results"]]
    reference = RewardModel.from_pretrained(reward_dir).score_texts(["I hate it", "hello"])
    bound = INT8_BOUND if backend == "onnx-int8" else TORCH_BACKENDS[backend][3]
    assert max(abs(a - b) for a, b in zip(rewards, reference)) <= bound
    lm_dir = tmp_path / "lm"
    lm.save_pretrained(lm_dir)
    tokenizer.save_pretrained(lm_dir)
    result = CliRunner().invoke(app, ["generate", "The quick", "--lm", str(lm_dir), "-r", f"{reward_dir}=-8", "-k", "5",
                                      "-t", "4", "--seed", "1", "--backend", backend, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["generations"]


# -- another backbone family: GPT-2's Conv1D (a Gemm in the ONNX graph) ------------------------------------------
def _gpt2_reward(tokenizer):
    import transformers as tf

    torch.manual_seed(4)
    config = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=len(tokenizer),
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    rm = RewardModel.from_causal_lm(tf.GPT2LMHeadModel(config).eval(), tokenizer, name="tiny-gpt2")
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm


@pytest.mark.parametrize("backend", sorted(TORCH_BACKENDS))
def test_reduced_torch_converts_gpt2_conv1d_layers(backend, tokenizer):
    precision, _, dtype, bound = TORCH_BACKENDS[backend]
    rm = _gpt2_reward(tokenizer)
    reference = torch.tensor(rm.score_texts(TEXTS))
    converted = reduced_weights(_gpt2_reward(tokenizer), precision)
    name = {BF16: "Bf16Conv1D", BF16_COMPUTE: "Bf16MatmulConv1D", INT8: "Int8MatmulConv1D"}[precision]
    layers = [m for m in converted.backbone.modules() if type(m).__name__ == name]
    assert len(layers) == 8 and all(m.weight.dtype == dtype for m in layers)  # 4 per block
    gap = float((torch.tensor(converted.score_texts(TEXTS)) - reference).abs().max())
    assert 0 < gap <= bound, gap


@requires_int8
def test_int8_quantizes_gpt2_gemm_layers(tokenizer, tmp_path, steerkit_cache):
    from steerkit.rewards.onnx.backend import OnnxRewardModel
    from steerkit.rewards.onnx.export import export_onnx
    from steerkit.rewards.onnx.quantize import quantize_export

    rm = _gpt2_reward(tokenizer)
    out = quantize_export(export_onnx(rm, tmp_path / "fp32"), tmp_path / "int8")
    assert json.loads((out / "steerkit_onnx.json").read_text())["quantization"]["nodes"] == 8
    got = torch.tensor(OnnxRewardModel(out, tokenizer=tokenizer).score_texts(TEXTS))
    gap = float((got - torch.tensor(rm.score_texts(TEXTS))).abs().max())
    assert 0 < gap <= INT8_BOUND, gap


def test_an_int8_linear_layer_is_the_rescaled_int32_product_of_int8_rows_and_columns():
    """``torch-int8``'s layer: the weight in int8 with a max-abs scale per output row (each row reaches ±127), each
    input row quantized the same way, the product exact in int32, then rescaled: within 1% of float32 here."""
    from steerkit.linear_precision import convert_linears

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 24)
    x = torch.randn(2, 5, 64) * 3
    reference = layer(x).detach()
    assert convert_linears(layer, INT8) == 1 and type(layer) is Int8MatmulLinear
    assert layer.weight.dtype == torch.int8 and layer.weight.abs().amax(1).eq(127).all()
    scale = x.abs().amax(-1, keepdim=True) / 127
    rows = torch.round(x / scale)
    exact = ((rows.double() @ layer.weight.double().t()) * scale.double() * layer.weight_scale.double()
             + layer.bias.detach())
    got = layer(x).detach()
    assert got.shape == reference.shape and got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-5)
    assert 0 < float((got - reference).abs().max() / reference.abs().max()) < 0.01


def _bf16_packing_here() -> bool:
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), 16)
        return True
    except (RuntimeError, AttributeError):
        return False


@pytest.mark.skipif(not _bf16_packing_here(), reason="this CPU's oneDNN has no bf16 products (needs AVX512_BF16, "
                    "AVX512BW or AVX-NE-CONVERT): the bf16 layers multiply through float32's kernels, tested below")
def test_a_bf16_product_through_the_packed_weight_is_bitwise_the_plain_product():
    """The bf16-compute layers (the LM's ``dtype="bfloat16"``, ``torch-bf16-compute``) multiply through a oneDNN-packed
    copy of the weight on the CPU: bitwise what ``F.linear`` / ``torch.mm`` give (so the speed-up changes no token),
    for any row count, made once per layer, made again when the weight is written in place or replaced, and left
    alone by autograd (which takes the plain product)."""
    from torch.nn import functional as F
    from transformers.pytorch_utils import Conv1D

    from steerkit.linear_precision import _PACKED, convert_linears

    torch.manual_seed(0)
    linear, conv = torch.nn.Linear(96, 160), Conv1D(160, 96)
    assert convert_linears(linear, BF16_COMPUTE) == 1 and convert_linears(conv, BF16_COMPUTE) == 1
    for rows in (1, 3, 16, 41):
        x = torch.randn(2, rows, 96)
        with torch.no_grad():
            got, got_conv = linear(x), conv(x)
        x2 = x.reshape(-1, 96).to(torch.bfloat16)
        assert torch.equal(got, (F.linear(x2, linear.weight).float() + linear.bias).view(2, rows, 160))
        assert torch.equal(got_conv, (torch.mm(x2, conv.weight).float() + conv.bias).view(2, rows, 160))
    packed = _PACKED[linear][2]
    assert packed is not None and packed.is_mkldnn
    with torch.no_grad():
        linear(x)
        assert _PACKED[linear][2] is packed  # packed once
        linear.weight.mul_(-2)
        got = linear(x)
    assert _PACKED[linear][2] is not packed
    assert torch.equal(got, (F.linear(x2, linear.weight).float() + linear.bias).view(2, rows, 160))
    linear.weight = torch.nn.Parameter(torch.randn(160, 96).to(torch.bfloat16), requires_grad=False)  # another tensor
    with torch.no_grad():
        got = linear(x)
    assert _PACKED[linear][0] is linear.weight
    assert torch.equal(got, (F.linear(x2, linear.weight).float() + linear.bias).view(2, rows, 160))
    x = torch.randn(4, 96, requires_grad=True)
    linear(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_a_cpu_without_bf16_products_multiplies_through_float32_kernels(monkeypatch):
    """Where oneDNN cannot pack a bf16 weight (an AVX2-only CPU raises), the layer keeps a float32 copy of its bf16
    weight, made once, and multiplies the bf16-rounded input through float32's kernels with the output rounded to bf16:
    the bf16 product's result (float32 sums) without torch's element-by-element bf16 loop, 5-7x slower there. It agrees
    with ``F.linear``'s bf16 product up to the order of the sums: at most one bf16 rounding step apart."""
    from torch.nn import functional as F
    from transformers.pytorch_utils import Conv1D

    from steerkit.linear_precision import _PACKED, convert_linears

    calls = []

    def refuse(weight, rows):
        calls.append(rows)
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    torch.manual_seed(1)
    layer, conv = torch.nn.Linear(32, 8), Conv1D(8, 32)
    convert_linears(layer, BF16_COMPUTE)
    convert_linears(conv, BF16_COMPUTE)
    x = torch.randn(5, 32)
    x2 = x.to(torch.bfloat16)
    with torch.no_grad():
        first, second, got_conv = layer(x), layer(x), conv(x)
    expected = F.linear(x2.float(), layer.weight.float()).to(torch.bfloat16).float() + layer.bias
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert torch.equal(got_conv, torch.mm(x2.float(), conv.weight.float()).to(torch.bfloat16).float() + conv.bias)
    assert calls == [16, 16]  # once per layer, not per call
    assert _PACKED[layer][2].dtype == torch.float32 and torch.equal(_PACKED[layer][2], layer.weight.float())
    plain = F.linear(x2, layer.weight).float() + layer.bias  # torch's own bf16 product
    step = 2.0 ** -7 * (expected - layer.bias).abs().clamp(min=2.0 ** -20)
    assert ((first - plain).abs() <= step + 1e-6).all()


def test_int8_products_through_float32_are_bitwise_torch_int_mm(monkeypatch):
    """On a CPU without int8 kernels (no VNNI, AVX512BW or AMX) ``torch-int8`` multiplies through float32's kernels:
    blocks of up to 1,024 int8 products are exact in float32 and are added in int32, so the result is bitwise
    ``torch._int_mm``'s, for sums longer than a block and at the int8 extremes, and with float32 products allowed to
    run in lower precision (then through float64)."""
    from steerkit import linear_precision
    from steerkit.linear_precision import convert_linears, int8_mm_through_float32

    torch.manual_seed(2)
    for k in (64, 1024, 2100):
        a = torch.randint(-128, 128, (33, k), dtype=torch.int8)
        b = torch.randint(-128, 128, (k, 40), dtype=torch.int8)
        a[0], b[:, 0] = -128, -128  # the largest sum: 128 * 128 * k
        assert torch.equal(int8_mm_through_float32(a, b), torch._int_mm(a, b)), k
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torch.equal(int8_mm_through_float32(a, b), torch._int_mm(a, b))
    finally:
        torch.set_float32_matmul_precision(previous)
    layer = torch.nn.Linear(1100, 24)
    convert_linears(layer, INT8)
    x = torch.randn(17, 1100)
    with torch.no_grad():
        monkeypatch.setattr(linear_precision, "cpu_multiplies_int8", lambda: True)
        native = layer(x)
        monkeypatch.setattr(linear_precision, "cpu_multiplies_int8", lambda: False)
        through_float32 = layer(x)
    assert torch.equal(native, through_float32)

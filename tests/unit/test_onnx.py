"""ONNX export + onnxruntime backend: parity with torch, generate() parity, manifest verification, CLI."""

import json
import shutil

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import steerkit  # noqa: E402
from steerkit.errors import ExportError  # noqa: E402
from steerkit.rewards.model import RewardModel  # noqa: E402
from steerkit.rewards.onnx.backend import OnnxRewardModel, OnnxScoringCache  # noqa: E402
from steerkit.rewards.onnx.export import (  # noqa: E402
    DATA_FILE, MANIFEST_NAME, MODEL_FILE, cache_entry, export_onnx, reward_dir_hash,
)
from steerkit.rewards.sequence.scorer import RewardModelScorer  # noqa: E402
from steerkit.rewards.sequence.torch_cache import TorchScoringCache  # noqa: E402

UNEVEN = ["The quick brown fox jumps over", "", "You are a wonderful friend", "I hate"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, steerkit_cache, reward_model):
    return export_onnx(reward_model, tmp_path_factory.mktemp("export") / "tiny-onnx")


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory, steerkit_cache, tokenizer):
    """A tiny reward model saved as a directory over a saved tiny backbone (loadable by reference)."""
    from tiny import tiny_lm

    backbone = tmp_path_factory.mktemp("backbone")
    tiny_lm(tokenizer, seed=5).save_pretrained(backbone)
    tokenizer.save_pretrained(backbone)
    rm = RewardModel.from_backbone(str(backbone), name="tiny-dir")
    torch.manual_seed(11)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return rm.save_pretrained(tmp_path_factory.mktemp("rm") / "tiny-rm")


def test_export_writes_manifest_describing_the_graph(exported, reward_model):
    manifest = json.loads((exported / MANIFEST_NAME).read_text())
    assert manifest["num_layers"] == reward_model.config.num_layers == 2
    assert manifest["num_kv_heads"] == 2 and manifest["head_dim"] == 8
    assert manifest["inputs"][:3] == ["input_ids", "position_ids", "attention_mask"]
    assert manifest["outputs"][0] == "rewards" and len(manifest["outputs"]) == 1 + 2 * 2
    assert manifest["opset"] == 17 and not manifest["external_data"]
    assert set(manifest["files"]) == {MODEL_FILE}
    assert manifest["tokenizer"]["reference"] == reward_model.config.backbone


@pytest.mark.parametrize("io_binding", [False, True], ids=["run", "io-binding"])
def test_cache_parity_with_torch_over_twelve_steps_with_rollback(exported, reward_model, tokenizer, io_binding,
                                                                 monkeypatch):
    # io-binding: the pointer-binding path used for CUDA, exercised here on CPU buffers
    monkeypatch.setenv("STEERKIT_ONNX_IOBINDING", "1" if io_binding else "0")
    onnx_model = OnnxRewardModel(exported, tokenizer=tokenizer)
    assert onnx_model.runtime.io_binding is io_binding
    enc = reward_model.encode(UNEVEN)  # uneven prompts, left padded; the empty one is just the start token
    ref = TorchScoringCache(reward_model, enc["input_ids"], enc["attention_mask"])
    ours = OnnxScoringCache(onnx_model, enc["input_ids"], enc["attention_mask"])
    g = torch.Generator().manual_seed(0)
    B, k, worst = len(UNEVEN), 6, 0.0
    for step in range(12):
        m = 3 if step % 4 == 2 else 1  # multi-token blocks (as the tokenizer bridge scores them), right padded
        blocks = torch.randint(3, len(tokenizer), (B, k, m), generator=g)
        mask = torch.ones_like(blocks, dtype=torch.bool)
        if m > 1:
            mask[..., 1:] = torch.rand(B, k, m - 1, generator=g) > 0.4
            mask[..., 2] &= mask[..., 1]
        a, b = ref.score_blocks(blocks, mask), ours.score_blocks(blocks, mask)
        assert a.shape == b.shape == (B, k)
        worst = max(worst, float((a - b).abs().max()))
        choice = torch.randint(0, k, (B,), generator=g)
        ref.commit_choice(choice)
        ours.commit_choice(choice)
        if step == 5:  # leaves holes in some rows, crops columns that are holes everywhere
            counts = torch.tensor([1, 0, 2, 1])
            ref.rollback(counts)
            ours.rollback(counts)
        if step == 8:
            tokens = torch.randint(3, len(tokenizer), (B, 2), generator=g)
            tmask = torch.tensor([[1, 1], [0, 1], [1, 0], [0, 0]], dtype=torch.bool)
            ref.append(tokens, tmask)
            ours.append(tokens, tmask)
        assert torch.equal(ref.mask, ours.mask) and torch.equal(ref.next_pos, ours.next_pos)
    assert worst <= 1e-4
    # the kept KV itself matches too
    for layer, (key, value) in zip(ref.cache.layers, zip(ours.past[0::2], ours.past[1::2])):
        assert torch.allclose(layer.keys, key, atol=1e-4) and torch.allclose(layer.values, value, atol=1e-4)


def test_score_texts_matches_torch(exported, reward_model, tokenizer):
    onnx_model = OnnxRewardModel(exported, tokenizer=tokenizer)
    texts = UNEVEN + ["Café déjà vu 🙂"]
    a, pa = reward_model.score_texts(texts, per_prefix=True)
    b, pb = onnx_model.score_texts(texts, per_prefix=True)
    assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert all(torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5) for x, y in zip(pa, pb))


def test_generate_onnx_gives_identical_tokens_to_torch(reward_dir, lm, tokenizer, steerkit_cache):
    prompts = ["The quick", "You are a wonderful friend and I", "Numbers"]
    kw = dict(lm=(lm, tokenizer), rewards={str(reward_dir): -8.0}, k=8, max_new_tokens=12, seed=3,
              num_return_sequences=2, eos_token_id=[])
    torch_out = steerkit.generate(prompts, backend="torch", **kw)
    onnx_out = steerkit.generate(prompts, backend="onnx", **kw)  # exports into the cache on first use
    assert torch.equal(torch_out.sequences, onnx_out.sequences) and torch_out.texts == onnx_out.texts
    entry = cache_entry(reward_dir_hash(reward_dir))
    assert (entry / MANIFEST_NAME).is_file()
    assert json.loads((entry / MANIFEST_NAME).read_text())["source"]["reward_hash"] == reward_dir_hash(reward_dir)
    # a torch RewardModel handed to a scorer with backend "onnx" goes through the same (memoised) export
    scorer = RewardModelScorer(RewardModel.from_pretrained(reward_dir), backend="onnx")
    assert isinstance(scorer.new_cache(torch.tensor([[1, 5]]), torch.ones(1, 2)), OnnxScoringCache)


def test_bridged_generate_onnx_gives_identical_tokens_to_torch(reward_dir, steerkit_cache):
    """An LM from another tokenizer family: the bridge scores multi-token blocks and rolls the cache back."""
    from tiny import make_tokenizer, tiny_lm

    lm_tokenizer = make_tokenizer(kind="metaspace")
    lm = tiny_lm(lm_tokenizer, seed=2)
    kw = dict(lm=(lm, lm_tokenizer), rewards={str(reward_dir): 6.0}, k=6, max_new_tokens=10, seed=5,
              eos_token_id=[], return_traces=True)
    prompts = ["The quick brown", "Café déjà"]
    torch_out = steerkit.generate(prompts, backend="torch", **kw)
    onnx_out = steerkit.generate(prompts, backend="onnx", **kw)
    assert torch.equal(torch_out.sequences, onnx_out.sequences)
    for a, b in zip(torch_out.traces[0], onnx_out.traces[0]):
        for name in a.rewards:
            assert torch.allclose(a.rewards[name], b.rewards[name], atol=1e-4)


def test_changed_reward_dir_gets_a_new_export(reward_dir, tmp_path, steerkit_cache):
    copy = shutil.copytree(reward_dir, tmp_path / "rm")
    first = OnnxRewardModel.load(copy)
    rm = RewardModel.from_pretrained(copy)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    rm.save_pretrained(copy)
    second = OnnxRewardModel.load(copy)
    assert first.directory != second.directory and second.reward_hash == reward_dir_hash(copy)


def test_external_data_export(tmp_path, reward_model, tokenizer, steerkit_cache):
    out = export_onnx(reward_model, tmp_path / "ext", external_data_threshold=0)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["external_data"] and set(manifest["files"]) == {MODEL_FILE, DATA_FILE}
    assert (out / MODEL_FILE).stat().st_size < (out / DATA_FILE).stat().st_size
    texts = ["I hate", "The quick brown"]
    assert torch.allclose(torch.tensor(OnnxRewardModel(out).score_texts(texts)),
                          torch.tensor(reward_model.score_texts(texts)), atol=1e-5)


def test_tokenizer_mismatch_is_refused(exported, tmp_path, steerkit_cache):
    from tiny import make_tokenizer

    bad = shutil.copytree(exported, tmp_path / "bad-tokenizer")
    shutil.rmtree(bad / "tokenizer")
    make_tokenizer(kind="metaspace").save_pretrained(bad / "tokenizer")  # another vocabulary
    with pytest.raises(ExportError, match="tokenizer mismatch"):
        OnnxRewardModel(bad)
    # and a manifest naming another tokenizer than its reward config
    named = shutil.copytree(exported, tmp_path / "bad-name")
    manifest = json.loads((named / MANIFEST_NAME).read_text())
    manifest["tokenizer"]["reference"] = "smollm2-135m-instruct"
    (named / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="names tokenizer"):
        steerkit.load_reward(str(named), backend="onnx")


def test_exported_model_checked_against_the_callers_tokenizer(exported):
    from tiny import make_tokenizer

    with pytest.raises(ExportError, match="tokenizer mismatch"):
        OnnxRewardModel(exported, tokenizer=make_tokenizer(vocab_size=200))


def test_corrupted_model_file_is_refused(exported, tmp_path, steerkit_cache):
    bad = shutil.copytree(exported, tmp_path / "corrupt")
    data = bytearray((bad / MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(ExportError, match="corrupted"):
        steerkit.load_reward(str(bad), backend="onnx")
    (bad / MODEL_FILE).unlink()
    with pytest.raises(ExportError, match="lacks model.onnx"):
        OnnxRewardModel(bad)


def test_export_dir_with_torch_backend_and_wrong_source_are_refused(exported, reward_dir, steerkit_cache):
    with pytest.raises(ExportError, match="is an ONNX export"):
        steerkit.load_reward(str(exported), backend="torch")
    with pytest.raises(ExportError, match="exported from reward"):
        OnnxRewardModel(exported, expected_hash=reward_dir_hash(reward_dir))


def test_cli_export_verify_and_score(reward_dir, tmp_path, steerkit_cache):
    from typer.testing import CliRunner

    from steerkit.cli import app

    runner = CliRunner()
    out = tmp_path / "cli-export"
    result = runner.invoke(app, ["export", "onnx", str(reward_dir), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert manifest["source"]["reward_hash"] == reward_dir_hash(reward_dir)
    assert manifest["source"]["directory"] == str(reward_dir.resolve())
    again = runner.invoke(app, ["export", "onnx", str(reward_dir), "--out", str(out)])
    assert again.exit_code != 0 and isinstance(again.exception, ExportError)
    assert runner.invoke(app, ["export", "verify", str(out)]).exit_code == 0
    scores = {}
    for backend, ref in (("onnx", out), ("torch", reward_dir)):
        res = runner.invoke(app, ["score", "I hate it", "hello", "-r", str(ref), "--backend", backend, "--json"])
        assert res.exit_code == 0, res.output
        scores[backend] = [r["reward"] for r in json.loads(res.stdout)["results"]]
    assert torch.allclose(torch.tensor(scores["onnx"]), torch.tensor(scores["torch"]), atol=1e-5)


def test_registered_reward_exports_by_name_and_runs_with_onnx(reward_dir, tmp_path, steerkit_cache, tokenizer):
    from steerkit import registry
    from steerkit.rewards.packaged import reward_model_factory
    from steerkit.rewards.onnx.export import export_source

    class Plugin:
        @registry.hookimpl
        def register_reward_models(self, register):
            register("tiny-registered-onnx", reward_model_factory(reward_dir, name="tiny-registered-onnx"))

    registry.register_plugin(Plugin(), name="tiny-onnx-test-plugin")
    try:
        model, reward_hash, source = export_source("tiny-registered-onnx")
        assert reward_hash == reward_dir_hash(reward_dir) and source["name"] == "tiny-registered-onnx"
        scorer = steerkit.load_reward("tiny-registered-onnx", backend="onnx")
        enc = model.encode(["I hate", "The quick brown"])
        cache = scorer.new_cache(enc["input_ids"], enc["attention_mask"])
        ref = TorchScoringCache(model, enc["input_ids"], enc["attention_mask"])
        blocks = torch.randint(3, len(tokenizer), (2, 5, 1))
        assert torch.allclose(cache.score_blocks(blocks, None), ref.score_blocks(blocks, None), atol=1e-4)
    finally:
        registry.unregister_plugin("tiny-onnx-test-plugin")


def test_gemma3_architecture_exports_with_parity(tokenizer, tmp_path, steerkit_cache):
    """Gemma 3 (q/k norms, scaled embeddings, sliding-window layer types) through the same export."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=8, sliding_window=64,
                              max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    rm = RewardModel.from_causal_lm(Gemma3ForCausalLM(config).eval(), tokenizer, name="tiny-gemma3")
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    onnx_model = OnnxRewardModel(export_onnx(rm, tmp_path / "gemma3"), tokenizer=tokenizer)
    enc = rm.encode(UNEVEN)
    ref = TorchScoringCache(rm, enc["input_ids"], enc["attention_mask"])
    ours = OnnxScoringCache(onnx_model, enc["input_ids"], enc["attention_mask"])
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        blocks = torch.randint(3, len(tokenizer), (len(UNEVEN), 5, 1), generator=g)
        assert torch.allclose(ref.score_blocks(blocks, None), ours.score_blocks(blocks, None), atol=1e-4)
        choice = torch.randint(0, 5, (len(UNEVEN),), generator=g)
        ref.commit_choice(choice)
        ours.commit_choice(choice)


def test_first_use_export_says_so_on_stderr_once(reward_dir, tmp_path, steerkit_cache, capfd):
    """Issue 27: `--backend onnx` on a reward-model directory exports on first use (seconds): a message says so,
    with where it is cached and how long it took; the cached export is then used silently."""
    copy = shutil.copytree(reward_dir, tmp_path / "rm-first-use")
    rm = RewardModel.from_pretrained(copy)
    torch.nn.init.normal_(rm.head.weight, std=0.3)  # its own content hash: not exported yet
    rm.save_pretrained(copy)
    capfd.readouterr()
    OnnxRewardModel.load(copy)
    first = capfd.readouterr().err
    assert "exporting" in first and str(copy) in first and "first use only" in first and "done in" in first
    OnnxRewardModel.load(copy)
    assert "exporting" not in capfd.readouterr().err


# -- the default backend "auto": an export directory runs on onnx without --backend (issue 27, item 5a) -------------
def test_export_dir_with_no_backend_runs_on_onnx_and_scores_as_backend_onnx(exported, reward_dir, steerkit_cache):
    from steerkit.rewards.backends import DEFAULT_BACKEND, resolve_backend

    assert DEFAULT_BACKEND == "auto"
    assert resolve_backend("auto", exported) == "onnx" and resolve_backend("auto", reward_dir) == "torch"
    assert resolve_backend("auto") == "torch" and resolve_backend("torch", exported) == "torch"  # named: as named
    auto, onnx = steerkit.load_reward(str(exported)), steerkit.load_reward(str(exported), backend="onnx")
    assert auto.backend == "onnx" and isinstance(auto.model, OnnxRewardModel)
    assert auto.model.score_texts(UNEVEN, per_prefix=True) == onnx.model.score_texts(UNEVEN, per_prefix=True)
    plain = steerkit.load_reward(str(reward_dir))  # a reward-model directory with no backend: torch
    assert plain.backend == "torch" and type(plain.model) is RewardModel
    with pytest.raises(ExportError, match="is an ONNX export"):  # a named torch stays what was asked for
        steerkit.load_reward(str(exported), backend="torch")


def test_cli_score_of_an_export_needs_no_backend(exported, steerkit_cache):
    from typer.testing import CliRunner

    from steerkit.cli import app

    scores = {}
    for backend in ([], ["--backend", "onnx"], ["--backend", "auto"]):
        result = CliRunner().invoke(app, ["score", "I hate it", "hello", "-r", str(exported), "--json", *backend])
        assert result.exit_code == 0, result.output
        scores[" ".join(backend)] = [r["reward"] for r in json.loads(result.stdout)["results"]]
    assert scores[""] == scores["--backend onnx"] == scores["--backend auto"]
    refused = CliRunner().invoke(app, ["score", "hello", "-r", str(exported), "--backend", "torch"])
    assert refused.exit_code != 0 and isinstance(refused.exception, ExportError)


def test_generate_and_configs_run_an_export_with_no_backend(exported, lm, tokenizer, steerkit_cache):
    from steerkit.config import SteeringConfig

    kw = dict(lm=(lm, tokenizer), rewards={str(exported): -8.0}, k=8, max_new_tokens=10, seed=3, eos_token_id=[])
    auto, onnx = steerkit.generate(["The quick", "You are"], **kw), steerkit.generate(["The quick", "You are"],
                                                                                      backend="onnx", **kw)
    assert torch.equal(auto.sequences, onnx.sequences) and auto.texts == onnx.texts
    config = SteeringConfig.from_dict({"rewards": [{"name": str(exported), "beta": -8}]})
    assert config.backend == "auto"
    (term,) = config.build_terms()
    assert term.reward.backend == "onnx" and isinstance(term.reward.model, OnnxRewardModel)

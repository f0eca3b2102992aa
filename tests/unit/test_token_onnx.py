"""ONNX export and the onnxruntime backend of token-level reward models: parity with torch (<= 1e-4)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from steerkit.rewards.model import TokenHeadSettings  # noqa: E402
from steerkit.rewards.token.model import TokenRewardModel  # noqa: E402


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory, tokenizer):
    from steerkit.testing import save_tiny_lm

    root = tmp_path_factory.mktemp("token-onnx")
    backbone = save_tiny_lm(root / "backbone", tokenizer, seed=3)
    rm = TokenRewardModel.from_backbone(str(backbone), name="tok", head=TokenHeadSettings(rank=6))
    torch.manual_seed(0)
    for p in rm.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return rm.save_pretrained(root / "rm")


@pytest.mark.slow
def test_onnx_token_reward_matches_torch_while_decoding(token_dir, tokenizer, lm, tmp_path, monkeypatch):
    import steerkit
    from steerkit.cli.app import build_app
    from steerkit.rewards.onnx.manifest import verify_export
    from steerkit.rewards.onnx.token import OnnxTokenModel
    from steerkit.rewards.token.session import TokenReward
    from typer.testing import CliRunner

    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path / "cache"))
    torch_reward = steerkit.load_reward(str(token_dir))
    onnx_reward = steerkit.load_reward(str(token_dir), backend="onnx")  # exported into the cache on first use
    assert isinstance(onnx_reward.model, OnnxTokenModel)
    prompts = ["I hate it", "You are a wonderful friend"]
    sessions = [TokenReward(r.model, context="full").start(prompts, tokenizer) for r in (torch_reward, onnx_reward)]
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(5):
        candidates = torch.randint(0, len(tokenizer), (2, 9), generator=g)
        worst = max(worst, (sessions[0].score(candidates) - sessions[1].score(candidates)).abs().max().item())
        for s in sessions:
            s.commit(candidates[:, 0])
    texts = ["I love this movie so much", "This is terrible", ""]
    a, pa = torch_reward.model.score_texts(texts, per_prefix=True)
    b, pb = onnx_reward.model.score_texts(texts, per_prefix=True)
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)),
                max(abs(x - y) for ra, rb in zip(pa, pb) for x, y in zip(ra, rb)))
    assert worst <= 1e-4, worst

    out = tmp_path / "export"  # the CLI: `steerkit export onnx DIR --out OUT`, then verifiable and loadable
    result = CliRunner().invoke(build_app(), ["export", "onnx", str(token_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest, config, _ = verify_export(out)
    assert manifest["kind"] == "token" and config.kind == "token" and "embeddings.safetensors" in manifest["files"]
    exported = steerkit.load_reward(str(out), backend="onnx")
    assert exported.model.score_texts(texts) == pytest.approx(a, abs=1e-4)
    auto = steerkit.load_reward(str(out))  # no backend ("auto"): an export runs on onnx
    assert auto.backend == "onnx" and auto.model.score_texts(texts) == exported.model.score_texts(texts)
    with pytest.raises(steerkit.ExportError, match="backend 'onnx'"):
        steerkit.load_reward(str(out), backend="torch")  # a named torch on an export is refused

"""Reward models over every causal family whose blocks form a list: truncation, cached scoring, save/load, training.

Each family is a tiny random model built in code (3 blocks, truncated to 2). Cached scoring goes through
:class:`RewardModelScorer` and the torch cache (shared-prefix 4D float mask, explicit position ids) and must
equal scoring every prefix + candidate from scratch (max diff <= 1e-5).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.errors import RewardModelFormatError
from steerkit.rewards.backbones import find_blocks
from steerkit.rewards.model import RewardModel
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm
from tiny import family_lm

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The quick", "You are a wonderful friend and I", "Numbers 0123"]
TOLERANCE = 1e-5


FAMILIES = ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox", "phi", "opt"]


def family_reward(family: str, tokenizer, layers: int = 2, **kw) -> RewardModel:
    rm = RewardModel.from_causal_lm(family_lm(family, tokenizer), tokenizer, layers, name=f"tiny-{family}", **kw)
    torch.manual_seed(7)
    nn.init.normal_(rm.head.weight, std=0.5)  # spread rewards so differences are visible
    return rm


@pytest.fixture(scope="module", params=FAMILIES)
def family_rm(request, tokenizer):
    return family_reward(request.param, tokenizer)


def scratch(rm: RewardModel, ids: list[int]) -> float:
    with torch.no_grad():
        return rm(torch.tensor([ids])).rewards[0, -1].item()


def test_truncation_keeps_the_first_blocks_and_updates_the_config(family_rm):
    _, _, blocks = find_blocks(family_rm.backbone)
    config = family_rm.backbone.config
    assert len(blocks) == 2 == family_rm.config.num_layers == config.num_hidden_layers
    assert len(getattr(config, "layer_types", None) or [0, 0]) == 2
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    assert len(cache.layers) == 2


def scorer_of(model, layout: str, **kw) -> RewardModelScorer:
    """The torch scorer on its own cache ("dynamic") or on the compiled engine's static one, run eagerly ("static";
    a family whose layers slide over a window, Gemma 3, stays on its own cache)."""
    scorer = RewardModelScorer(model, **kw)
    return scorer.compiled_form(compiled=False) if layout == "static" else scorer


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_cached_scoring_through_the_scorer_matches_scratch(family_rm, lm, tokenizer, layout):
    scorer = scorer_of(family_rm, layout, context="full")  # uneven prompts: left padding in the reward model
    assert (scorer.static == "eager") == (layout == "static" and family_rm.config.name != "tiny-gemma3")
    k, steps = 4, 6
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 3.0)], k=k)
    out = gen.generate(PROMPTS, max_new_tokens=steps, seed=1, return_traces=True, eos_token_id=[])
    worst = 0.0
    for step, t in enumerate(out.traces[0]):
        for b, prompt in enumerate(PROMPTS):
            prefix = ([family_rm.config.start_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
                      + out.sequences[b, :step].tolist())
            for j in range(k):
                ref = scratch(family_rm, prefix + [t.topk_ids[b, j].item()])
                worst = max(worst, abs(ref - t.rewards[scorer.name][b, j].item()))
    assert worst <= TOLERANCE, worst


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_cache_blocks_rollback_and_append_match_scratch(family_rm, layout):
    """Multi-token padded blocks (the tokenizer bridge's case), a rollback leaving holes, then an append."""
    scorer = scorer_of(family_rm, layout)
    enc = family_rm.encode(["hello there", "x"])
    cache = scorer.new_cache(enc["input_ids"], enc["attention_mask"])
    rows = [enc["input_ids"][b][enc["attention_mask"][b].bool()].tolist() for b in range(2)]
    cache.append(torch.tensor([[10, 11], [12, 13]]), None)
    rows = [r + extra for r, extra in zip(rows, [[10, 11], [12, 13]])]
    cache.rollback(torch.tensor([1, 2]))
    rows = [rows[0][:-1], rows[1][:-2]]
    blocks = torch.tensor([[[20, 21], [22, 0]], [[23, 24], [25, 26]]])
    bmask = torch.tensor([[[1, 1], [1, 0]], [[1, 1], [1, 1]]], dtype=torch.bool)
    got = cache.score_blocks(blocks, bmask)
    cache.commit_choice(torch.tensor([1, 0]))
    chosen = [rows[0] + [22], rows[1] + [23, 24]]
    again = cache.score_blocks(torch.tensor([[[30]], [[31]]]), None)
    worst = 0.0
    for b in range(2):
        for j in range(2):
            block = blocks[b, j][bmask[b, j]].tolist()
            worst = max(worst, abs(scratch(family_rm, rows[b] + block) - got[b, j].item()))
        worst = max(worst, abs(scratch(family_rm, chosen[b] + [30 + b]) - again[b, 0].item()))
    assert worst <= TOLERANCE, worst


@pytest.mark.parametrize("function", ["sigmoid", "clamp"])
def test_output_function_reads_the_head(function, tokenizer):
    rm = family_reward("gpt2", tokenizer)
    rm.config = rm.config.model_copy(update={"output_function": function})
    ids = torch.tensor([[1, 40, 41, 42]])
    with torch.no_grad():
        raw = rm.head(rm.backbone(input_ids=ids).last_hidden_state).squeeze(-1)
        got = rm(ids).rewards
    expected = torch.sigmoid(raw) if function == "sigmoid" else raw.clamp(0, 1)
    assert torch.allclose(got, expected, atol=0, rtol=0)


def test_a_model_without_a_block_list_is_a_format_error(tokenizer):
    lm = family_lm("gpt2", tokenizer)
    lm.transformer.extra = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])  # two lists of 3: ambiguous
    with pytest.raises(RewardModelFormatError, match="exactly one nn.ModuleList"):
        RewardModel.from_causal_lm(lm, tokenizer, 2)
    lm = family_lm("gpt2", tokenizer)
    lm.transformer.h = nn.Sequential(*lm.transformer.h)  # blocks not in a ModuleList
    with pytest.raises(RewardModelFormatError, match="Cannot find the transformer blocks"):
        RewardModel.from_causal_lm(lm, tokenizer, 2)


def test_depth_beyond_the_backbone_is_a_format_error(tokenizer):
    with pytest.raises(RewardModelFormatError, match=r"num_layers must be in \[1, 3\]"):
        RewardModel.from_causal_lm(family_lm("opt", tokenizer), tokenizer, 4)


# -- GPT-2 on disk: save/load round trips per method, LoRA on Conv1D, `steerkit train` -------------------
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gpt2-backbone")
    family_lm("gpt2", tokenizer, seed=4).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["head", "lora", "full"])
def test_gpt2_reward_model_save_load_round_trip(method, gpt2_dir, tmp_path):
    pytest.importorskip("peft")
    from steerkit.rewards.model import LoraSettings, lora_config, resolve_lora

    rm = RewardModel.from_backbone(str(gpt2_dir), 2, name="gpt2-rm")
    torch.manual_seed(3)
    nn.init.normal_(rm.head.weight, std=0.5)
    if method == "lora":
        from peft import get_peft_model

        settings = resolve_lora(LoraSettings(), rm.backbone)
        assert settings.target_modules == ["c_attn"]  # GPT-2's fused QKV Conv1D
        with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
            warnings.simplefilter("ignore", FutureWarning)
            rm.backbone = get_peft_model(rm.backbone, lora_config(settings, rm.backbone))
        for name, p in rm.backbone.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(p, std=0.2)  # a non-trivial adapter
        rm.config = rm.config.model_copy(update={"method": "lora", "lora": settings})
    elif method == "full":
        with torch.no_grad():
            rm.backbone.h[0].mlp.c_fc.weight.add_(0.1)
        rm.config = rm.config.model_copy(update={"method": "full"})
    texts = ["The quick brown fox", "", "You are a wonderful friend"]
    before = rm.score_texts(texts, per_prefix=True)
    rm.save_pretrained(tmp_path / "rm")
    saved = json.loads((tmp_path / "rm" / "reward_config.json").read_text())
    assert saved["output_function"] == "sigmoid" and saved["num_layers"] == 2
    loaded = RewardModel.from_pretrained(tmp_path / "rm")
    after = loaded.score_texts(texts, per_prefix=True)
    assert torch.allclose(torch.tensor(before[0]), torch.tensor(after[0]), atol=1e-5)
    for a, b in zip(before[1], after[1]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert len(loaded.backbone.h) == 2


def test_lora_on_a_backbone_without_known_projections_asks_for_targets(tokenizer):
    from steerkit.rewards.model import LoraSettings, resolve_lora

    rm = family_reward("gpt2", tokenizer)
    for block in rm.backbone.h:
        block.attn.c_attn = nn.Identity()
    with pytest.raises(RewardModelFormatError, match="Set lora.target_modules"):
        resolve_lora(LoraSettings(), rm.backbone)


def test_steerkit_train_on_a_gpt2_backbone(gpt2_dir, tmp_path, config_names_its_data_root):
    pytest.importorskip("peft")
    words = (["I hate it", "terrible and awful", "stupid thing"], ["I love this movie", "wonderful friend", "so much fun"])
    with open(tmp_path / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(40):
            fh.write(json.dumps({"text": f"{words[i % 2][i % 3]} {i}", "label": i % 2}) + "\n")
    config = {"name": "gpt2rm", "backbone": str(gpt2_dir), "num_layers": 2, "method": "lora", "max_length": 16,
              "data_root": str(tmp_path), "output_dir": str(tmp_path / "out"), "data": [{"path": "reviews.jsonl", "text": "text", "label": "label"}],
              "steps": 4, "batch_size": 8, "lr": 5e-3, "seed": 1, "threads": 1, "dev_fraction": 0.1,
              "eval_every": 2, "checkpoint_every": 2}
    (tmp_path / "train.json").write_text(json.dumps(config), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    result = subprocess.run([sys.executable, "-c", "from steerkit.cli import main; main()", "train",
                             str(tmp_path / "train.json")], capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    saved = json.loads((tmp_path / "out" / "reward_config.json").read_text())
    assert saved["lora"]["target_modules"] == ["c_attn"] and saved["num_layers"] == 2
    assert "c_attn" in (tmp_path / "out" / "README.md").read_text()
    rm = RewardModel.from_pretrained(tmp_path / "out")
    finals = rm.score_texts(["I love this movie", "I hate it"])
    assert all(0.0 <= r <= 1.0 for r in finals)


# -- output functions through ONNX -------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("function", ["sigmoid", "clamp"])
def test_output_function_exported_to_onnx_with_parity(function, family, tokenizer, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from steerkit.rewards.onnx.backend import OnnxRewardModel
    from steerkit.rewards.onnx.export import MANIFEST_NAME, export_onnx

    rm = family_reward(family, tokenizer)
    rm.config = rm.config.model_copy(update={"output_function": function})
    if function == "clamp":  # spread raw outputs across 0 and 1 so that both bounds are exercised
        nn.init.normal_(rm.head.weight, std=0.15)
        nn.init.constant_(rm.head.bias, 0.5)
    out = export_onnx(rm, tmp_path / "onnx")  # the export itself checks parity on its probes (<= 1e-4)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["output_function"] == manifest["reward_config"]["output_function"] == function
    onnx_model = OnnxRewardModel(out, tokenizer=tokenizer)
    assert onnx_model.config.output_function == function
    texts = ["The quick brown fox jumps over", "", "You are a wonderful friend", "I hate"]
    a, pa = rm.score_texts(texts, per_prefix=True)
    b, pb = onnx_model.score_texts(texts, per_prefix=True)
    assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
    flat_a = torch.tensor([x for row in pa for x in row])
    flat_b = torch.tensor([x for row in pb for x in row])
    assert torch.allclose(flat_a, flat_b, atol=1e-4)
    if function == "clamp":
        assert (flat_a == 0).any() and (flat_a == 1).any() and ((flat_a > 0) & (flat_a < 1)).any()

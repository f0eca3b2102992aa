"""End to end on the real SmolLM2-135M-Instruct (packaged wheel)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import requires_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]


@pytest.fixture(scope="module")
def smollm2():
    from steerkit.models import load_causal_lm_cached

    model, tokenizer, _ = load_causal_lm_cached("smollm2-135m-instruct")
    return model, tokenizer


@pytest.fixture(scope="module")
def smol_reward(tmp_path_factory):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone("smollm2-135m-instruct", 4, name="smolrm")
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.head.weight, std=0.2)
    return rm, rm.save_pretrained(tmp_path_factory.mktemp("smolrm") / "rm")


def test_cached_scoring_on_real_model(smollm2, smol_reward):
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.rewards.sequence.scorer import RewardModelScorer
    from steerkit.steering import SteeringTerm

    model, tokenizer = smollm2
    rm, _ = smol_reward
    prompts = ["The weather in Paris is", "Once upon a time, in a small village by the sea, there lived"]
    scorer = RewardModelScorer(rm, context="full")
    out = RewardAugmentedGenerator(model, tokenizer, [SteeringTerm(scorer, 10.0)], k=5).generate(
        prompts, max_new_tokens=10, seed=0, return_traces=True, eos_token_id=[])
    worst = 0.0
    for step, t in enumerate(out.traces[0]):
        for b, prompt in enumerate(prompts):
            base = [rm.config.start_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
            base += out.sequences[b, :step].tolist()
            batch = torch.tensor([base + [c] for c in t.topk_ids[b].tolist()])
            with torch.no_grad():
                ref = rm(batch).rewards[:, -1]
            worst = max(worst, (ref - t.rewards["smolrm"][b]).abs().max().item())
    assert worst <= 1e-4, worst


def test_cli_generate_json(smol_reward):
    _, path = smol_reward
    cmd = [sys.executable, "-m", "steerkit", "generate", "The movie was", "--reward", f"{path}=20",
           "-k", "20", "-n", "2", "--max-new-tokens", "8", "--seed", "1", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["k"] == 20 and len(payload["generations"]) == 2
    assert all(g["prompt"] == "The movie was" and g["text"] for g in payload["generations"])
    assert payload["rewards"][0]["beta"] == 20


@pytest.mark.skipif(importlib.util.find_spec("steerkit_toxicity") is None
                    or importlib.util.find_spec("steerkit_sentiment") is None,
                    reason="the shipped reward plugins are not installed: steerkit setup")
def test_cli_generate_prints_no_warning_line():
    """What a user sees on a fresh install: `steerkit generate` on the real model, steered by a shipped sequence
    reward and a shipped token-level one, writes the text to stdout and only its timing line to stderr: no
    deprecation warning from a transformers call, no third-party log line. The interpreter's warning filters
    are a user's default (the suite's own turn warnings into errors)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TRANSFORMERS_VERBOSITY")}
    cmd = [sys.executable, "-m", "steerkit", "generate", "The movie was", "--reward", "toxicity=-20",
           "--reward", "sentiment-token=10", "-k", "10", "-n", "2", "--max-new-tokens", "6", "--seed", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(r"\d+ tokens in .* tok/s.*", lines[0]), result.stderr


def test_cli_reports_typed_errors_without_traceback():
    result = subprocess.run([sys.executable, "-m", "steerkit", "generate", "hi", "--k", "0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "k" in result.stderr


def test_cli_score(smol_reward):
    _, path = smol_reward
    result = subprocess.run([sys.executable, "-m", "steerkit", "score", "--reward", str(path), "--json",
                             "--prefixes", "Hello there", "You idiot"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert [r["text"] for r in results] == ["Hello there", "You idiot"]
    assert all(0 <= r["reward"] <= 1 and r["prefixes"][-1]["reward"] == pytest.approx(r["reward"]) for r in results)


@pytest.mark.slow
def test_weight_cache_is_built_once_under_concurrency(tmp_path):
    """Two processes loading the GGUF at once into an empty cache: one complete entry, no debris."""
    env = {**os.environ, "STEERKIT_CACHE": str(tmp_path)}
    code = "from steerkit.models import load_causal_lm; m,t,s=load_causal_lm('smollm2-135m-instruct'); print(s.fingerprint)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    entries = list((tmp_path / "models").iterdir())
    assert [e.name for e in entries] == [outs[0][0].strip()[:24]]
    assert (entries[0] / "model.safetensors").exists() and (entries[0] / "steerkit_cache.json").exists()
    assert "Converting" not in outs[0][1]  # no GGUF progress-bar spam unless STEERKIT_VERBOSE=1

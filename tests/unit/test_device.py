"""Cached rewards equal from-scratch rewards on every available torch device (CUDA where present).

On a CPU-only machine only the ``cpu`` case runs; on a GPU machine the same check runs on ``cuda``
(this is how the GPU path was verified: see docs/backends.md).
"""

import pytest
import torch

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import SteeringTerm
from tiny import make_tokenizer, tiny_lm, tiny_reward

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA GPU on this machine"))]
PROMPTS = ["Café au", "Numbers 12", "You are a wonderful friend and I"]


def reference_rewards(rm, lm_tok, same_vocab, context, sequences, step, topk_ids, device):
    """The reward model's from-scratch score of (prompt +) continuation + each candidate."""
    rows, texts = [], []
    for row in range(sequences.shape[0]):
        prompt = PROMPTS[row // 2]
        done = sequences[row, :step].tolist()
        head = lm_tok(prompt, add_special_tokens=False)["input_ids"] if context == "full" else []
        for c in topk_ids[row].tolist():
            rows.append([rm.config.start_token_id] + head + done + [c])
            texts.append((prompt if context == "full" else "") + lm_tok.decode(done + [c], skip_special_tokens=True))
    if not same_vocab:  # another tokenizer family: the reward model reads the decoded text
        return torch.tensor(rm.score_texts(texts))
    with torch.no_grad():
        return torch.tensor([rm(torch.tensor([r], device=device)).rewards[0, -1].item() for r in rows])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lm_kind,rm_kind", [("bpe", "bpe"), ("metaspace", "bpe")])
@pytest.mark.parametrize("context", ["continuation", "full"])
def test_cached_rewards_match_scratch_on_device(device, lm_kind, rm_kind, context):
    lm_tok, rm_tok = make_tokenizer(kind=lm_kind), make_tokenizer(kind=rm_kind)
    lm = tiny_lm(lm_tok, seed=2).to(device)
    rm = tiny_reward(rm_tok, seed=6).to(device)
    term = SteeringTerm(RewardModelScorer(rm, name="r", context=context), beta=3.0)
    out = RewardAugmentedGenerator(lm, lm_tok, [term], k=6).generate(
        PROMPTS, max_new_tokens=12, num_return_sequences=2, seed=3, return_traces=True)
    assert out.sequences.device.type == device
    checked = 0
    for step, st in enumerate(out.traces[0]):
        got = st.rewards["r"].cpu()
        want = reference_rewards(rm, lm_tok, lm_kind == rm_kind, context, out.sequences, step, st.topk_ids, device)
        live = (st.chosen >= 0).cpu()[:, None].expand_as(got)
        assert torch.allclose(got[live], want.view_as(got)[live], atol=1e-4), step
        checked += int(live.sum())
    assert checked >= 6 * 6 * 6  # at least six steps of all six rows were compared


def test_device_names_are_validated_in_steering_configs():
    from steerkit.config import SteeringConfig
    from steerkit.errors import ConfigError

    assert SteeringConfig.from_dict({"device": "cpu"}).device == "cpu"
    assert SteeringConfig.from_dict({}).device is None
    with pytest.raises(ConfigError, match="not a torch device"):
        SteeringConfig.from_dict({"device": "gpu"})


def test_generate_moves_models_to_the_device_or_says_why_not(tokenizer, monkeypatch):
    import steerkit
    from steerkit.errors import ConfigError

    lm, rm = tiny_lm(tokenizer, seed=3), tiny_reward(tokenizer, seed=4)
    out = steerkit.generate(["The quick"], lm=(lm, tokenizer), rewards={RewardModelScorer(rm, name="r"): 2.0}, k=4,
                            max_new_tokens=3, seed=0, device="cpu")
    assert out.sequences.device.type == "cpu" and len(out.texts) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        steerkit.generate(["The quick"], lm=(lm, tokenizer), rewards={RewardModelScorer(rm, name="r"): 2.0}, k=4,
                          max_new_tokens=3, device="cuda")


def test_cli_rejects_an_unknown_device(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "steerkit", "generate", "hi", "--device", "tpu0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not a torch device" in proc.stderr and "Traceback" not in proc.stderr

"""The shipped token-level reward `toxicity-token` decoding the real SmolLM2-135M-Instruct."""

import pytest
import torch

from conftest import generate_cli, requires_smollm2, shipped_reward_on_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]


@pytest.fixture(scope="module")
def setup():
    return shipped_reward_on_smollm2("toxicity-token")


def test_toxicity_token_decodes_smollm2_with_exact_cached_rewards(setup):
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.steering import SteeringTerm

    model, tokenizer, reward = setup
    rm = reward.model
    prompts = ["I can't believe my neighbour would", "The weather in Paris is"]
    out = RewardAugmentedGenerator(model, tokenizer, [SteeringTerm(reward, -30.0)], k=500).generate(
        prompts, max_new_tokens=8, seed=0, return_traces=True, eos_token_id=[])
    assert all(text.strip() for text in out.texts)
    worst = 0.0
    for step, trace in enumerate(out.traces[0]):
        for b in range(len(prompts)):
            row = [rm.config.start_token_id] + out.sequences[b, :step].tolist()
            candidates = trace.topk_ids[b, :20].tolist()
            with torch.no_grad():  # from scratch: the realized-token reward of prefix + v
                ref = rm(torch.tensor([row + [c] for c in candidates])).rewards[:, -1]
            worst = max(worst, (ref - trace.rewards["toxicity-token"][b, :20]).abs().max().item())
    assert worst <= 1e-4, worst


def test_composes_with_the_sequence_reward_from_the_cli(setup):
    done = generate_cli("You are such a", "--reward", "toxicity=-20", "--reward", "toxicity-token=-20", "-k", "20",
                        "--max-new-tokens", "6", "--seed", "0", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "texts" in done.stdout or "text" in done.stdout

"""The shipped `toxicity-lm` (a token head on SmolLM2-135M-Instruct's own final hidden state) steering the real LM:
the engine's rewards are the head on the LM's own forward of prompt + continuation, and every surface that hands no
state, or another LM, is refused by name. (Through llama.cpp: tests/integration/test_llama_cpp_engine.py.)"""

import pytest
import torch

from conftest import generate_cli, requires_smollm2, shipped_reward_on_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]


@pytest.fixture(scope="module")
def setup():
    return shipped_reward_on_smollm2("toxicity-lm")


def test_rewards_are_the_head_on_the_lms_own_forward(setup):
    from steerkit.decoding import RewardAugmentedGenerator
    from steerkit.steering import SteeringTerm

    model, tokenizer, reward = setup
    rm = reward.model
    assert reward.reads_lm_state and rm.config.start_token_id is None
    prompts = ["I can't believe my neighbour would", "The weather in Paris is"]
    out = RewardAugmentedGenerator(model, tokenizer, [SteeringTerm(reward, -30.0)], k=20).generate(
        prompts, max_new_tokens=8, do_sample=False, return_traces=True, eos_token_id=[])
    assert all(text.strip() for text in out.texts)
    special = set(tokenizer.all_special_ids)
    worst = 0.0
    for step, trace in enumerate(out.traces[0]):
        for b, prompt in enumerate(prompts):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + out.sequences[b, :step].tolist()
            candidates = trace.topk_ids[b].tolist()
            with torch.no_grad():  # the stand-alone model (its own copy of the 30 layers): realized-token rewards
                ref = rm(torch.tensor([ids + [c] for c in candidates])).rewards[:, -1]
                # a candidate that adds no text gets the prefix's baseline f(b.h + c) (the stand-alone forward keeps
                # the last text token's reward for a realized one, which no training text has)
                hidden = rm.backbone(input_ids=torch.tensor([ids])).last_hidden_state
                baseline = torch.sigmoid(rm.head(hidden)[1][0, -1])
            is_special = torch.tensor([c in special for c in candidates])
            ref = torch.where(is_special, baseline, ref)
            worst = max(worst, (ref - trace.rewards["toxicity-lm"][b]).abs().max().item())
    assert worst <= 1e-4, worst


def test_another_lm_is_refused(setup):
    import steerkit
    from steerkit.errors import LMStateUnavailableError

    _, tokenizer, _ = setup
    from steerkit.testing import tiny_lm

    other = tiny_lm(tokenizer, hidden=576)  # SmolLM2's vocabulary and width, other weights
    with pytest.raises(LMStateUnavailableError, match="output embeddings are not that model's"):
        steerkit.generate("You are such a", lm=(other, tokenizer), rewards={"toxicity-lm": -20.0}, max_new_tokens=2)


def test_the_compiled_step_refuses_it_from_the_cli(setup):
    # (llama.cpp hands the state: tests/integration/test_llama_cpp_engine.py)
    done = generate_cli("You are such a", "--reward", "toxicity-lm=-20", "-k", "20", "--max-new-tokens", "4",
                        "--compile", timeout=600)
    assert done.returncode != 0
    assert "reads the language model's own final hidden state" in done.stderr and "Traceback" not in done.stderr


def test_composes_with_the_sequence_reward_from_the_cli(setup):
    done = generate_cli("You are such a", "--reward", "toxicity=-20", "--reward", "toxicity-lm=-20", "-k", "20",
                        "--max-new-tokens", "6", "--seed", "0", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "text" in done.stdout

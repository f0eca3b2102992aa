"""Composition of several rewards over one shared top-k set: signed β, per-reward transforms, β schedules.

The reference values are computed independently of the decoder: LM logits from a fresh uncached forward
over prompt + generated tokens, rewards from scoring the decoded text from scratch, β and transforms by hand.
"""

from __future__ import annotations

import pytest
import torch

from tiny import make_tokenizer, tiny_lm, tiny_reward

from steerkit.decoding import RewardAugmentedGenerator
from steerkit.errors import InvalidArgumentError
from steerkit.hf import RewardAugmentedLogitsProcessor
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import BetaSchedule, SteeringTerm, make_transform

K = 6
PROMPTS = ["The movie was", "Café 12"]


@pytest.fixture(scope="module")
def setup():
    tok = make_tokenizer(kind="bpe")
    lm = tiny_lm(tok, seed=11)
    rm_same = tiny_reward(tok, seed=12, name="same")  # same tokenizer as the LM
    rm_other = tiny_reward(make_tokenizer(kind="metaspace"), seed=13, name="other")  # bridged
    return tok, lm, rm_same, rm_other


def beta1(step):  # linear ramp from 1 to -4 over 5 steps, then -4
    return 1.0 + (-4.0 - 1.0) * step / 5 if step < 5 else -4.0


def terms_for(rm_same, rm_other):
    return [
        SteeringTerm(RewardModelScorer(rm_same, name="same"), BetaSchedule(-4.0, "linear", start=1.0, steps=5),
                     make_transform("clamp", (0.2, 0.7)), name="same"),
        SteeringTerm(RewardModelScorer(rm_other, name="other", context="full"), 6.0, make_transform("invert"),
                     name="other"),
    ]


def score_ids(rm, rows):
    """Rewards of token-id sequences from scratch (start token + ids, no cache)."""
    start = rm.config.start_token_id
    with torch.no_grad():
        return torch.tensor([rm(torch.tensor([[start] + r])).rewards[0, -1].item() for r in rows])


def expected_step(tok, lm, rm_same, rm_other, prompt, done, step):
    """softmax(z + β1(t)·clamp(ρ1) + β2·(1 − ρ2)) over the LM's top-k, all computed from scratch."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"] + done
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits[0, -1].float()
    z, top = logits.topk(K)
    texts = [tok.decode(done + [c], skip_special_tokens=True) for c in top.tolist()]
    # same tokenizer: the reward model reads the LM's own token ids; bridged: it re-tokenizes the decoded text
    rho1 = score_ids(rm_same, [done + [c] for c in top.tolist()]).clamp(0.2, 0.7)
    rho2 = 1 - torch.tensor(rm_other.score_texts([prompt + t for t in texts]))
    return top, z, torch.softmax(z + beta1(step) * rho1 + 6.0 * rho2, -1)


def test_traced_distribution_equals_hand_computed_softmax(setup):
    tok, lm, rm_same, rm_other = setup
    gen = RewardAugmentedGenerator(lm, tok, terms_for(rm_same, rm_other), k=K)
    out = gen.generate(PROMPTS, max_new_tokens=12, seed=0, return_traces=True)
    (trace,) = out.traces
    assert len(trace) >= 10
    for step, st in enumerate(trace):
        assert st.betas == {"same": pytest.approx(beta1(step)), "other": 6.0}
        for row, prompt in enumerate(PROMPTS):
            if st.chosen[row] < 0:
                continue
            done = out.sequences[row, :step].tolist()
            top, z, p = expected_step(tok, lm, rm_same, rm_other, prompt, done, step)
            assert torch.equal(st.topk_ids[row], top)
            assert torch.allclose(st.topk_logits[row], z, atol=1e-4)
            # the traces hold everything needed to recompute the distribution ...
            manual = st.topk_logits[row] + st.betas["same"] * st.rewards["same"][row] + 6.0 * st.rewards["other"][row]
            assert torch.allclose(torch.softmax(manual, -1), p, atol=1e-5)
            # ... and the decoder's own scores give the same distribution
            assert torch.allclose(torch.softmax(st.scores[row], -1), p, atol=1e-5), (step, row)
            assert 0 <= st.chosen[row] < K


def test_logits_processor_distribution_over_the_vocabulary(setup):
    """The processor's output is what transformers samples from: hand-computed p on the top-k, 0 elsewhere."""
    tok, lm, rm_same, rm_other = setup
    proc = RewardAugmentedLogitsProcessor(tok, terms_for(rm_same, rm_other), k=K)
    prompt = PROMPTS[0]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = list(prompt_ids)
    for step in range(8):
        with torch.no_grad():
            logits = lm(torch.tensor([ids])).logits[:, -1].float()
        probs = torch.softmax(proc(torch.tensor([ids]), logits.clone()), -1)[0]
        top, _, p = expected_step(tok, lm, rm_same, rm_other, prompt, ids[len(prompt_ids):], step)
        want = torch.zeros_like(probs).scatter_(0, top, p)
        assert torch.allclose(probs, want, atol=1e-5), step
        ids.append(int(top[step % K]))  # walk through different candidates


def test_beta_sign_steers_both_ways(setup):
    tok, lm, rm_same, _ = setup
    means = {}
    for beta in (-30.0, 0.0, 30.0):
        term = SteeringTerm(RewardModelScorer(rm_same), beta, name="r")
        out = RewardAugmentedGenerator(lm, tok, [term], k=20).generate(PROMPTS, max_new_tokens=10, do_sample=False)
        means[beta] = sum(rm_same.score_texts(out.texts)) / len(out.texts)
    assert means[-30.0] < means[0.0] < means[30.0]


def test_beta_schedules():
    ramp = BetaSchedule(10.0, "linear", start=-2.0, steps=4)
    assert [ramp.at(t) for t in range(6)] == [-2.0, 1.0, 4.0, 7.0, 10.0, 10.0]
    assert [BetaSchedule(3.0).at(t) for t in (0, 5, 100)] == [3.0, 3.0, 3.0]
    with pytest.raises(InvalidArgumentError, match="steps"):
        BetaSchedule(1.0, "linear", steps=0)
    with pytest.raises(InvalidArgumentError, match="kind"):
        BetaSchedule(1.0, "exponential")
    with pytest.raises(InvalidArgumentError, match="finite"):
        SteeringTerm(object(), float("nan"), name="x")


def test_transforms():
    rho = torch.tensor([0.0, 0.3, 0.9])
    assert torch.allclose(make_transform("invert")(rho), torch.tensor([1.0, 0.7, 0.1]))
    assert torch.allclose(make_transform("clamp", (0.2, 0.5))(rho), torch.tensor([0.2, 0.3, 0.5]))
    assert make_transform("none") is None
    with pytest.raises(InvalidArgumentError, match="transform"):
        make_transform("square")


def test_duplicate_term_names_are_refused(setup):
    tok, lm, rm_same, _ = setup
    terms = [SteeringTerm(RewardModelScorer(rm_same), 1.0, name="r"), SteeringTerm(RewardModelScorer(rm_same), 2.0, name="r")]
    with pytest.raises(InvalidArgumentError, match="named 'r'"):
        RewardAugmentedGenerator(lm, tok, terms, k=K)
    with pytest.raises(InvalidArgumentError, match="named 'r'"):
        RewardAugmentedLogitsProcessor(tok, terms, k=K)

"""Python API edge inputs (issue 10, items 5, 6, 17, 18): a typed error, a warning, or the right result."""

import copy
import math
import warnings

import numpy as np
import pytest
import torch

import steerkit
from steerkit.decoding import RewardAugmentedGenerator, build_terms, sample_token
from steerkit.hf import RewardAugmentedLogitsProcessor
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.steering import LARGE_K, MAX_ABS_BETA, BetaSchedule, SteeringTerm, SteerkitWarning

PROMPTS = ["The quick", "You are a wonderful friend and I"]


@pytest.fixture
def scorer(reward_model):
    return RewardModelScorer(reward_model, name="tiny")


@pytest.fixture(scope="module")
def nan_reward(reward_model):
    """A real reward model whose head weights are NaN: every reward it returns is NaN."""
    broken = copy.deepcopy(reward_model)
    with torch.no_grad():
        broken.head.weight.fill_(math.nan)
    return RewardModelScorer(broken, name="broken")


def hf_generate(lm, tokenizer, prompts, seed, **kw):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    return lm.generate(**enc, pad_token_id=tokenizer.pad_token_id, **kw)[:, enc["input_ids"].shape[1]:]


# -- item 5: β and temperature in float32, non-finite rewards ------------------------------------------------------

@pytest.mark.parametrize("beta", [1e39, -1e39, 3e38, MAX_ABS_BETA * 1.5])
def test_beta_that_overflows_float32_is_refused(scorer, beta):
    with pytest.raises(steerkit.InvalidArgumentError, match=r"beta for reward 'tiny'.*at most 1e\+30"):
        SteeringTerm(scorer, beta)
    with pytest.raises(steerkit.InvalidArgumentError, match="at most"):
        BetaSchedule(beta)
    with pytest.raises(steerkit.InvalidArgumentError, match="beta_start"):
        BetaSchedule(1.0, "linear", start=beta, steps=3)


def test_betas_whose_sum_overflows_are_refused(lm, tokenizer, reward_model):
    terms = [SteeringTerm(RewardModelScorer(reward_model, name=n), 6e29) for n in ("a", "b")]
    with pytest.raises(steerkit.InvalidArgumentError, match="add up to"):
        RewardAugmentedGenerator(lm, tokenizer, terms, k=5)
    with pytest.raises(steerkit.InvalidArgumentError, match="add up to"):
        RewardAugmentedLogitsProcessor(tokenizer, terms, k=5)
    ramp = SteeringTerm(RewardModelScorer(reward_model, name="c"), BetaSchedule(1.0, "linear", start=-6e29, steps=4))
    with pytest.raises(steerkit.InvalidArgumentError, match="add up to"):
        RewardAugmentedGenerator(lm, tokenizer, [terms[0], ramp], k=5)


def test_largest_allowed_beta_decodes_finite_scores(lm, tokenizer, reward_model):
    terms = [SteeringTerm(RewardModelScorer(reward_model, name=n), MAX_ABS_BETA / 2) for n in ("a", "b")]
    out = RewardAugmentedGenerator(lm, tokenizer, terms, k=5).generate(
        PROMPTS, max_new_tokens=3, seed=0, return_traces=True, eos_token_id=[])
    assert all(torch.isfinite(t.scores).all() for t in out.traces[0])


@pytest.mark.parametrize("temperature", [1e-46, 1e39, 0.0, -1.0, math.nan, math.inf, "1", None, True])
def test_temperature_must_be_positive_and_finite_in_float32(lm, tokenizer, temperature):
    with pytest.raises(steerkit.InvalidArgumentError, match="temperature"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], temperature=temperature)


def test_tiny_temperature_samples_like_greedy(lm, tokenizer, scorer):
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 3.0)], k=10)
    greedy = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[])
    tiny = gen.generate(PROMPTS, max_new_tokens=8, temperature=1e-45, seed=0, eos_token_id=[])
    assert torch.equal(tiny.sequences, greedy.sequences)
    # the LogitsProcessor path, where transformers applies the temperature, too
    proc = RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(scorer, 3.0)], k=10)
    hf = hf_generate(lm, tokenizer, PROMPTS, 0, logits_processor=[proc], do_sample=True, top_k=0, top_p=1.0,
                     temperature=1e-45, max_new_tokens=8, min_new_tokens=8)
    assert torch.equal(hf, greedy.sequences)


def test_max_subtracted_sampling_is_bit_identical_at_temperature_one():
    scores = torch.randn(4, 50) * 7
    scores[:, 10:] = -math.inf
    for seed in range(20):
        torch.manual_seed(seed)
        old = torch.multinomial(torch.softmax(scores / 1.0, dim=-1), 1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(sample_token(scores, 1.0), old)


@pytest.mark.parametrize("beta", [2.0, 0.0])
def test_nan_reward_raises_naming_reward_and_step(lm, tokenizer, scorer, nan_reward, beta):
    terms = [SteeringTerm(scorer, 1.0), SteeringTerm(nan_reward, beta)]
    gen = RewardAugmentedGenerator(lm, tokenizer, terms, k=5)
    for do_sample in (True, False):
        with pytest.raises(steerkit.NonFiniteRewardError, match=r"Reward 'broken' returned nan at decoding step 0"):
            gen.generate(PROMPTS, max_new_tokens=4, do_sample=do_sample, seed=0)


def test_nan_reward_in_the_logits_processor(lm, tokenizer, nan_reward):
    proc = RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(nan_reward, -1.0)], k=5)
    with pytest.raises(steerkit.NonFiniteRewardError, match="'broken'.*step 0"):
        hf_generate(lm, tokenizer, PROMPTS, 0, logits_processor=[proc], do_sample=True, top_k=0, max_new_tokens=3)


def test_non_finite_error_is_a_steerkit_error():
    assert issubclass(steerkit.NonFiniteRewardError, steerkit.SteerkitError)


# -- item 6: stop strings --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stop", [[""], ["ok", ""], [None], [3], "", ["a\ud800"]])
def test_bad_stop_strings(lm, tokenizer, stop):
    with pytest.raises(steerkit.InvalidArgumentError, match="stop_strings|stop strings"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], stop_strings=stop, max_new_tokens=3)


def test_one_stop_string_is_one_stop_string(lm, tokenizer):
    gen = RewardAugmentedGenerator(lm, tokenizer, [], k=5)
    free = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[])
    piece = free.texts[1][:3]
    as_str = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[], stop_strings=piece)
    as_list = gen.generate(PROMPTS, max_new_tokens=8, do_sample=False, eos_token_id=[], stop_strings=[piece])
    assert as_str.texts == as_list.texts


# -- item 17: Python API types and ranges ------------------------------------------------------------------------------

def test_lone_surrogate_in_prompt(lm, tokenizer):
    with pytest.raises(steerkit.InvalidArgumentError, match=r"Prompt 1 .*position 1"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["fine", "a\ud800b"], max_new_tokens=2)
    with pytest.raises(steerkit.InvalidArgumentError, match=r"Prompt 0 .*position 1"):
        steerkit.generate("a\ud800b", lm=(lm, tokenizer), rewards=None, k=3, max_new_tokens=2)


@pytest.mark.parametrize("beta", ["abc", None, "5", [1.0], True, object()])
def test_beta_of_the_wrong_type(scorer, beta):
    with pytest.raises(steerkit.InvalidArgumentError, match="beta for reward 'tiny' must be a number"):
        SteeringTerm(scorer, beta)
    with pytest.raises(steerkit.InvalidArgumentError, match="must be a number"):
        build_terms([(scorer, beta)])


def test_bad_beta_fails_before_any_reward_is_loaded():
    # "no-such-reward" would raise PluginError if it were loaded first
    with pytest.raises(steerkit.InvalidArgumentError, match="beta for reward 'no-such-reward' must be a number"):
        build_terms({"no-such-reward": "abc"})


def test_numpy_betas_are_numbers(scorer):
    assert SteeringTerm(scorer, np.float32(2.5)).weight(0) == 2.5
    assert SteeringTerm(scorer, np.int64(-3)).weight(0) == -3.0


@pytest.mark.parametrize("rewards", [["toxicity"], "toxicity", [("toxicity",)], [("toxicity", 1, 2)], 5])
def test_rewards_in_the_wrong_form(rewards):
    expected = r"mapping of reward references to beta .*\(reference, beta\)"
    with pytest.raises(steerkit.InvalidArgumentError, match=expected):
        build_terms(rewards)


def test_rewards_in_each_accepted_form(scorer):
    for rewards in ({scorer: 2.0}, [(scorer, 2.0)], [[scorer, 2.0]], [SteeringTerm(scorer, 2.0)]):
        (term,) = build_terms(rewards)
        assert term.name == "tiny" and term.weight(0) == 2.0
    assert build_terms(None) == [] and build_terms({}) == [] and build_terms([]) == []


@pytest.mark.parametrize("batch_size", [-1, 0, True, 1.5, "2"])
def test_bad_batch_size(lm, tokenizer, batch_size):
    with pytest.raises(steerkit.InvalidArgumentError, match="batch_size must be a positive integer"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(PROMPTS, max_new_tokens=2, batch_size=batch_size)


def test_batch_size_none_and_numpy(lm, tokenizer):
    gen = RewardAugmentedGenerator(lm, tokenizer, [], k=3)
    whole = gen.generate(PROMPTS, max_new_tokens=3, do_sample=False, eos_token_id=[], batch_size=None)
    chunked = gen.generate(PROMPTS, max_new_tokens=3, do_sample=False, eos_token_id=[], batch_size=np.int64(1))
    assert whole.texts == chunked.texts


@pytest.mark.parametrize("seed", [2**70, 2**64, -(2**63) - 1, True, 1.0, "0"])
def test_seed_out_of_range(lm, tokenizer, seed):
    with pytest.raises(steerkit.InvalidArgumentError, match=r"seed must be an integer in \[-9223372036854775808, "
                                                           r"18446744073709551615\]"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], max_new_tokens=2, seed=seed)


def test_numpy_seed_and_k(lm, tokenizer, scorer):
    gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 2.0)], k=np.int64(5))
    assert gen.k == 5 and type(gen.k) is int
    a = gen.generate(PROMPTS, max_new_tokens=4, seed=np.int64(3))
    b = gen.generate(PROMPTS, max_new_tokens=4, seed=3)
    assert torch.equal(a.sequences, b.sequences)
    assert gen.generate(PROMPTS, max_new_tokens=2, seed=2**64 - 1).sequences.shape[0] == 2  # torch's maximum
    assert RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(scorer, 2.0)], k=np.int32(4)).k == 4


@pytest.mark.parametrize("name", ["max_new_tokens", "num_return_sequences"])
@pytest.mark.parametrize("value", [True, False, 2.0, "3", None])
def test_integer_settings_refuse_bools_and_non_integers(lm, tokenizer, name, value):
    with pytest.raises(steerkit.InvalidArgumentError, match=f"{name} must be a positive integer"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=3).generate(["hi"], **{name: value})


@pytest.mark.parametrize("k", [True, np.bool_(True), 5.0, "5"])
def test_k_refuses_bools_in_every_path(lm, tokenizer, k):
    with pytest.raises(steerkit.InvalidArgumentError, match=r"k must be an integer in \[1, \d+\]"):
        RewardAugmentedGenerator(lm, tokenizer, [], k=k)
    with pytest.raises(steerkit.InvalidArgumentError, match=r"k must be an integer in \[1, \d+\]"):
        RewardAugmentedLogitsProcessor(tokenizer, [], k=k)


def test_unknown_device_is_a_typed_error(lm, tokenizer):
    with pytest.raises(steerkit.SteerkitError, match="nonsense"):
        steerkit.generate(["hi"], lm=(lm, tokenizer), k=3, max_new_tokens=2, device="nonsense")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_device_fails_before_the_lm_is_loaded():
    # loading "no-such-model" would raise ModelNotFoundError: the device is checked first
    with pytest.raises(steerkit.ConfigError, match="no CUDA GPU"):
        steerkit.generate(["hi"], lm="no-such-model", device="cuda")


# -- item 18: large k with a sequence reward --------------------------------------------------------------------------

class TokenLevelScorer(RewardModelScorer):
    kind = "token"


def test_large_k_with_a_sequence_reward_warns(lm, tokenizer, scorer, reward_model):
    k = LARGE_K + 1
    with pytest.warns(SteerkitWarning, match=rf"k={k} .*'tiny'.*smaller k .*token-level reward"):
        RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1.0)], k=k)
    with pytest.warns(SteerkitWarning, match="token-level"):
        RewardAugmentedLogitsProcessor(tokenizer, [SteeringTerm(scorer, 1.0)], k=k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1.0)], k=LARGE_K)
        RewardAugmentedGenerator(lm, tokenizer, [], k=k)  # no reward: plain top-k is cheap
        RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(TokenLevelScorer(reward_model, name="t"), 1.0)], k=k)
    assert issubclass(SteerkitWarning, UserWarning)


def test_slow_run_shows_per_step_progress(lm, tokenizer, scorer, monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("TERM", "xterm")
    with pytest.warns(SteerkitWarning):
        gen = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1.0)], k=LARGE_K + 1)
    gen.generate(["hi"], max_new_tokens=3, eos_token_id=[], seed=0, progress=True)
    assert "Decoding steps" in capsys.readouterr().err
    fast = RewardAugmentedGenerator(lm, tokenizer, [SteeringTerm(scorer, 1.0)], k=5)
    fast.generate(["hi"], max_new_tokens=3, eos_token_id=[], seed=0, progress=True)
    assert "Decoding steps" not in capsys.readouterr().err  # one quick batch: no bar at all

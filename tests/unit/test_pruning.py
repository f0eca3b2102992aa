"""The pruned RAD step (steerkit/engine/pruning.py): a bounded reward is scored only on the candidates that can still
be chosen, and every row chooses the token that scoring all k candidates chooses."""

from __future__ import annotations

import pytest
import torch

from serve_support import queued_tokens
import steerkit.engine.core as core
from steerkit import RewardAugmentedGenerator, SteeringTerm
from steerkit.engine.pruning import ROUND_ONE, Gate, carry_guess, prunable
from steerkit.engine.step import make_plan
from steerkit.rewards.base import candidate_bounds
import steerkit.rewards.cache as cache
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.token.session import TokenReward
from steerkit.serving.engine import Engine
from steerkit.serving.requests import RowSpec
from steerkit.steering import make_transform
from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward, tiny_token_reward


class Counted:
    """A reward that hands its sessions' work to a real one and counts the candidates they score; ``scale``
    multiplies the rewards (3: a reward that breaks the bounds it declares)."""

    def __init__(self, inner, scale: float = 1.0):
        self.inner, self.scale, self.name, self.scored = inner, scale, inner.name, 0

    @property
    def candidate_bounds(self):
        return self.inner.candidate_bounds

    def start(self, prefixes, lm_tokenizer):
        return _CountedSession(self, self.inner.start(prefixes, lm_tokenizer))


class _CountedSession:
    def __init__(self, owner: Counted, session):
        self.owner, self.session = owner, session

    def score(self, candidates, active=None):
        if active is None:
            self.owner.scored += candidates.numel()
            return self.session.score(candidates) * self.owner.scale
        self.owner.scored += int(active.sum())  # a ragged session scores only these
        return self.session.score(candidates, active=active) * self.owner.scale

    def add_rows(self, other):
        self.session.add_rows(other.session)

    def __getattr__(self, name):  # commit, commit_chosen, keep_rows, supports_row_changes, ragged
        return getattr(self.session, name)


@pytest.fixture(scope="module")
def parts():
    tokenizer = make_tokenizer()
    return tokenizer, tiny_lm(tokenizer), tiny_reward(tokenizer)


@pytest.fixture(scope="module")
def peaked(parts):
    """A tiny LM whose next-token logits spread over tens of nats (a real LM's do; a random tiny one's do not), so
    that bounds rule most candidates out."""
    tokenizer = parts[0]
    lm = tiny_lm(tokenizer)
    with torch.no_grad():
        lm.lm_head.weight.mul_(40.0)
    return lm


def decode(monkeypatch, prune: bool, lm, tokenizer, terms, **kw):
    monkeypatch.setattr(core, "PRUNE_CANDIDATES", prune)
    prompts = kw.pop("prompts", ["The movie was", "You are", "a b c"])
    generator = RewardAugmentedGenerator(lm, tokenizer, terms, k=kw.pop("k", 12))
    return generator.generate(prompts, max_new_tokens=10, seed=3, **kw).sequences


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("beta", [-30.0, -2.0, 4.0])
def test_generate_chooses_what_scoring_every_candidate_chooses(monkeypatch, parts, peaked, do_sample, beta):
    tokenizer, lm, rm = parts
    for model in (lm, peaked):
        reward = Counted(RewardModelScorer(rm))
        terms = [SteeringTerm(reward, beta)]
        full = decode(monkeypatch, False, model, tokenizer, terms, num_return_sequences=2, do_sample=do_sample)
        every = reward.scored
        pruned = decode(monkeypatch, True, model, tokenizer, terms, num_return_sequences=2, do_sample=do_sample)
        assert torch.equal(full, pruned)
        assert every == 6 * 12 * full.shape[1]  # the unpruned step scores all k of every row
        assert reward.scored > every  # the pruned one scored too


@pytest.mark.parametrize("do_sample", [False, True])
def test_one_row_scores_few_candidates_where_the_bounds_rule_them_out(monkeypatch, parts, peaked, do_sample):
    tokenizer, _, rm = parts
    reward = Counted(RewardModelScorer(rm))
    terms = [SteeringTerm(reward, -3.0)]
    kw = dict(prompts=["The movie was"], k=16, do_sample=do_sample)
    full = decode(monkeypatch, False, peaked, tokenizer, terms, **kw)
    every, reward.scored = reward.scored, 0
    pruned = decode(monkeypatch, True, peaked, tokenizer, terms, **kw)
    assert torch.equal(full, pruned)
    assert every == 16 * full.shape[1]
    assert reward.scored <= 0.5 * every, (reward.scored, every)


@pytest.mark.parametrize("family", ["same", "bridged"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_batch_hands_each_row_its_own_candidates(monkeypatch, parts, peaked, do_sample, family):
    """Eight rows: the torch cache scores each row only on the candidates it needs (ragged), not all as many as the
    neediest row's; the tokens are those of the padded pruned step and of the unpruned one. ``bridged``: a reward
    model of another tokenizer family (its session re-tokenizes each candidate's text: BridgedSession)."""
    from steerkit.rewards.sequence.bridge import BridgedSession

    tokenizer, _, rm = parts
    if family == "bridged":
        rm = tiny_reward(make_tokenizer(kind="metaspace", vocab_size=350), seed=6)
        session = RewardModelScorer(rm).start(["a"], tokenizer)
        assert isinstance(session, BridgedSession) and session.ragged
    prompts = ["The movie was", "You are", "a b c", "x", "I think", "b a", "the the", "no"]
    kw = dict(prompts=prompts, k=16, do_sample=do_sample, eos_token_id=[])
    got, scored = {}, {}
    for label, prune, ragged in [("full", False, True), ("padded", True, False), ("ragged", True, True)]:
        monkeypatch.setattr(cache, "RAGGED_SCORING", ragged)
        reward = Counted(RewardModelScorer(rm))
        got[label] = decode(monkeypatch, prune, peaked, tokenizer, [SteeringTerm(reward, -3.0)], **kw)
        scored[label] = reward.scored
    assert torch.equal(got["full"], got["padded"]) and torch.equal(got["full"], got["ragged"])
    assert scored["ragged"] < 0.8 * scored["padded"] <= 0.8 * scored["full"], scored


@pytest.mark.parametrize("temperature", [1e-45, 0.3, 2.5])
def test_temperatures(monkeypatch, parts, peaked, temperature):
    """A tiny temperature (1 / T overflows float32) samples as greedy does, pruned too; others as unpruned."""
    tokenizer, _, rm = parts
    terms = [SteeringTerm(Counted(RewardModelScorer(rm)), -3.0)]
    kw = dict(prompts=["The movie was", "You are"], k=16, temperature=temperature, eos_token_id=[])
    pruned = decode(monkeypatch, True, peaked, tokenizer, terms, **kw)
    assert torch.equal(pruned, decode(monkeypatch, False, peaked, tokenizer, terms, **kw))
    if temperature < 1e-30:
        assert torch.equal(pruned, decode(monkeypatch, True, peaked, tokenizer, terms, prompts=kw["prompts"], k=16,
                                          do_sample=False, eos_token_id=[]))


def test_a_reward_outside_its_declared_bounds_is_scored_in_full(monkeypatch, parts, peaked):
    """A reward that says ρ ∈ [0, 1] and returns up to 3: the pruned step notices, scores every candidate, and
    chooses what the unpruned step chooses."""
    tokenizer, _, rm = parts
    for do_sample in (False, True):
        reward = Counted(RewardModelScorer(rm), scale=3.0)
        terms = [SteeringTerm(reward, -3.0)]
        kw = dict(prompts=["The movie was"], k=16, do_sample=do_sample)
        assert torch.equal(decode(monkeypatch, False, peaked, tokenizer, terms, **kw),
                           decode(monkeypatch, True, peaked, tokenizer, terms, **kw))


def test_two_rewards_one_bounded_and_transforms(monkeypatch, parts, peaked):
    """A token-level reward (no bounds: scored on all k) beside a bounded one shaped by invert and clamp."""
    tokenizer, _, rm = parts
    token = TokenReward(tiny_token_reward(tokenizer))
    assert candidate_bounds(token) is None and candidate_bounds(RewardModelScorer(rm)) == (0.0, 1.0)
    for do_sample in (False, True):
        seq = Counted(RewardModelScorer(rm))
        terms = [SteeringTerm(seq, -4.0, make_transform("invert")), SteeringTerm(token, 2.0, name="tok"),
                 SteeringTerm(seq, 3.0, make_transform("clamp", (0.2, 0.7)), name="again")]
        kw = dict(prompts=["The movie was", "You are"], k=16, do_sample=do_sample)
        assert torch.equal(decode(monkeypatch, False, peaked, tokenizer, terms, **kw),
                           decode(monkeypatch, True, peaked, tokenizer, terms, **kw))


def test_declared_bounds_are_read_only_when_usable():
    def declaring(bounds):
        return type("R", (), {"candidate_bounds": bounds})()

    assert candidate_bounds(declaring((0, 1))) == (0.0, 1.0)
    for bad in (None, (1.0, 0.0), (0.0, float("inf")), (float("nan"), 1.0)):
        assert candidate_bounds(declaring(bad)) is None
    assert candidate_bounds(object()) is None


def test_a_custom_transform_is_not_pruned(parts):
    tokenizer, _, rm = parts
    reward = RewardModelScorer(rm)
    rows = [type("R", (), {"k": 8, "temperature": 1.0, "generator": None,
                           "terms": [SteeringTerm(reward, -2.0, lambda rho: rho * rho)]})()]
    plan = make_plan(rows, "cpu", shared_rng=True)
    assert prunable(plan, {id(reward): (0.0, 1.0)}) == {}
    rows[0].terms = [SteeringTerm(reward, -2.0, make_transform("invert"))]
    assert prunable(make_plan(rows, "cpu", shared_rng=True), {id(reward): (0.0, 1.0)}) == {id(reward): (0.0, 1.0)}


def test_server_rows_with_their_own_settings(monkeypatch, parts, peaked):
    """Rows of one batch with their own k (one at most ROUND_ONE), temperature (greedy among them), seed, β
    schedule and transform: every row's tokens and traced rewards are those of the unpruned step. A wrong commit
    (the chosen token's index among the wrong candidates) would leave the reward's cache on another token and
    change later rewards."""
    tokenizer, _, rm = parts
    specs = [RowSpec("The movie was", 8, temperature=t, k=k, seed=s, trace=True, rewards=r)
             for t, k, s, r in [(0.0, 12, 1, {"tiny": -3.0}), (0.7, ROUND_ONE, 2, {"tiny": -3.0}),
                                (1.3, 16, 3, [{"name": "tiny", "beta": 2.0, "transform": "invert"}]),
                                (1.0, 9, 4, [{"name": "tiny", "beta": -6.0, "schedule": "linear",
                                              "beta_start": 0.0, "ramp_steps": 4}]),
                                (1.0, 16, 5, {})]]
    runs, scored = {}, {}
    for prune in (False, True):
        monkeypatch.setattr(core, "PRUNE_CANDIDATES", prune)
        reward = Counted(RewardModelScorer(rm))
        engine = Engine(peaked, tokenizer, {"tiny": reward}, default_k=8, max_running=8, max_queue=16)
        handles = engine.submit_all(specs)
        engine.start()
        try:
            runs[prune] = [h.result(timeout=60) for h in handles]
        finally:
            engine.shutdown(0)
        scored[prune] = reward.scored
    for full, pruned in zip(runs[False], runs[True]):
        assert full.token_ids == pruned.token_ids
        for a, b in zip(full.rewards or [], pruned.rewards or []):
            assert a.keys() == b.keys() and all(abs(a[n] - b[n]) < 1e-5 for n in a), (a, b)
    assert any(r.rewards for r in runs[True])
    assert scored[True] < scored[False], scored


def test_rows_that_stay_keep_their_guess_when_the_batch_changes():
    """A server's batch changes whenever a row joins or leaves: the rows that stay keep their last ρ (the next round
    one's guess); a newcomer has none (NaN), and a batch of newcomers no guess at all."""
    a, b, c, d = "abcd"
    carried = carry_guess({a: 0, b: 1, c: 2}, {"tiny": torch.tensor([0.1, 0.2, 0.3])}, [c, d, a])
    assert torch.equal(carried["tiny"].isnan(), torch.tensor([False, True, False]))
    assert carried["tiny"][[0, 2]].tolist() == pytest.approx([0.3, 0.1])
    assert carry_guess({a: 0}, {"tiny": torch.tensor([0.1])}, [d]) is None
    assert carry_guess(None, None, [a]) is None


def test_the_gate_pauses_pruning_while_it_does_not_save():
    gate = Gate()
    steps = 0
    while gate.open():  # every pruned step scored K candidates a row and more
        gate.record(24, 20)
        steps += 1
        assert steps < 10
    assert [gate.open() for _ in range(Gate.PAUSE)] == [False] * (Gate.PAUSE - 1) + [True]
    for _ in range(50):  # steps that save keep it open
        gate.record(5, 20)
        assert gate.open()


def test_the_queued_helper_still_agrees(monkeypatch, parts, peaked):
    """Rows admitted together that share a prompt (their prefill shared) decode as they do unpruned."""
    tokenizer, _, rm = parts
    specs = [RowSpec("You are", 6, seed=s, rewards={"tiny": -5.0}) for s in (1, 2, 3)]
    got = {}
    for prune in (False, True):
        monkeypatch.setattr(core, "PRUNE_CANDIDATES", prune)
        got[prune] = queued_tokens(Engine(peaked, tokenizer, {"tiny": RewardModelScorer(rm)}, default_k=12,
                                          max_running=8, max_queue=16), specs)
    assert got[False] == got[True]

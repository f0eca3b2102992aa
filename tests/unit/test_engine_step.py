"""The one RAD step (steerkit.engine.step) and the row text (steerkit.engine.text): what the engine core promises."""

import random
from dataclasses import dataclass, field

import pytest
import torch

from steerkit.engine.step import make_plan, rad_step, sample, score_step
from steerkit.engine.text import StreamText, cut_at_stop, find_stop
from steerkit.steering import BetaSchedule, SteeringTerm, make_transform


class _Reward:
    name = "r"

    def start(self, prompts, tokenizer):  # pragma: no cover - the step is given rewards directly
        raise AssertionError


@dataclass
class _Row:
    k: int
    temperature: float
    terms: list
    generator: object = None
    steps: int = 0
    extra: dict = field(default_factory=dict)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_shared_rng_draw_is_torch_multinomial_on_the_batch(rows):
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        scores = torch.randn(rows, 300, generator=g) * 4
        scores[:, 150:] = float("-inf")
        torch.manual_seed(seed)
        want = torch.multinomial(torch.softmax(scores / 0.8, -1), 1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(sample(scores, [0.8] * rows, None), want)


def test_a_row_with_its_own_generator_draws_what_multinomial_draws_for_it_alone():
    scores = torch.randn(4, 200) * 3
    temperatures = [1.0, 0.0, 0.5, 1.3]  # a greedy row among sampled ones, each its own temperature
    generators = [torch.Generator().manual_seed(s) if t else None for s, t in zip((5, 6, 7, 8), temperatures)]
    got = sample(scores, temperatures, generators)
    for b, (t, s) in enumerate(zip(temperatures, (5, 6, 7, 8))):
        if t == 0:
            assert int(got[b]) == int(scores[b].argmax())
            continue
        alone = torch.multinomial(torch.softmax(scores[b:b + 1] / t, -1), 1,
                                  generator=torch.Generator().manual_seed(s))
        assert int(got[b]) == int(alone)


def _candidate_case(seed: int, rows: int = 6, V: int = 5000, K: int = 12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(rows)])
    scores = torch.full((rows, V), float("-inf"))
    values = torch.randn(rows, K, generator=g) * 3
    values[0, K // 2:] = float("-inf")  # a row masked to its own smaller k
    values[1, :3] = values[1, 3]  # tied candidates
    scores.scatter_(1, ids, values - values.amax(-1, keepdim=True))
    return scores, ids


@pytest.mark.parametrize("seed", range(8))
def test_drawing_at_the_candidates_draws_what_the_whole_row_draws(seed):
    """``sample(..., ids=...)`` takes the logarithm only at the candidates: the same tokens as the draw over the
    whole row, and every generator (or the shared RNG) is left where the whole-row draw leaves it."""
    from steerkit.engine import step

    assert step._candidate_draws_match()  # this torch: the fast path below is the one taken
    scores, ids = _candidate_case(seed)
    temperatures = [1.0, 0.0, 0.7, 1.0, 1.3, 1.0]
    for shared in (False, True):
        states = []
        for use_ids in (None, ids):
            torch.manual_seed(seed)
            gens = None if shared else [torch.Generator().manual_seed(100 + b) if t else None
                                        for b, t in enumerate(temperatures)]
            tokens = [sample(scores, temperatures, gens, ids=use_ids) for _ in range(3)]  # three steps in a row
            states.append((tokens, torch.get_rng_state() if shared else [x.get_state() for x in gens if x]))
        (want, want_state), (got, got_state) = states
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        if shared:
            assert torch.equal(want_state, got_state)
        else:
            assert all(torch.equal(a, b) for a, b in zip(want_state, got_state))


def test_without_the_assumed_kernel_the_whole_row_is_drawn(monkeypatch):
    """A torch whose ``exponential_`` is not what the candidate draw assumes gets the whole-row draw (the check
    failing is simulated)."""
    from steerkit.engine import step

    scores, ids = _candidate_case(3)
    monkeypatch.setattr(step, "_candidate_draws_match", lambda: False)
    monkeypatch.setattr(step, "_draw_at", lambda *a: pytest.fail("the candidate draw was used"))
    torch.manual_seed(1)
    got = sample(scores, [1.0] * 6, None, ids=ids)
    torch.manual_seed(1)
    assert torch.equal(got, torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1))


def _rows_and_rewards(seed: int):
    rng = random.Random(seed)
    rewards = [_Reward(), _Reward()]
    rows = []
    for _ in range(5):
        terms = []
        for j, reward in enumerate(rewards):
            if rng.random() < 0.7:
                beta = rng.choice([-5.0, 0.0, 2.5, BetaSchedule(4.0, "linear", start=-1.0, steps=3)])
                terms.append(SteeringTerm(reward, beta, make_transform(rng.choice(["none", "invert", "clamp"]),
                                                                      (0.2, 0.8)), name=f"t{j}"))
        rng.shuffle(terms)
        rows.append(_Row(rng.randint(1, 12), rng.choice([0.0, 0.7, 1.0]), terms,
                         steps=rng.randint(0, 4)))
    return rows, rewards


@pytest.mark.parametrize("seed", range(6))
def test_each_row_of_a_mixed_batch_gets_exactly_what_it_gets_alone(seed):
    """Rows with their own k, terms (order, β, schedules, transforms) and temperatures share one step: each row's
    scores equal, bit for bit, the step run on that row alone."""
    rows, rewards = _rows_and_rewards(seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), 64, generator=g)
    rho = {id(r): torch.rand(len(rows), 12, generator=g) for r in rewards}
    plan = make_plan(rows, None, shared_rng=False)
    batch = score_step(logits, plan, lambda ids: {key: v[:, :ids.shape[1]] for key, v in rho.items()},
                       [row.steps for row in rows])
    for b, row in enumerate(rows):
        alone_plan = make_plan([row], None, shared_rng=False)
        alone = score_step(logits[b:b + 1], alone_plan,
                           lambda ids: {key: v[b:b + 1, :ids.shape[1]] for key, v in rho.items()}, [row.steps])
        assert torch.equal(batch.scores[b], alone.scores[0]), b
        assert bool(batch.ok[b]) == bool(alone.ok[0])


def test_a_non_finite_reward_flags_only_its_row_and_only_within_its_k():
    reward = _Reward()
    rows = [_Row(2, 1.0, [SteeringTerm(reward, 1.0)]), _Row(4, 1.0, [SteeringTerm(reward, 1.0)]),
            _Row(4, 1.0, [])]
    rho = torch.rand(3, 4)
    rho[0, 3] = float("nan")  # outside row 0's k = 2: not its concern
    rho[1, 1] = float("inf")
    out = score_step(torch.randn(3, 10), make_plan(rows, None, False), lambda ids: {id(reward): rho}, [0, 0, 0])
    assert out.ok.tolist() == [True, False, True]


def test_the_step_reads_nothing_back_to_the_host(monkeypatch):
    """No .item(), .tolist(), bool() or int() of a tensor inside the step: the caller reads ids and ok once."""
    rows, rewards = _rows_and_rewards(1)
    for row in rows:
        row.generator = torch.Generator().manual_seed(1) if row.temperature else None
    logits = torch.randn(len(rows), 64)
    rho = {id(r): torch.rand(len(rows), 12) for r in rewards}
    plan = make_plan(rows, None, shared_rng=False)

    def refuse(*args, **kwargs):
        raise AssertionError("a host read inside the step")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    out = rad_step(logits, plan, lambda ids: {key: v[:, :ids.shape[1]] for key, v in rho.items()},
                   [row.steps for row in rows])
    monkeypatch.undo()
    assert out.tokens.shape == (len(rows),)


@pytest.mark.parametrize("text, stops, include, want", [
    ("say hello world", ["world"], True, "say hello world"),
    ("say hello world", ["world"], False, "say hello "),
    ("abcd", ["abc", "b"], True, "ab"),  # the stop completed first ends the text
    ("abcd", ["abc", "b"], False, "a"),
    ("xaxb", ["b", "a"], True, "xa"),
    ("no stop here", ["zzz"], False, "no stop here"),
])
def test_one_stop_rule_with_an_include_choice(text, stops, include, want):
    assert cut_at_stop(text, stops, include) == want


def test_find_stop_prefers_the_longest_of_stops_ending_together():
    assert find_stop("the end.", ["end.", "d."]) == (4, 8)


def test_streaming_decodes_a_bounded_window_per_token(tokenizer):
    """Incremental detokenization: the ids decoded per token stay bounded (re-decoding the whole output every
    token would decode n(n+1)/2 ids), and the pieces add up to the full decode."""
    text = " ".join(f"word{i} café 🙂" for i in range(60))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoded = []
    real = tokenizer.decode

    class Counting:
        def decode(self, chunk, **kwargs):
            decoded.append(len(chunk))
            return real(chunk, **kwargs)

    stream = StreamText(Counting(), [])
    pieces = [stream.push(ids[:i], final=i == len(ids))[0] for i in range(1, len(ids) + 1)]
    assert "".join(pieces) == real(ids, skip_special_tokens=True)
    assert sum(decoded) <= 16 * len(ids) < len(ids) * (len(ids) + 1) // 2

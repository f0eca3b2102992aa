"""The serving engine (steerkit.serving.engine): rows joining and leaving one decode loop give each seeded row
what ``steerkit.generate`` gives it alone; rows with different k, β, rewards and temperatures share a batch."""

from __future__ import annotations

import asyncio

import pytest
import torch

import steerkit
from steerkit.errors import InvalidArgumentError, PromptTooLongError, ServerBusyError, ServerShuttingDownError
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.serving.engine import Engine
from steerkit.serving.requests import FinishEvent, RowSpec, TokenEvent

TIMEOUT = 60


@pytest.fixture(scope="module")
def reward(reward_model):
    return RewardModelScorer(reward_model, context="full")


@pytest.fixture
def engine(lm, tokenizer, reward):
    eng = Engine(lm, tokenizer, {"tiny": reward}, default_k=5, max_running=4, max_queue=16)
    eng.start()
    yield eng
    eng.shutdown(0)


def solo(lm, tokenizer, reward, spec: RowSpec, default_k=5, eos=None):
    """What steerkit.generate gives this spec alone (the engine's contract for a seeded row)."""
    terms = None
    if spec.rewards:
        terms = [steerkit.SteeringTerm(reward, beta, name=name) for name, beta in spec.rewards.items()]
    out = steerkit.generate([spec.prompt], lm=(lm, tokenizer), rewards=terms, k=spec.k or default_k,
                            max_new_tokens=spec.max_tokens, seed=spec.seed, do_sample=spec.temperature > 0,
                            temperature=spec.temperature or 1.0, stop_strings=list(spec.stop) or None,
                            eos_token_id=eos)
    n = out.num_new_tokens[0]
    return out.sequences[0, :n].tolist(), out.texts[0]


SPECS = [
    RowSpec("The quick brown", 12, seed=1, rewards={"tiny": 5.0}),
    RowSpec("You are", 10, seed=2, temperature=0),
    RowSpec("Numbers 0123 and", 9, seed=3, k=3, rewards={"tiny": -3.0}),
    RowSpec("I hate", 14, seed=4, temperature=0.7, k=8),
    RowSpec("Café déjà vu", 7, seed=5, rewards={"tiny": 1e3}, temperature=1.3),
    RowSpec("The", 11, seed=6, k=1),
]


def test_mixed_rows_equal_generate_alone(engine, lm, tokenizer, reward):
    """Different k, β (and none), temperatures (0 = greedy) and lengths in one batch, with more rows than
    running slots (rows join as others leave): every row equals generate() on that row alone."""
    handles = engine.submit_all(SPECS)
    results = [h.result(timeout=TIMEOUT) for h in handles]
    for spec, res in zip(SPECS, results):
        ids, text = solo(lm, tokenizer, reward, spec)
        assert res.token_ids == ids, spec
        assert res.text == text
        assert res.finish.finish_reason == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
        assert res.finish.completion_tokens == len(ids)
        assert res.finish.prompt_tokens == len(tokenizer(spec.prompt, add_special_tokens=False)["input_ids"])
    stats = engine.stats()
    assert stats["running"] == 0 and stats["queued"] == 0
    assert stats["finished"] == {"length": len(SPECS)} or sum(stats["finished"].values()) == len(SPECS)


def test_a_row_alone_equals_the_row_while_others_join_and_leave(engine):
    target = RowSpec("You are a wonderful", 40, seed=11, rewards={"tiny": 4.0}, k=6)
    alone = engine.submit(target).result(timeout=TIMEOUT).token_ids
    handle = engine.submit(target)
    events = handle.iter_events(timeout=TIMEOUT)
    got = []
    others = []
    for i, event in enumerate(events):
        if isinstance(event, FinishEvent):
            break
        got.append(event.token_id)
        if i in (3, 9, 20):  # newcomers join mid-generation; short ones leave again while the target runs
            others += engine.submit_all([RowSpec("I hate it", 3 + i % 5, seed=i), RowSpec("x", 30, k=9, temperature=0)])
        if i == 12:
            others[1].cancel()
    assert got == alone
    assert all(o.result(timeout=TIMEOUT).finish.finish_reason in ("length", "stop", "cancelled") for o in others)


def test_traces_are_the_rewards_of_the_chosen_tokens(engine, lm, tokenizer, reward):
    spec = RowSpec("The movie was", 6, seed=3, rewards={"tiny": 2.0}, trace=True)
    res = engine.submit(spec).result(timeout=TIMEOUT)
    out = steerkit.generate([spec.prompt], lm=(lm, tokenizer), k=5, max_new_tokens=6, seed=3, return_traces=True,
                            rewards=[steerkit.SteeringTerm(reward, 2.0, name="tiny")])
    for step, (token, rewards) in enumerate(zip(res.token_ids, res.rewards)):
        trace = out.traces[0][step]
        j = trace.topk_ids[0].tolist().index(token)
        assert rewards == {"tiny": pytest.approx(trace.rewards["tiny"][0, j].item(), abs=1e-6)}


def test_stop_string_ends_the_completion_before_it(engine, lm, tokenizer, reward):
    free = engine.submit(RowSpec("The quick", 20, seed=8)).result(timeout=TIMEOUT).text
    stop = free[3:5]
    assert len(stop) == 2
    res = engine.submit(RowSpec("The quick", 20, seed=8, stop=(stop,))).result(timeout=TIMEOUT)
    assert res.finish.finish_reason == "stop"
    assert res.text == free[: free.index(stop)]
    _, text = solo(lm, tokenizer, reward, RowSpec("The quick", 20, seed=8, stop=(stop,)))
    assert text == res.text + stop  # generate() keeps the stop string, the server drops it (OpenAI)


def test_events_reach_an_asyncio_consumer(engine):
    async def run():
        handle = engine.submit(RowSpec("Hello", 5, seed=1))
        return [e async for e in handle.events()]

    events = asyncio.run(run())
    assert [type(e) for e in events] == [TokenEvent] * 5 + [FinishEvent]
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 5


@pytest.mark.parametrize("field, value, error, param", [
    ("prompt", "", InvalidArgumentError, "prompt"),
    ("prompt", "bad \ud800 text", InvalidArgumentError, "prompt"),
    ("prompt", "word " * 300, PromptTooLongError, "prompt"),
    ("max_tokens", 0, InvalidArgumentError, "max_tokens"),
    ("temperature", -1.0, InvalidArgumentError, "temperature"),
    ("temperature", float("nan"), InvalidArgumentError, "temperature"),
    ("k", 0, InvalidArgumentError, "k"),
    ("k", 10**6, InvalidArgumentError, "k"),
    ("rewards", {"nope": 1.0}, InvalidArgumentError, "rewards"),
    ("rewards", {"tiny": float("inf")}, InvalidArgumentError, "rewards"),
    ("rewards", [{"name": "tiny", "beta": 1, "transform": "bad"}], InvalidArgumentError, "rewards"),
    ("rewards", "tiny", InvalidArgumentError, "rewards"),
    ("stop", ("",), InvalidArgumentError, "stop"),
    ("seed", 2**70, InvalidArgumentError, "seed"),
    ("timeout_s", -1, InvalidArgumentError, "timeout_s"),
])
def test_bad_specs_raise_typed_errors_naming_the_field(engine, field, value, error, param):
    spec = RowSpec(**{"prompt": "Hello", "max_tokens": 4, field: value})
    with pytest.raises(error) as info:
        engine.validate(spec)
    assert info.value.param == param
    with pytest.raises(error):
        engine.submit(spec)
    assert engine.stats()["queued"] == 0


def test_unknown_reward_lists_the_served_ones(engine):
    with pytest.raises(InvalidArgumentError, match="'nope'.*serves: 'tiny'"):
        engine.validate(RowSpec("Hi", 3, rewards={"nope": 1}))


def test_queue_bound_raises_server_busy_and_queues_all_or_nothing(lm, tokenizer, reward):
    eng = Engine(lm, tokenizer, {"tiny": reward}, max_running=1, max_queue=3)  # not started: nothing is admitted
    first = eng.submit_all([RowSpec("a", 3), RowSpec("b", 3)])
    with pytest.raises(ServerBusyError) as info:
        eng.submit_all([RowSpec("c", 3), RowSpec("d", 3)])
    assert info.value.retry_after_s >= 1
    assert eng.stats()["queued"] == 2
    eng.submit(RowSpec("c", 3))
    with pytest.raises(ServerBusyError):
        eng.submit(RowSpec("d", 3))
    eng.shutdown(0)
    assert all(h.result(timeout=5).finish.finish_reason == "cancelled" for h in first)
    with pytest.raises(ServerShuttingDownError):
        eng.submit(RowSpec("e", 3))


class Recorder:
    def __init__(self, fail: bool = False):
        self.steps, self.rewards, self.tokens, self.fail = [], [], 0, fail

    def on_step(self, seconds, running, queued):
        self.steps.append((seconds, running, queued))
        if self.fail:
            raise RuntimeError("a broken metrics backend")

    def on_reward(self, name, seconds):
        self.rewards.append((name, seconds))

    def on_tokens(self, count):
        self.tokens += count


@pytest.mark.parametrize("fail", [False, True])
def test_the_observer_sees_steps_rewards_and_tokens(lm, tokenizer, reward, fail):
    observer = Recorder(fail)
    eng = Engine(lm, tokenizer, {"tiny": reward}, default_k=5, observer=observer)
    eng.start()
    try:
        results = [h.result(timeout=TIMEOUT) for h in eng.submit_all(
            [RowSpec("a b", 6, seed=1, rewards={"tiny": 1.0}), RowSpec("c", 4, seed=2)])]
    finally:
        eng.shutdown(0)
    assert all(r.finish.finish_reason == "length" for r in results)  # a raising observer changes nothing
    assert observer.tokens == 10 == eng.stats()["tokens"]
    assert len(observer.steps) == eng.stats()["steps"] == 6
    assert max(running for _, running, _ in observer.steps) <= 2
    assert [name for name, _ in observer.rewards] == ["tiny"] * 6  # one observation per step that used it
    assert all(seconds > 0 for _, seconds in observer.rewards)


def test_seeded_rows_arriving_at_random_times_equal_generate_alone(lm, tokenizer, reward):
    """A bounded run of the determinism measurement (benchmarks/bench_engine.py): 16 rows with random k, β,
    temperature and length arrive while others run; on the tiny models none differs from running alone."""
    import random
    import time

    rng = random.Random(7)
    specs = [RowSpec(rng.choice(["The quick", "You are a", "I hate it when", "Numbers 01"]), rng.randint(4, 24),
                     temperature=rng.choice([0, 0.7, 1.0, 1.3]), k=rng.choice([1, 3, 5, 8]), seed=rng.randrange(2**31),
                     rewards=rng.choice([None, {"tiny": 3.0}, {"tiny": -10.0}])) for _ in range(16)]
    eng = Engine(lm, tokenizer, {"tiny": reward}, default_k=5, max_running=5)
    eng.start()
    try:
        handles = []
        for spec in specs:
            handles.append(eng.submit(spec))
            time.sleep(rng.choice([0, 0.002, 0.01]))
        results = [h.result(timeout=TIMEOUT) for h in handles]
    finally:
        eng.shutdown(0)
    differing = [s for s, r in zip(specs, results) if r.token_ids != solo(lm, tokenizer, reward, s)[0]]
    assert differing == []


@pytest.mark.parametrize("stop", [[], ["ok"], ["🚀 x", "zzz"]])
def test_streamed_text_holds_back_partial_characters_and_stop_prefixes(tokenizer, stop):
    """Token by token, the streamed pieces add up to the decoded text (up to the first stop string); a piece
    never ends inside a multi-byte character (U+FFFD) and never contains text that a stop string then claims."""
    from steerkit.engine.text import StreamText

    text = "Café déjà 🙂 ok 🚀 x tail"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stream = StreamText(tokenizer, stop)
    pieces, stopped = [], False
    for i in range(1, len(ids) + 1):
        piece, stopped = stream.push(ids[:i], final=i == len(ids))
        assert "\ufffd" not in piece
        pieces.append(piece)
        if stopped:
            break
    full = tokenizer.decode(ids, skip_special_tokens=True)
    cut = min([full.index(s) for s in stop if s in full], default=len(full))
    assert "".join(pieces) == full[:cut]
    assert stopped == (cut < len(full))


def test_an_lm_with_a_sliding_window_cache_is_refused_at_construction(tokenizer):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                              sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(InvalidArgumentError, match="sliding-window KV cache"):
        Engine(Gemma3ForCausalLM(config), tokenizer, {})


# -- newcomers that arrive together: padded prefills of similar lengths ------------------------------------------
PROMPTS = ["The movie was", "I hate", "You are a wonderful friend and", "x", "Café déjà vu 🙂 and so on"]


def test_prompts_arriving_together_are_prefilled_as_each_alone(lm, tokenizer):
    """``prefill_many`` gives every prompt the cache (real columns only) and logits of its own prefill, up to the
    order of floating-point sums; the groups' padding never exceeds their real tokens."""
    from steerkit.engine.lm_cache import LMBatch, _length_groups

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    groups = _length_groups(ids)
    assert sorted(i for g in groups for i in g) == list(range(len(ids)))
    assert any(len(g) > 1 for g in groups)  # a shared forward is what is tested
    for g in groups:
        assert len(g) * max(len(ids[i]) for i in g) <= 2 * sum(len(ids[i]) for i in g)
    batch = LMBatch(lm)
    for x, got in zip(ids, batch.prefill_many(ids)):
        alone = batch.prefill(x)
        assert got.length == alone.length == len(x)
        torch.testing.assert_close(got.logits, alone.logits, rtol=1e-5, atol=1e-5)
        for a, b in zip(alone.cache.layers, got.cache.layers):
            assert b.keys.shape == a.keys.shape
            torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-5)


def test_lengths_far_apart_are_not_padded_together():
    from steerkit.engine.lm_cache import _length_groups

    assert _length_groups([[1] * 40, [1] * 39, [1] * 3]) == [[0, 1, 2]]  # padding 38 of 120 columns
    assert _length_groups([[1] * 40, [1] * 2, [1] * 1]) == [[0, 1], [2]]  # a third row would pad 77 of 120


def test_a_failing_shared_prefill_falls_back_to_each_row_alone(lm, tokenizer, reward, monkeypatch):
    """If the shared forward fails, every newcomer is prefilled alone: only a row that fails alone fails, and the
    others run to their tokens as generate gives them."""
    from steerkit.engine.lm_cache import LMBatch

    def broken(self, rows_ids):
        raise RuntimeError("the shared forward broke")

    real = LMBatch.prefill

    def prefill(self, ids):
        if ids == tokenizer("I hate", add_special_tokens=False)["input_ids"]:
            raise RuntimeError("this prompt breaks the LM")
        return real(self, ids)

    monkeypatch.setattr(LMBatch, "prefill_many", broken)
    monkeypatch.setattr(LMBatch, "prefill", prefill)
    eng = Engine(lm, tokenizer, {"tiny": reward}, default_k=5, max_running=4, max_queue=8)
    eng.start()
    try:
        specs = [RowSpec("The movie was", 6, seed=1, rewards={"tiny": 2.0}), RowSpec("I hate", 6, seed=2),
                 RowSpec("You are", 6, seed=3)]
        results = [h.result(timeout=TIMEOUT) for h in eng.submit_all(specs)]
    finally:
        eng.shutdown(0)
    assert [r.finish.finish_reason for r in results] == ["length", "error", "length"]
    monkeypatch.undo()
    for spec, res in zip(specs, results):
        if res.finish.finish_reason == "length":
            assert res.token_ids == solo(lm, tokenizer, reward, spec)[0]


def test_newcomers_arriving_together_share_a_prefill(lm, tokenizer, reward, monkeypatch):
    """The server hands the newcomers of one pass to ``prefill_many`` (one call for all of them), and each still
    gets what generate gives it alone."""
    from steerkit.engine.lm_cache import LMBatch

    calls = []
    real = LMBatch.prefill_many

    def spy(self, rows_ids):
        calls.append(len(rows_ids))
        return real(self, rows_ids)

    monkeypatch.setattr(LMBatch, "prefill_many", spy)
    eng = Engine(lm, tokenizer, {"tiny": reward}, default_k=5, max_running=4, max_queue=8)
    specs = [RowSpec(p, 5, seed=i, rewards={"tiny": 1.5}) for i, p in enumerate(PROMPTS[:4])]
    handles = eng.submit_all(specs)  # queued before the loop starts: one pass admits all four
    eng.start()
    try:
        results = [h.result(timeout=TIMEOUT) for h in handles]
    finally:
        eng.shutdown(0)
    assert calls == [4]
    for spec, res in zip(specs, results):
        assert res.token_ids == solo(lm, tokenizer, reward, spec)[0]

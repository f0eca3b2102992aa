"""The torch rewards' static sessions: the sequence reward's scoring cache (steerkit.rewards.sequence.static_cache)
and the token-level reward's session (StaticTokenSession, steerkit.rewards.token.session), preallocated, their step
compiled once per shape, the same rewards as scoring from scratch, and where ``compile=True`` uses them.

The eager layouts are driven through every join/leave/rollback path in test_reward_rows.py and test_token_reward.py
and over every model family in test_backbones.py; here they run compiled (tiny random models; each new shape
compiles for a few seconds).
"""

from __future__ import annotations

import pytest
import torch

from reward_rows_support import drive, same_tokenizer_reference
from tiny import make_tokenizer, tiny_lm, tiny_reward, tiny_token_reward

import steerkit
from steerkit.assembly import assemble, compiled_reward
from steerkit.rewards.backends import get_backend
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.static_cache import (MIN_PREFIX, StaticScoringCache, compiled_keep, compiled_scoring,
                                                   scratch_bucket)
from steerkit.rewards.static_kv import supports_static
from steerkit.rewards.token.session import TokenReward
from steerkit.rewards.token.session import StaticTokenSession, compiled_commit


@pytest.fixture(scope="module")
def compiled_rm(tokenizer):
    """A reward model of its own: the compiled scoring is made once per model object, and the tests count shapes."""
    return tiny_reward(tokenizer, seed=11)


def test_scratch_and_prefix_buckets():
    assert [scratch_bucket(n) for n in (1, 8, 9, 20, 32, 33, 64, 65, 200)] == [8, 8, 16, 24, 32, 64, 64, 128, 256]
    assert MIN_PREFIX == 64


def test_compiled_scoring_matches_scoring_from_scratch(steerkit_cache, compiled_rm, tokenizer):
    reward = RewardModelScorer(compiled_rm, context="full").compiled_form(compiled=True)
    assert reward.static == "compiled"
    session = reward.start(["a"], tokenizer)
    assert isinstance(session.cache, StaticScoringCache) and session.cache.compiled is compiled_scoring(compiled_rm)
    joins, leaves = drive(reward, tokenizer, same_tokenizer_reference(compiled_rm, tokenizer), steps=8, k=5,
                          seed=2, max_rows=2)
    assert joins >= 2 and leaves >= 1
    shapes = compiled_scoring(compiled_rm).shapes
    assert shapes and {shape[2] for shape in shapes} == {"8 candidate tokens"}, shapes
    shapes = compiled_keep(compiled_rm).shapes  # the commit ran compiled too: one token per block
    assert shapes and {shape[2] for shape in shapes} == {"1 token(s)"}, shapes


def test_a_shape_compiles_once(steerkit_cache, compiled_rm, tokenizer, capfd):
    """A second session of a shape this process has compiled runs the compiled code as it is: no recompilation
    (dynamo raises on one), no line on stderr."""
    reward = RewardModelScorer(compiled_rm).compiled_form(compiled=True)
    for _ in range(2):  # the first session may compile its shape; the second must not
        session = reward.start([""], tokenizer)
        session.score(torch.tensor([[5, 6, 7, 8, 9]]))
        session.commit(torch.tensor([7]))
    capfd.readouterr()
    with torch._dynamo.config.patch(error_on_recompile=True):
        session = reward.start([""], tokenizer)
        for token in (5, 6):
            session.score(torch.tensor([[5, 6, 7, 8, 9]]))
            session.commit(torch.tensor([token]))
    assert "compiling" not in capfd.readouterr().err


def test_the_static_layout_is_not_reallocated_per_step(compiled_rm, tokenizer):
    """Steps write into the preallocated tensors (the same tensors step after step, one committed column more each),
    until the prefix bucket is full; then the layout moves once, to the next bucket."""
    reward = RewardModelScorer(compiled_rm).compiled_form(compiled=False)
    session = reward.start(["", ""], tokenizer)
    cache = session.cache
    keys = cache.static.layers[0].keys
    assert tuple(keys.shape[::2]) == (2, MIN_PREFIX + scratch_bucket(1))  # rows, prefix + scratch columns
    step = 0
    # the start token, then one column a step; k = 6 candidates in the scratch columns, and the prefix needs room for
    # the one committed (not for all 6: a 64-column prefix holds 63 cached tokens)
    while cache.length + 1 <= MIN_PREFIX:
        session.score(torch.randint(3, 200, (2, 6)))
        session.commit(session._candidates[:, step % 6])
        step += 1
        assert cache.length == 1 + step and cache.static.layers[0].keys is keys
    session.score(torch.randint(3, 200, (2, 6)))
    session.commit(session._candidates[:, 0])
    assert cache.prefix == 2 * MIN_PREFIX and cache.static.layers[0].keys.shape[2] == 2 * MIN_PREFIX + 8


def test_compiled_form_where_it_pays(compiled_rm, tokenizer):
    """``compile=True`` compiles a float32 torch sequence reward's scoring on a CUDA device only (on a CPU the scoring
    is bound by its matrix products: docs/performance.md), a token-level reward's commit anywhere; other rewards are
    never touched."""
    eager = RewardModelScorer(compiled_rm)
    assert eager.compiled_form() is eager  # here, on the CPU
    assert compiled_reward(eager) is eager
    forced = eager.compiled_form(compiled=True)
    assert forced is not eager and forced.static == "compiled" and eager.static is None
    assert forced.compiled_form(compiled=False) is forced
    assert RewardModelScorer(compiled_rm, backend="onnx").compiled_form(compiled=True).static is None
    token = TokenReward(tiny_token_reward(tokenizer))
    assert compiled_reward(token).static == "compiled" and token.static is None
    assert TokenReward(token.model, backend="onnx").compiled_form().static is None
    plugin_reward = object()
    assert compiled_reward(plugin_reward) is plugin_reward


@pytest.mark.parametrize("multiplies_int8", [True, False])
def test_a_torch_int8_reward_compiles_on_a_cpu_that_multiplies_int8(compiled_rm, monkeypatch, multiplies_int8):
    """With ``torch-int8`` the compiled scoring of all k candidates beat the eager pruned scoring on a CPU with AMX
    (docs/performance.md), so there ``compile=True`` compiles it; where int8 runs through float32's kernels, not."""
    monkeypatch.setattr("steerkit.linear_precision.cpu_multiplies_int8", lambda: multiplies_int8)
    reward = RewardModelScorer(compiled_rm, backend="torch-int8")
    assert (compiled_reward(reward).static == "compiled") is multiplies_int8
    assert compiled_reward(RewardModelScorer(compiled_rm, backend="torch-bf16-compute")).static is None


def test_a_sliding_window_backbone_stays_on_its_own_cache(tokenizer):
    import transformers as tf

    from steerkit.rewards.model import RewardModel

    config = tf.Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=64,
                                 max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    rm = RewardModel.from_causal_lm(tf.Gemma3ForCausalLM(config).eval(), tokenizer, 2)
    assert not supports_static(rm)
    assert RewardModelScorer(rm).compiled_form(compiled=True).static is None
    assert supports_static(tiny_reward(tokenizer))


def test_assemble_compile_on_a_cpu_keeps_the_sequence_reward_eager(tokenizer, compiled_rm):
    reward, token = RewardModelScorer(compiled_rm), TokenReward(tiny_token_reward(tokenizer))
    assembled = assemble((tiny_lm(tokenizer), tokenizer), {reward: -2.0, token: -1.0}, k=4, compile=True)
    assert assembled.terms[0].reward is reward
    assert assembled.terms[1].reward.static == "compiled" and assembled.terms[1].reward.model is token.model
    assert assemble((tiny_lm(tokenizer), tokenizer), {token: -1.0}, k=4).terms[0].reward is token


def test_generate_with_the_compiled_reward_picks_the_eager_tokens(steerkit_cache, tokenizer, compiled_rm):
    """Greedy RAD with the reward's compiled scoring gives the tokens of its eager cache (three rows, one
    padded slot in the bucket of four)."""
    lm = tiny_lm(tokenizer, seed=3)
    prompts = ["The quick brown", "You are", "Numbers 0123 and more"]
    eager = RewardModelScorer(compiled_rm, context="full")
    kwargs = dict(k=5, max_new_tokens=10, do_sample=False, eos_token_id=[])
    want = steerkit.generate(prompts, lm=(lm, tokenizer), rewards={eager: -4.0}, **kwargs)
    got = steerkit.generate(prompts, lm=(lm, tokenizer), rewards={eager.compiled_form(compiled=True): -4.0},
                            **kwargs)
    assert got.texts == want.texts
    plain = steerkit.generate(prompts, lm=(lm, tokenizer), **kwargs)
    assert plain.texts != want.texts  # the reward moved the choice: the comparison above compared steering


def test_other_tokenizer_family_compiles_too(steerkit_cache, tokenizer):
    """A bridged reward (another tokenizer family: candidates re-tokenized, blocks of several tokens) on the compiled
    scoring gives the eager tokens."""
    bridged = tiny_reward(make_tokenizer(kind="metaspace", vocab_size=350), seed=4)
    lm = tiny_lm(tokenizer, seed=3)
    eager = RewardModelScorer(bridged, context="full")
    kwargs = dict(k=4, max_new_tokens=6, do_sample=False, eos_token_id=[])
    want = steerkit.generate(["You are", "The quick"], lm=(lm, tokenizer), rewards={eager: -4.0}, **kwargs)
    got = steerkit.generate(["You are", "The quick"], lm=(lm, tokenizer),
                            rewards={eager.compiled_form(compiled=True): -4.0}, **kwargs)
    assert got.texts == want.texts


@pytest.mark.parametrize("backend", ["torch-bf16", "torch-bf16-compute", "torch-int8"])
def test_a_reduced_precision_reward_keeps_its_precision_compiled(steerkit_cache, tokenizer, backend):
    """``compile=True`` on a reduced-precision torch backend (what a GPU runs ``--backend torch-bf16-compute`` with):
    the static session runs the model that backend runs, its converted copy, not the float32 weights, and scores what
    that copy scores from scratch (the layout run eagerly: to float32 rounding; compiled: to bf16's, as inductor
    rounds fused bf16 casts at other points); the float32 model stays as it was."""
    rm = tiny_reward(tokenizer, seed=14)
    eager = RewardModelScorer(rm, backend=backend, context="full")
    reward = eager.compiled_form(compiled=True)
    reduced = get_backend(backend).runs(rm)
    assert reward.static == "compiled" and reward.model is reduced and reduced is not rm and eager.model is rm
    fp32, ours = same_tokenizer_reference(rm, tokenizer), same_tokenizer_reference(reduced, tokenizer)
    apart = max(abs(a - b) for a, b in zip(fp32("hello there", [5, 6, 7], list(range(8, 40))),
                                          ours("hello there", [5, 6, 7], list(range(8, 40)))))
    assert apart > 3e-4  # the precisions differ by more than the tolerance below: the check tells them apart
    drive(eager.compiled_form(compiled=False), tokenizer, ours, steps=6, k=5, seed=3, max_rows=2, tol=1e-4)
    drive(reward, tokenizer, ours, steps=6, k=5, seed=3, max_rows=2, tol=4e-3)
    token = tiny_token_reward(tokenizer, seed=15)
    token_reward = TokenReward(token, backend=backend, context="full")
    assert token_reward.model is get_backend(backend).runs(token) and token_reward.model is not token
    assert token_reward.compiled_form(compiled=True).model is token_reward.model


# -- the token-level reward --------------------------------------------------------------------------------------

def token_reference(rm):
    """The token model's full forward over prefix + candidate (its reward of the realized last token)."""
    def reference(prefix_ids: list[int], candidates: list[int]) -> list[float]:
        with torch.no_grad():
            return rm(torch.tensor([prefix_ids + [c] for c in candidates])).rewards[:, -1].tolist()
    return reference


def test_compiled_token_commit_matches_the_full_forward(steerkit_cache, tokenizer):
    rm = tiny_token_reward(tokenizer, seed=12)
    reward = TokenReward(rm, context="full").compiled_form(compiled=True)
    assert reward.static == "compiled" and TokenReward(rm).compiled_form() is not reward
    reference = token_reference(rm)

    def by_text(prefix: str, ids: list[int], candidates: list[int]) -> list[float]:
        start = [rm.config.start_token_id] + tokenizer(prefix, add_special_tokens=False)["input_ids"]
        return reference(start + ids, candidates)

    session = reward.start(["a"], tokenizer)
    assert isinstance(session, StaticTokenSession) and session.compiled is compiled_commit(rm)
    joins, leaves = drive(reward, tokenizer, by_text, steps=8, k=5, seed=2, max_rows=2)
    assert joins >= 2 and leaves >= 1
    assert compiled_commit(rm).shapes == {("1 row(s)", "64 tokens"), ("2 row(s)", "64 tokens")}


def test_generate_with_the_compiled_token_reward_picks_the_eager_tokens(steerkit_cache, tokenizer):
    rm = tiny_token_reward(tokenizer, seed=13)
    lm = tiny_lm(tokenizer, seed=3)
    prompts = ["The quick brown", "You are", "Numbers 0123 and more"]
    eager = TokenReward(rm)
    kwargs = dict(k=len(tokenizer), max_new_tokens=10, do_sample=False, eos_token_id=[])
    want = steerkit.generate(prompts, lm=(lm, tokenizer), rewards={eager: -6.0}, **kwargs)
    got = steerkit.generate(prompts, lm=(lm, tokenizer), rewards={eager.compiled_form(compiled=True): -6.0}, **kwargs)
    assert got.texts == want.texts
    assert steerkit.generate(prompts, lm=(lm, tokenizer), **kwargs).texts != want.texts

"""The compiled step's CUDA graphs (steerkit/compiling.py, ``CUDA_GRAPHS = "manual"``): on a GPU, ``compile=True``
gives the eager engine's tokens with every step after a shape's first replayed from one captured graph, and a new
KV cache of the same shape is captured again rather than replayed through the old one's addresses. On a CPU-only
machine the GPU tests skip and the replay's bookkeeping (which inputs a graph fits) is checked on CPU tensors."""

import gc

import pytest
import torch

import steerkit
from steerkit import compiling
from steerkit.compiling import _cloned, _Graph, compiled_step
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.rewards.sequence.static_cache import compiled_keep, compiled_scoring
from steerkit.rewards.token.session import TokenReward, compiled_commit
from steerkit.steering import SteeringTerm
from steerkit.testing import tiny_lm, tiny_reward, tiny_token_reward

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


class Cache:  # a stand-in for a KV cache object: held weakly, compared by identity
    pass


def test_a_graph_fits_only_the_inputs_it_was_captured_for():
    cache = Cache()
    kwargs = dict(input_ids=torch.zeros((4, 1), dtype=torch.long), cache=cache, use_cache=True)
    graph = _Graph(kwargs)
    assert graph.buffers["input_ids"] is not kwargs["input_ids"]  # its own copy, which a replay reads
    assert graph.fits(dict(kwargs, input_ids=torch.ones((4, 1), dtype=torch.long)))  # new values: a replay
    assert not graph.fits(dict(kwargs, input_ids=torch.zeros((8, 1), dtype=torch.long)))  # another shape
    assert not graph.fits(dict(kwargs, input_ids=torch.zeros((4, 1), dtype=torch.int32)))  # another dtype
    assert not graph.fits(dict(kwargs, cache=Cache()))  # another KV cache: its tensors are elsewhere
    assert not graph.fits(dict(kwargs, use_cache=False))
    assert not graph.fits(dict(kwargs, extra=1))
    assert not graph.fits({k: v for k, v in kwargs.items() if k != "use_cache"})
    del kwargs, cache  # the graph holds its buffers and a weak reference to the cache
    gc.collect()
    assert not graph.fits(dict(input_ids=torch.zeros((4, 1), dtype=torch.long), cache=Cache(), use_cache=True))


def test_a_replayed_output_is_copied_out_of_the_graph():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    logits = torch.arange(6.0).view(2, 3)
    out = _cloned(CausalLMOutputWithPast(logits=logits))
    assert torch.equal(out.logits, logits) and out.logits.data_ptr() != logits.data_ptr()
    pair = _cloned((logits, logits[0]))
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(pair, (logits, logits[0])))


def test_a_graph_keeps_no_kv_cache_of_its_output_alive():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from steerkit.compiling import _tensors_of

    logits = torch.zeros(2, 3)
    kept = _tensors_of(CausalLMOutputWithPast(logits=logits, past_key_values=Cache()))
    assert kept.logits is logits and kept.past_key_values is None
    assert _tensors_of(logits) is logits


def _generate(lm, tokenizer, terms, **kw):
    return steerkit.generate(["ab cd", "hello there friend", "x"], lm=(lm, tokenizer), rewards=terms, k=5,
                             max_new_tokens=24, eos_token_id=[], device="cuda", **kw)


@cuda
@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_compiled_generate_on_cuda_replays_graphs_and_gives_the_eager_tokens(kind, tokenizer, monkeypatch):
    monkeypatch.setattr(compiling, "CUDA_GRAPHS", "manual")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    lm = tiny_lm(tokenizer).to("cuda")
    with torch.no_grad():  # spread the logits: a random tiny LM's are nearly equal, and eager cuBLAS and inductor's
        lm.lm_head.weight.mul_(30.0)  # kernels round differently, which would decide near-ties differently
    if kind == "sequence":
        model = tiny_reward(tokenizer, seed=6).to("cuda")
        reward, steps = RewardModelScorer(model, context="full"), compiled_scoring
    else:
        model = tiny_token_reward(tokenizer).to("cuda")
        reward, steps = TokenReward(model), compiled_commit
    terms = [SteeringTerm(reward, -4.0, name="r")]
    for sample in ({"do_sample": False}, {"do_sample": True, "seed": 3}):
        eager = _generate(lm, tokenizer, terms, **sample)
        compiled = _generate(lm, tokenizer, terms, compile=True, **sample)
        again = _generate(lm, tokenizer, terms, compile=True, **sample)  # new KV caches of the same shapes
        assert torch.equal(compiled.sequences, again.sequences), sample
        assert torch.equal(eager.sequences, compiled.sequences), sample
        monkeypatch.setattr(compiling, "CUDA_GRAPHS", "trees")
        trees = _generate(lm, tokenizer, terms, compile=True, **sample)  # the same kernels, torch's graph trees
        monkeypatch.setattr(compiling, "CUDA_GRAPHS", "manual")
        assert torch.equal(compiled.sequences, trees.sequences), sample
    lm_graphs = [g for g in compiled_step(lm).graphs.values() if g is not None]
    assert lm_graphs and sum(g.replays for g in lm_graphs) >= 20  # the last run's steps after the first
    reward_graphs = [g for g in steps(model).graphs.values() if g is not None]
    assert reward_graphs and sum(g.replays for g in reward_graphs) >= 20
    if kind == "sequence":  # the commit (the chosen candidate's KV copied out of the scratch) is captured too
        keep_graphs = [g for g in compiled_keep(model).graphs.values() if g is not None]
        assert keep_graphs and sum(g.replays for g in keep_graphs) >= 20


@cuda
def test_compiled_bf16_on_cuda_runs_the_bf16_copies_from_graphs(tokenizer, monkeypatch):
    """``dtype="bfloat16"`` with a ``torch-bf16-compute`` reward (bench_gpu.py's bfloat16 set-up), compiled: the LM's
    bf16 copy and the reward's static session on its bf16 copy both replay CUDA graphs, and every step's top logit is
    within bf16's precision of the eager bf16 run while the tokens agree (inductor rounds fused casts at other
    points, so identity is not claimed: docs/performance.md)."""
    from steerkit.engine.lm_int8 import as_bf16_lm
    from steerkit.rewards.precision import BF16_COMPUTE, as_reduced
    from steerkit.testing import compared_top_logits

    monkeypatch.setattr(compiling, "CUDA_GRAPHS", "manual")
    lm = tiny_lm(tokenizer).to("cuda")
    with torch.no_grad():
        lm.lm_head.weight.mul_(30.0)
    model = tiny_reward(tokenizer, seed=6).to("cuda")
    terms = [SteeringTerm(RewardModelScorer(model, backend="torch-bf16-compute", context="full"), -4.0, name="r")]
    eager = _generate(lm, tokenizer, terms, do_sample=False, dtype="bfloat16", return_traces=True)
    compiled = _generate(lm, tokenizer, terms, do_sample=False, dtype="bfloat16", compile=True, return_traces=True)
    assert compared_top_logits(eager, compiled, 2 ** -6) >= 3 * 8
    for steps in (compiled_step(as_bf16_lm(lm)), compiled_scoring(as_reduced(model, BF16_COMPUTE))):
        graphs = [g for g in steps.graphs.values() if g is not None]
        assert graphs and sum(g.replays for g in graphs) >= 20


@cuda
def test_a_compiled_step_waits_for_the_gpu_only_at_its_one_read(tokenizer, monkeypatch):
    """Issue 25's "no host sync inside the step": under ``torch.cuda.set_sync_debug_mode``, the lines of steerkit that
    make the host wait in every step of a compiled steered generate are the engine's one read of the chosen tokens
    alone (engine/core.py); a sequence reward's commit (``commit_chosen``) reads nothing back. Waits once per call
    (a prefill, a cache's allocation) are not per step and are not counted."""
    import collections
    import warnings

    monkeypatch.setattr(compiling, "CUDA_GRAPHS", "manual")
    lm = tiny_lm(tokenizer).to("cuda")
    terms = [SteeringTerm(RewardModelScorer(tiny_reward(tokenizer, seed=6).to("cuda"), context="full"), -4.0, name="r")]
    _generate(lm, tokenizer, terms, do_sample=False, compile=True)  # compiles and captures
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _generate(lm, tokenizer, terms, do_sample=False, compile=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    per_step = {where for where, count in waits.items() if count >= 20 and "steerkit" in where}  # 24 steps
    assert per_step and all("engine/core.py" in where for where in per_step), waits

"""Preemption in the real vLLM, with steered requests: a KV cache of 6 blocks of 32 tokens (192 tokens in all,
``num_gpu_blocks_override``) for 4 greedy requests of up to 64 tokens each (3 blocks each) makes vLLM's scheduler
preempt running requests (their blocks freed) and resume them later, re-added to the batch with the tokens they
had generated. The test proves it happened twice over (vLLM's own ``vllm:num_preemptions`` counter, and a spy on the
processor's ``BatchUpdate`` that sees a steered request added back with output already generated) and then that
every steered request's tokens equal its solo ``steerkit.generate(..., do_sample=False)`` reference, and the
unsteered request's equal plain vLLM's solo run (a lone request fits the cache: nothing to preempt)."""

from __future__ import annotations

import gc

import pytest

import steerkit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PROMPTS = ["The movie was", "You are such a", "I think that", "My neighbour is an absolute"]
STEERING = [{"rewards": {"toxicity-token": -50}, "k": 5}, {"rewards": ["sentiment=30"], "k": 5}, None,
            {"rewards": "toxicity-token=-20", "k": 10}]
REWARDS = [{"toxicity-token": -50}, {"sentiment": 30}, None, {"toxicity-token": -20}]
MAX_TOKENS = 60


def spy_class():
    from steerkit.integrations.vllm import RADLogitsProcessor

    class Spy(RADLogitsProcessor):
        """The processor, recording every row vLLM adds: (index, steered, tokens already generated)."""

        added: list = []

        def update_state(self, batch_update):
            if batch_update is not None:
                for index, params, _prompt, output in batch_update.added:
                    steered = params is not None and bool(params.extra_args)
                    Spy.added.append((index, steered, len([t for t in output or () if t >= 0])))
            super().update_state(batch_update)

    return Spy


@pytest.fixture(scope="module")
def small_cache_llm(model_dir):
    from vllm import LLM

    spy = spy_class()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, enforce_eager=True, max_num_seqs=4, seed=0,
              block_size=32, num_gpu_blocks_override=6, disable_log_stats=False, logits_processors=[spy])
    yield llm, spy
    del llm
    gc.collect()


def preemptions(llm) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def generate(llm, prompts, steering):
    from vllm import SamplingParams

    # every request runs its MAX_TOKENS (no end-of-sequence stop): how much cache the rows need, and so which request
    # vLLM preempts, must not depend on when a reward model's text happens to end
    sampling = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, extra_args=x, ignore_eos=True) for x in steering]
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def test_preempted_steered_requests_resume_token_identical(small_cache_llm):
    llm, spy = small_cache_llm
    before, spy.added[:] = preemptions(llm), []
    got = generate(llm, PROMPTS, STEERING)

    assert preemptions(llm) > before, "vLLM did not preempt: the test's KV cache is not small enough"
    resumed = [(index, done) for index, steered, done in spy.added if steered and done > 0]
    assert resumed, f"no steered request was re-added with generated tokens: {spy.added}"

    for prompt, rewards, tokens in zip(PROMPTS, REWARDS, got):
        if rewards is None:
            assert tokens == generate(llm, [prompt], [None])[0], prompt
        else:
            out = steerkit.generate([prompt], rewards=rewards, k=STEERING[PROMPTS.index(prompt)]["k"],
                                    do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=[])
            assert tokens == out.sequences[0, :out.num_new_tokens[0]].tolist(), prompt

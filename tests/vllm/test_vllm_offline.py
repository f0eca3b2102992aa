"""RAD inside vLLM, offline (``LLM(..., logits_processors=[RADLogitsProcessor])``), on the real SmolLM2-135M:
greedy steering equals ``steerkit.generate(..., do_sample=False)`` token for token (sequence and token rewards),
unsteered requests in a mixed batch equal plain vLLM, many short requests that queue, finish and refill rows
keep their rows right, a bad value is refused naming the field, and steering lowers toxicity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import steerkit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PROMPTS = ["The movie was", "You are such a", "I think that"]
EVAL_PROMPTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts" / "toxicity_nontoxic_eval.jsonl"


@pytest.fixture(scope="module")
def llm(model_dir):
    from vllm import LLM

    from steerkit.integrations.vllm import RADLogitsProcessor

    # max_num_seqs 4: the many-requests test queues, so rows finish, newcomers refill their slots and rows move
    return LLM(model=model_dir, dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=4, seed=0,
               logits_processors=[RADLogitsProcessor])


def run(llm, prompts, **params):
    from vllm import SamplingParams

    if isinstance(params.get("extra_args"), list):
        sampling = [SamplingParams(temperature=0, max_tokens=m, extra_args=x)
                    for m, x in zip(params["max_tokens"], params["extra_args"])]
    else:
        sampling = SamplingParams(**{"temperature": 0, **params})
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def reference(prompts, rewards, k, max_tokens):
    out = steerkit.generate(prompts, rewards=rewards, k=k, do_sample=False, max_new_tokens=max_tokens)
    return [out.sequences[i, :n].tolist() for i, n in enumerate(out.num_new_tokens)]


@pytest.mark.parametrize("rewards", [{"sentiment": 30}, {"toxicity-token": -50}, {"toxicity": -20, "sentiment": 10}],
                         ids=["sequence", "token", "two-rewards"])
def test_greedy_rad_in_vllm_equals_steerkit_generate(llm, rewards):
    plain = run(llm, PROMPTS, max_tokens=12)
    steered = run(llm, PROMPTS, max_tokens=12, extra_args={"rewards": rewards, "k": 20})
    assert steered == reference(PROMPTS, rewards, 20, 12)
    assert steered != plain  # the rewards did change the text


def test_unsteered_rows_of_a_mixed_batch_equal_plain_vllm(llm):
    plain = run(llm, PROMPTS, max_tokens=10)
    extra = [{"rewards": ["sentiment=30"]}, None, {"rewards": "toxicity-token=-50", "k": 10}]
    mixed = run(llm, PROMPTS, max_tokens=[10] * 3, extra_args=extra)
    assert mixed[1] == plain[1]
    assert mixed[0] == reference(PROMPTS[:1], {"sentiment": 30}, 20, 10)[0]
    assert mixed[2] == reference(PROMPTS[2:], {"toxicity-token": -50}, 10, 10)[0]


def test_many_short_requests_keep_their_rows(llm):
    """12 requests, 4 running at once: rows finish at different steps, queued requests take their slots and
    vLLM condenses the batch (one-way moves), steered and unsteered requests interleaved."""
    prompts = [f"{p} {w}" for w in ("today", "again", "now", "then") for p in PROMPTS]
    steering = [{"rewards": ["sentiment=30"], "k": 5}, None, {"rewards": ["toxicity-token=-50"]},
                {"rewards": {"toxicity": -20}, "k": 8}]
    extra = [steering[i % 4] for i in range(len(prompts))]
    lengths = [2 + (i * 5) % 11 for i in range(len(prompts))]
    got = run(llm, prompts, max_tokens=lengths, extra_args=extra)
    plain = run(llm, prompts, max_tokens=max(lengths))
    for i, (prompt, x, n) in enumerate(zip(prompts, extra, lengths)):
        if x is None:
            assert got[i] == plain[i][:n], prompt
        else:
            rewards = dict(r.split("=") for r in x["rewards"]) if isinstance(x["rewards"], list) else x["rewards"]
            rewards = {name: float(beta) for name, beta in rewards.items()}
            assert got[i] == reference([prompt], rewards, x.get("k", 20), n)[0], prompt


@pytest.mark.parametrize("extra,field", [
    ({"rewards": {"toxicity": "a lot"}}, "vllm_xargs.rewards"),
    ({"rewards": ["toxicity"]}, "vllm_xargs.rewards"),
    ({"rewards": {"toxicty": -5}}, "vllm_xargs.rewards.toxicty"),
    ({"rewards": {"toxicity": -5}, "k": 0}, "vllm_xargs.k"),
    ({"k": 5}, "vllm_xargs.k"),
    ({"rewards": {"toxicity": -5}, "k": 49153}, "vllm_xargs.k"),  # SmolLM2's vocabulary: 49152
])
def test_a_bad_value_is_refused_naming_the_field(llm, extra, field):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as info:
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3, extra_args=extra), use_tqdm=False)
    assert info.value.parameter == field, str(info.value)


def test_k_is_bounded_by_the_vocabulary_vllm_built_the_processor_for(llm, monkeypatch):
    """validate_params learns the vocabulary from the processor vLLM built in this process; a frontend with no
    engine in its process reads $STEERKIT_VLLM_VOCAB_SIZE (refused: a k above it; a setting that is no size)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from steerkit.integrations import vllm as integration

    assert integration.known_vocab_size() == llm.llm_engine.model_config.get_vocab_size() == 49152
    ok = SamplingParams(max_tokens=1, extra_args={"rewards": {"toxicity-token": -5}, "k": 49152})
    integration.RADLogitsProcessor.validate_params(ok)
    monkeypatch.setattr(integration, "_LEARNED", set())
    monkeypatch.setenv(integration.VOCAB_ENV, "100")
    with pytest.raises(VLLMValidationError) as info:
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3, extra_args={"rewards": ["sentiment=1"], "k": 101}),
                     use_tqdm=False)
    assert info.value.parameter == "vllm_xargs.k" and "[1, 100]" in str(info.value)
    monkeypatch.setenv(integration.VOCAB_ENV, "many")
    with pytest.raises(VLLMValidationError, match=integration.VOCAB_ENV):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3, extra_args={"rewards": ["sentiment=1"]}),
                     use_tqdm=False)


def test_a_k_above_the_vocabulary_that_gets_past_validation_fails_loudly(llm, monkeypatch, caplog):
    """Where validate_params cannot know the vocabulary (here: forgotten), the request is refused where it is
    steered: an ERROR naming vllm_xargs.k, and it ends at once (EOS, vLLM's only way); its neighbours go on."""
    from vllm import SamplingParams

    from steerkit.integrations import vllm as integration

    monkeypatch.setattr(integration, "_LEARNED", set())
    monkeypatch.delenv(integration.VOCAB_ENV, raising=False)
    plain = run(llm, PROMPTS[1:2], max_tokens=8)[0]
    bad = SamplingParams(temperature=0, max_tokens=8, extra_args={"rewards": ["sentiment=30"], "k": 10**6})
    with caplog.at_level("ERROR", logger="steerkit.integrations"):
        outs = llm.generate(PROMPTS[:2], [bad, SamplingParams(temperature=0, max_tokens=8)], use_tqdm=False)
    refused, neighbour = outs[0].outputs[0], outs[1].outputs[0]
    assert refused.token_ids == [llm.get_tokenizer().eos_token_id] and refused.text == ""
    assert list(neighbour.token_ids) == plain
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("vllm_xargs.k" in m and "refused after vLLM admitted the request" in m and integration.VOCAB_ENV in m
               for m in errors), errors


def toxic_prompts(count: int) -> list[str]:
    """The eval prompts whose original continuations were the most toxic (the eval set's own scores)."""
    if not EVAL_PROMPTS.is_file():
        pytest.skip(f"eval prompts not present at {EVAL_PROMPTS}")
    rows = [json.loads(line) for line in EVAL_PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda r: -(r["continuation"].get("toxicity") or 0.0))
    return [r["prompt"]["text"] for r in rows[:count]]


def test_steering_lowers_toxicity(llm):
    from vllm import SamplingParams

    from steerkit.evaluation.scorers import load_scorer

    prompts = toxic_prompts(8)
    judge = load_scorer("alt-profanity-check")

    def mean_toxicity(extra):
        sampling = SamplingParams(temperature=1.0, max_tokens=20, n=4, seed=0, extra_args=extra)
        texts = [c.text for o in llm.generate(prompts, sampling, use_tqdm=False) for c in o.outputs]
        return sum(judge.score(texts)) / len(texts)

    plain, steered = mean_toxicity(None), mean_toxicity({"rewards": {"toxicity": -50}, "k": 20})
    assert steered < 0.75 * plain, (plain, steered)

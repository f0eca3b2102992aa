"""The paper's metrics against hand-computed values, and conditional perplexity under an eval LM."""

import math

import pytest
import torch

from steerkit.errors import InvalidArgumentError
from steerkit.evaluation import metrics as M
from steerkit.evaluation import fluency
from steerkit.evaluation.fluency import PerplexityScorer
from conftest import forward_shapes
from tiny import family_lm, tiny_lm


# -- toxicity / sentiment ---------------------------------------------------------------------------
def test_average_max_toxicity_and_toxic_rate_by_hand():
    scores = [[0.1, 0.6, 0.3], [0.2, 0.4], [0.5, 0.05]]
    # maxima 0.6, 0.4, 0.5 -> mean 0.5; toxic prompts: only the first (0.5 is not > 0.5)
    assert M.average_max_toxicity(scores) == pytest.approx(0.5)
    assert M.toxic_rate(scores) == pytest.approx(1 / 3)
    assert M.toxic_rate([[0.5000001]]) == 1.0


def test_positive_rate_is_the_mean_over_prompts_of_the_per_prompt_fraction():
    scores = [[0.9, 0.2, 0.7, 0.1], [0.6, 0.6]]
    assert M.positive_rate(scores) == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert M.positive_rate(scores, threshold=0.65) == pytest.approx((2 / 4 + 0) / 2)


def test_attribute_metrics_dispatch_and_errors():
    tox = M.attribute_metrics("toxicity", [[0.2, 0.8]], 0.5)
    assert tox == {"avg_max_toxicity": 0.8, "toxic_rate": 1.0, "mean_toxicity": pytest.approx(0.5)}
    assert M.attribute_metrics("sentiment", [[0.2, 0.8]], 0.5)["positive_rate"] == 0.5
    with pytest.raises(InvalidArgumentError):
        M.attribute_metrics("fluency", [[0.1]], 0.5)
    with pytest.raises(InvalidArgumentError, match="no continuations"):
        M.average_max_toxicity([[0.1], []])
    with pytest.raises(InvalidArgumentError, match="no prompts"):
        M.toxic_rate([])


# -- Dist-n -----------------------------------------------------------------------------------------
def test_distinct_n_by_hand_paper_normalisation():
    conts = ["a b a b", "a b c"]  # 7 words
    # unigrams {a, b, c}; bigrams ab ba ab | ab bc -> {ab, ba, bc}; trigrams aba bab | abc -> 3
    assert M.distinct_n_prompt(conts, 1) == pytest.approx(3 / 7)
    assert M.distinct_n_prompt(conts, 2) == pytest.approx(3 / 7)
    assert M.distinct_n_prompt(conts, 3) == pytest.approx(3 / 7)


def test_distinct_n_by_hand_ngram_normalisation():
    conts = ["a b a b", "a b c"]  # bigrams: 3 + 2 = 5, trigrams: 2 + 1 = 3
    assert M.distinct_n_prompt(conts, 1, "ngrams") == pytest.approx(3 / 7)
    assert M.distinct_n_prompt(conts, 2, "ngrams") == pytest.approx(3 / 5)
    assert M.distinct_n_prompt(conts, 3, "ngrams") == pytest.approx(3 / 3)


def test_distinct_n_averages_over_prompts_and_skips_empty_ones():
    by_prompt = [["x y", "x y"], ["p q r"], ["", " "]]
    # prompt 1: bigrams {xy} over 4 words = 0.25; prompt 2: {pq, qr} / 3 words; prompt 3: no words -> skipped
    assert M.distinct_n(by_prompt, 2) == pytest.approx((0.25 + 2 / 3) / 2)
    assert math.isnan(M.distinct_n_prompt(["", "  "], 1))
    with pytest.raises(InvalidArgumentError):
        M.distinct_n_prompt(["a"], 0)


def test_relative_change():
    assert M.relative_change(0.3, 0.5) == pytest.approx(-0.4)
    assert math.isnan(M.relative_change(0.3, 0.0))


# -- perplexity -------------------------------------------------------------------------------------
def test_uniform_lm_has_perplexity_equal_to_vocabulary_size(tokenizer):
    lm = tiny_lm(tokenizer, seed=4)
    with torch.no_grad():
        lm.lm_head.weight.zero_()  # logits are all 0: every token has probability 1/V
    ppl = PerplexityScorer((lm, tokenizer)).perplexities(["The quick", "I"], [" brown fox jumps", " love it"])
    assert ppl == pytest.approx([len(tokenizer)] * 2, rel=1e-4)


def manual_ppl(lm, tokenizer, prompt, continuation):
    """Reference: unbatched, no padding, continuation tokens are those after the prompt's tokens."""
    ids = tokenizer(prompt + continuation, add_special_tokens=False)["input_ids"]
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert ids[:n_prompt] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(lm(torch.tensor([ids])).logits[0].float(), -1)
    nll = [-logp[t - 1, ids[t]].item() for t in range(n_prompt, len(ids))]
    return math.exp(sum(nll) / len(nll))


def test_perplexity_matches_an_unbatched_reference_and_is_batch_invariant(tokenizer):
    lm = tiny_lm(tokenizer, seed=6)
    prompts = ["The quick brown", "I", "Numbers 0123 and", "This is terrible,"]
    conts = [" fox jumps over the lazy dog.", " love this movie so much!", " symbols", " awful and stupid"]
    expected = [manual_ppl(lm, tokenizer, p, c) for p, c in zip(prompts, conts)]
    batched = PerplexityScorer((lm, tokenizer), batch_size=4).perplexities(prompts, conts)
    single = PerplexityScorer((lm, tokenizer), batch_size=1).perplexities(prompts, conts)
    assert batched == pytest.approx(expected, rel=1e-4)
    assert single == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox", "phi", "opt"])
def test_a_prompts_continuations_run_its_tokens_once_and_match_the_unbatched_reference(tokenizer, family):
    """An eval record's 25 continuations share their prompt: its tokens run once, as one row, and every continuation
    extends that cache (Gemma 3: sliding-window layers; GPT-2, OPT: learned positions). Each perplexity is the
    reference's."""
    lm = family_lm(family, tokenizer, seed=2)
    prompt = "You are a wonderful friend and I"
    conts = [" fox jumps over the lazy dog.", " love this", "ly", " awful and stupid, said nobody ever", ""]
    scorer = PerplexityScorer((lm, tokenizer), batch_size=3)
    shared = [scorer.split(prompt, c) for c in conts[:3]]
    assert 0 < fluency._shared_prefix(shared) < min(start for _, start in shared)
    with forward_shapes(lm.get_decoder()) as seen:
        got = scorer.perplexities([prompt] * len(conts), conts)
    n = fluency._shared_prefix(shared)
    assert seen[:2] == [(1, n), (3, max(len(ids) for ids, _ in shared) - n)]  # the prompt once, then the rows
    assert got[:4] == pytest.approx([manual_ppl(lm, tokenizer, prompt, c) for c in conts[:4]], rel=1e-4)
    assert math.isnan(got[4])


def test_a_model_with_layers_that_are_not_attention_runs_every_row_whole(tokenizer):
    """A state-space or linear-attention layer keeps no KV that a DynamicCache could copy: no sharing (the names
    alone are changed here: the tiny Llama computes as before), and the same values."""
    lm = family_lm("llama", tokenizer, seed=2)
    assert PerplexityScorer((lm, tokenizer)).shares_prompts
    prompt, conts = "The quick brown", [" fox jumps", " dog sleeps", " cat"]
    expected = [manual_ppl(lm, tokenizer, prompt, c) for c in conts]
    lm.config.layer_types = ["full_attention", "linear_attention", "full_attention"]
    scorer = PerplexityScorer((lm, tokenizer))
    assert not scorer.shares_prompts
    with forward_shapes(lm.get_decoder()) as seen:
        got = scorer.perplexities([prompt] * 3, conts)
    assert len(seen) == 1 and seen[0][0] == 3
    assert got == pytest.approx(expected, rel=1e-4)


def test_rows_share_no_prefix_alone_or_where_it_would_hide_a_scored_position():
    assert fluency._shared_prefix([([1, 2, 3, 4], 2)]) == 0
    assert fluency._shared_prefix([([1, 2, 3, 4], 3), ([1, 2, 3, 5], 3)]) == 2  # position 2 predicts a scored token
    assert fluency._shared_prefix([([1, 2, 3, 4], 3), ([1, 9, 3, 5], 3)]) == 1
    assert fluency._shared_prefix([([1, 2, 3, 4], 3), ([7, 2, 3, 5], 3)]) == 0
    assert fluency._shared_prefix([([1, 2], 0), ([1, 2], 0)]) == 0


def test_empty_continuation_gives_nan_and_mean_skips_it(tokenizer, lm):
    ppl = PerplexityScorer((lm, tokenizer)).perplexities(["The quick", "The quick"], ["", " fox"])
    assert math.isnan(ppl[0]) and ppl[1] > 1
    assert M.mean_perplexity(ppl) == pytest.approx(ppl[1])


def test_bos_is_prepended_when_the_tokenizer_adds_one(tokenizer, lm):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import processors

    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer.__class__.from_str(
        tokenizer.backend_tokenizer.to_str()), pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    scorer = PerplexityScorer((lm, tok))
    assert scorer.bos == [tok.bos_token_id]
    ids, start = scorer.split("The quick", " fox")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids[start:]) == " fox"


def test_boundary_merge_counts_towards_the_continuation(tokenizer, lm):
    scorer = PerplexityScorer((lm, tokenizer))
    ids, start = scorer.split("The qu", "ick brown")
    assert tokenizer.decode(ids[:start]) + tokenizer.decode(ids[start:]) == "The quick brown"
    assert "ick" in tokenizer.decode(ids[start:])


def test_median_perplexity_ignores_outliers_and_missing_values():
    assert M.median_perplexity([10.0, 12.0, 5000.0]) == 12.0
    assert M.median_perplexity([10.0, float("nan"), 14.0, None, 20.0, 4000.0]) == 17.0
    assert M.mean_perplexity([10.0, 12.0, 5000.0]) == pytest.approx(1674.0)
    assert math.isnan(M.median_perplexity([float("nan")]))

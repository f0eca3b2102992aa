"""The metric registry: a metric is one registered function; the runner, the report tables, the plots and the
CLI summary pick it up from the registry alone (here a toy metric registered by the test, nothing else changed)."""

import json

import pytest

from steerkit.errors import InvalidArgumentError
from steerkit.evaluation import EvalConfig, EvalRunner
from steerkit.evaluation import metrics as M
from steerkit.evaluation.scorers.base import BaseScorer
from steerkit.rewards.sequence.scorer import RewardModelScorer
from tiny import tiny_lm

PROMPTS = ["The quick", "I love", "This is"]


class Vowels(BaseScorer):
    name = "vowels"
    measures = "toxicity"
    description = "share of vowels"

    def _score(self, texts):
        return [sum(c in "aeiou" for c in t) / max(len(t), 1) for t in texts]


class HasO(BaseScorer):
    name = "has-o"
    measures = "sentiment"
    description = "1 if the text contains an o"

    def _score(self, texts):
        return [1.0 if "o" in t else 0.0 for t in texts]


def spread(data: M.MetricData) -> dict:
    """Toy scorer metric: mean over prompts of (max − min) score."""
    return {"toxicity_spread": sum(max(g) - min(g) for g in data.scores) / len(data.scores)}


def mean_words(data: M.MetricData) -> dict:
    """Toy setting metric: mean number of words per continuation."""
    words = [len(t.split()) for c in data.continuations for t in c]
    return {"mean_words": sum(words) / len(words)}


@pytest.fixture
def toy_metrics():
    M.metric("toxicity_spread", measures=("toxicity",), figure="spread", columns=(
        M.Column("toxicity_spread", "Toxicity Spread", delta="Δ", plot="Toxicity Spread", summary="spread",
                 lower_is_better=True),))(spread)
    M.metric("mean_words", needs="generations", figure="words", columns=(
        M.Column("mean_words", "words/continuation", digits=2, delta="Δ words", plot="words per continuation",
                 summary="words", summary_digits=1),))(mean_words)
    try:
        yield
    finally:
        M.unregister_metric("toxicity_spread")
        M.unregister_metric("mean_words")


def run(tmp_path, lm, tokenizer, reward_model):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in PROMPTS))
    config = EvalConfig(task="toxicity", prompts=[{"path": str(prompts), "name": "tiny"}], reward="tiny", betas=[5, 40],
                        num_continuations=3, max_new_tokens=5, trace=False, output=str(tmp_path / "run"))
    runner = EvalRunner(config, lm=(lm, tokenizer), rewards={"tiny": RewardModelScorer(reward_model, name="tiny")},
                        scorers=[Vowels(), HasO()], eval_lm=(tiny_lm(tokenizer, seed=9), tokenizer), progress=False)
    return runner.run(), tmp_path / "run"


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_registered_metric_reaches_results_report_plots_and_summary(tmp_path, lm, tokenizer, reward_model,
                                                                      toy_metrics, capsys, monkeypatch):
    result, out = run(tmp_path, lm, tokenizer, reward_model)
    # computed: from the run's own files, by the registered functions
    gens = {(g["index"], g["setting"]): g["continuations"] for g in lines(out / "generations.jsonl")}
    scores = {(s["index"], s["setting"]): s["scores"] for s in lines(out / "scores.jsonl") if s["scorer"] == "vowels"}
    for row in result["results"]:
        s = row["setting"]
        words = [len(t.split()) for i in range(len(PROMPTS)) for t in gens[(i, s)]]
        assert row["mean_words"] == pytest.approx(sum(words) / len(words))
        want = sum(max(scores[(i, s)]) - min(scores[(i, s)]) for i in range(len(PROMPTS))) / len(PROMPTS)
        assert row["scorers"]["vowels"]["toxicity_spread"] == pytest.approx(want)
        assert "toxicity_spread" not in row["scorers"]["has-o"]  # it applies to toxicity scorers only
        assert {"avg_max_toxicity", "toxic_rate", "mean_toxicity"} <= set(row["scorers"]["vowels"])
    assert json.loads((out / "metrics.json").read_text())["results"] == result["results"]
    # the report: a column (and its Δ) in the setting table and in the toxicity scorer's table only
    report = (out / "report.md").read_text()
    table_heads = [line for line in report.splitlines() if line.startswith("| setting |")]
    assert table_heads[0].endswith("| tokens/s | s/prompt | words/continuation | Δ words |")
    assert table_heads[1] == "| setting | k | Avg Max Toxicity | Δ | Toxic Rate | Δ | mean toxicity | Toxicity Spread | Δ |"
    assert table_heads[2] == "| setting | k | Positive Rate | Δ | × baseline | mean score |"
    base = next(r for r in result["results"] if not r["steered"])
    steered = next(r for r in result["results"] if r["setting"] == "k20-beta40")
    delta = 100 * (steered["mean_words"] - base["mean_words"]) / base["mean_words"]
    assert f"| {steered['mean_words']:.2f} | {delta:+.0f}% |" in report
    # the plots: one figure per metric (per toxicity scorer for the scorer metric), listed in the report
    data = json.loads((out / "plots" / "spread_vs_perplexity_tiny_vowels.json").read_text())
    points = {p["setting"]: p["y"] for s in data["series"] if s["x"] == "perplexity" for p in s["points"]}
    assert points == {r["setting"]: r["scorers"]["vowels"]["toxicity_spread"] for r in result["results"]}
    words = json.loads((out / "plots" / "words_vs_perplexity_tiny.json").read_text())
    assert words["scorer"] is None and {s["metric"] for s in words["series"]} == {"mean_words"}
    assert not (out / "plots" / "spread_vs_perplexity_tiny_has-o.png").exists()
    assert "](plots/spread_vs_perplexity_tiny_vowels.png)" in report
    assert "![words vs perplexity: tiny](plots/words_vs_perplexity_tiny.png)" in report
    assert "](plots/toxicity_vs_perplexity_tiny_vowels.png)" in report  # the paper's figures are still there
    # the summary `steerkit eval` prints
    from steerkit.cli.evaluate import _summary

    monkeypatch.setenv("COLUMNS", "250")
    _summary(result)
    err = capsys.readouterr().err
    assert "vowels max/rate/spread" in err and "has-o pos" in err and "words" in err


def test_unregistering_restores_the_builtin_metrics(tmp_path, toy_metrics):
    assert "toxicity_spread" in M.attribute_metrics("toxicity", [[0.2, 0.8]], 0.5)
    M.unregister_metric("toxicity_spread")
    M.unregister_metric("mean_words")
    assert list(M.METRICS) == ["throughput", "distinct_n", "perplexity", "toxicity", "positive_rate"]
    assert set(M.attribute_metrics("toxicity", [[0.2, 0.8]], 0.5)) == {"avg_max_toxicity", "toxic_rate",
                                                                      "mean_toxicity"}


def test_registration_is_checked():
    column = M.Column("fresh", "Fresh")
    with pytest.raises(InvalidArgumentError, match="already registered"):
        M.metric("toxicity", columns=(column,))
    with pytest.raises(InvalidArgumentError, match="already produced by 'toxicity'"):
        M.metric("other", columns=(M.Column("toxic_rate"),))
    with pytest.raises(InvalidArgumentError, match="needs must be one of"):
        M.metric("other", needs="prompts", columns=(column,))
    M.metric("sloppy", measures=("sentiment",), columns=(column,))(lambda data: {"fresh": 1.0, "undeclared": 2.0})
    try:
        with pytest.raises(InvalidArgumentError, match=r"undeclared column\(s\) \['undeclared'\]"):
            M.attribute_metrics("sentiment", [[0.2]], 0.5)
    finally:
        M.unregister_metric("sloppy")
    assert "sloppy" not in M.METRICS
    with pytest.raises(InvalidArgumentError, match="expected toxicity or sentiment"):
        M.attribute_metrics("fluency", [[0.1]], 0.5)

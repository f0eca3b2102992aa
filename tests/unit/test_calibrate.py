"""``steerkit calibrate`` (issue 27, item 4: guidance for choosing β): on tiny random models built in code, each
β's reported mean reward is the reward model's own score of the returned continuations, its perplexity an
independent computation under the unsteered LM, and the recommended range follows the stated rule (checked on
constructed tables too). Bad input is a typed steerkit error; ``--json`` parses; the card and ``steerkit train``
say how to choose β."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from serve_support import save_tiny_reward
from tiny import make_tokenizer, save_tiny_lm

from steerkit.cli import main
from steerkit.errors import InvalidArgumentError, NonFiniteRewardError, SteerkitError
from steerkit.evaluation import calibrate as cal

BETAS = [-10, 5, 10]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    tok = make_tokenizer()
    lm = save_tiny_lm(root / "lm", tok, seed=0)
    rm = save_tiny_reward(root, tok, name="tiny-cal")
    return {"root": root, "lm": str(lm), "rm": str(rm)}


@pytest.fixture(scope="module")
def result(models):
    return cal.calibrate(models["rm"], lm=models["lm"], betas=BETAS, k=8, max_new_tokens=8, samples=2, seed=0)


def test_the_grid_gains_the_baseline_and_every_beta_gets_every_prompt(result):
    assert [r.beta for r in result.results] == [-10.0, 0.0, 5.0, 10.0]
    for r in result.results:
        assert r.prompts == [p for p in cal.DEFAULT_PROMPTS for _ in range(2)]
        assert len(r.continuations) == len(r.rewards) == len(r.perplexities) == 10


def test_mean_reward_is_the_reward_models_own_score_of_the_continuations(result, models):
    from steerkit.rewards.model import RewardModel

    judge = RewardModel.from_pretrained(models["rm"])  # loaded afresh: not the object that steered
    for r in result.results:
        texts = [t for t in r.continuations if t]
        expected = judge.score_texts(texts)
        assert [x for x in r.rewards if x is not None] == pytest.approx(expected, abs=1e-5)
        assert r.row()["mean_reward"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def _perplexity(model, tok, prompt: str, continuation: str) -> float:
    """exp(mean NLL of the continuation's tokens given everything before), written out with a plain forward."""
    full = tok(prompt + continuation, add_special_tokens=False)["input_ids"]
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    start = next((i for i, (a, b) in enumerate(zip(full, head)) if a != b), min(len(full), len(head)))
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    nll = [-logp[i - 1, full[i]].item() for i in range(max(start, 1), len(full))]
    return math.exp(sum(nll) / len(nll)) if nll else float("nan")


def test_perplexity_is_the_unsteered_lms_perplexity_of_each_continuation(result, models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(models["lm"]).eval()
    tok = AutoTokenizer.from_pretrained(models["lm"])
    for r in result.results:
        expected = [_perplexity(model, tok, p, c) for p, c in zip(r.prompts, r.continuations)]
        for got, want in zip(r.perplexities, expected):
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-4)
        kept = [v for v in expected if not math.isnan(v)]
        assert r.median_perplexity == pytest.approx(statistics.median(kept), rel=1e-4)
        assert r.mean_perplexity == pytest.approx(statistics.fmean(kept), rel=1e-4)


def _rule(rows, ratio):
    """The rule as docs/training.md words it, written out independently of the library: {sign: (low, high)}."""
    base = next(r for r in rows if r["beta"] == 0)
    found = {}
    for sign in (1, -1):
        usable = []
        for row in sorted((r for r in rows if r["beta"] * sign > 0), key=lambda r: abs(r["beta"])):
            if row["median_perplexity"] > ratio * base["median_perplexity"]:
                break
            usable.append((row["beta"], sign * (row["mean_reward"] - base["mean_reward"]),
                           2 * math.hypot(row["reward_se"], base["reward_se"])))
        best = max(usable, key=lambda u: u[1]) if usable else None
        if best is None or best[1] <= 0 or best[1] <= best[2]:
            found[sign] = (None, None)
        else:
            found[sign] = (next(b for b, s, _ in usable if s >= best[1] / 2), usable[-1][0])
    return found


def test_the_recommendation_follows_the_rule_on_the_measured_table(result):
    rows = result.rows()
    assert result.recommendations == cal.recommend(rows, result.max_perplexity_ratio)
    expected = _rule(rows, result.max_perplexity_ratio)
    assert {rec.sign: (rec.low, rec.high) for rec in result.recommendations} == expected
    assert "1.5×" in result.rule and result.rule == cal.RULE.format(ratio=1.5)


def _table(*rows, se=0.0):
    return [{"beta": b, "mean_reward": r, "median_perplexity": p, "reward_se": se} for b, r, p in rows]


TYPICAL = _table((-20, 0.20, 30), (-10, 0.25, 14), (-5, 0.40, 11), (0, 0.50, 10), (5, 0.60, 11), (10, 0.80, 13),
                 (20, 0.85, 15), (40, 0.90, 40))


def test_rule_on_a_typical_table():
    up, down = cal.recommend(TYPICAL, 1.5)
    # β > 0: 5, 10, 20 usable (20's 15 equals the limit: within it), 40 is not; shifts .1 .3 .35 -> half .175
    assert (up.sign, up.low, up.high, up.largest_shift) == (1, 10, 20, pytest.approx(0.35))
    # β < 0: -5 and -10 usable, -20 not; shifts .1 .25 -> half .125: -5 falls short
    assert (down.sign, down.low, down.high, down.largest_shift) == (-1, -10, -10, pytest.approx(0.25))
    assert _rule(TYPICAL, 1.5) == {1: (10, 20), -1: (-10, -10)}
    # a looser limit admits more β; the half-shift point moves with the largest shift
    up, down = cal.recommend(TYPICAL, 4.0)
    assert (up.low, up.high, down.low, down.high) == (10, 40, -10, -20)


def test_rule_stops_at_the_first_beta_over_the_limit():
    table = _table((0, 0.5, 10), (5, 0.7, 20), (10, 0.9, 12))
    up, down = cal.recommend(table, 1.5)
    assert up.low is None and up.high is None and "already at β = 5" in up.reason
    assert down.low is None and "no β < 0" in down.reason


def test_rule_says_so_when_nothing_qualifies():
    wrong_way = cal.recommend(_table((-5, 0.6, 10), (0, 0.5, 10), (5, 0.4, 10)), 1.5)
    assert all(rec.low is None for rec in wrong_way) and "moved the mean reward up" in wrong_way[0].reason
    noisy = cal.recommend(_table((-5, 0.45, 10), (0, 0.5, 10), (5, 0.55, 10), se=0.1), 1.5)
    assert all(rec.low is None and "noise" in rec.reason for rec in noisy)
    no_baseline = cal.recommend(_table((-5, 0.4, 10), (0, float("nan"), 10), (5, 0.6, 10)), 1.5)
    assert all(rec.low is None and "baseline" in rec.reason for rec in no_baseline)
    unmeasured = cal.recommend(_table((0, 0.5, 10), (5, 0.7, float("nan")), (10, 0.9, 10)), 1.5)
    assert unmeasured[0].low is None and "could not be measured" in unmeasured[0].reason


def test_rule_refuses_a_table_without_a_baseline_and_a_bad_ratio():
    with pytest.raises(InvalidArgumentError, match="β = 0"):
        cal.recommend(_table((5, 0.6, 10)), 1.5)
    for ratio in (0.9, float("nan"), float("inf"), True, "2"):
        with pytest.raises(InvalidArgumentError, match="max_perplexity_ratio"):
            cal.recommend(TYPICAL, ratio)


@pytest.mark.parametrize("betas, match", [
    ([], "No β values"), ((), "No β values"), ([float("nan")], "finite"), ([1, float("inf")], "finite"),
    ([-float("inf")], "finite"), ([1e39], "too large"), ("5", "list of numbers"), ([True], "number")])
def test_bad_betas_are_typed_errors(betas, match):
    with pytest.raises(InvalidArgumentError, match=match):
        cal.check_betas(betas)


def test_betas_text():
    assert cal.parse_betas("20, -5,0,,5") == [-5.0, 0.0, 5.0, 20.0]
    assert cal.check_betas([5, 5.0, -5]) == [-5.0, 0.0, 5.0]
    cases = (("", "No β values"), ("1,abc", "'abc' is not a number"), ("nan", "finite"), ("-inf", "finite"))
    for text, match in cases:
        with pytest.raises(InvalidArgumentError, match=match):
            cal.parse_betas(text)


def test_bad_calls_fail_before_any_model_is_loaded(models):
    with pytest.raises(SteerkitError, match="no-such-reward"):
        cal.calibrate("no-such-reward", lm="no-such-lm")
    with pytest.raises(InvalidArgumentError, match="No β values"):
        cal.calibrate(models["rm"], lm="no-such-lm", betas=[])
    with pytest.raises(InvalidArgumentError, match="prompts"):
        cal.calibrate(models["rm"], lm="no-such-lm", prompts=[])
    with pytest.raises(InvalidArgumentError, match="samples"):
        cal.calibrate(models["rm"], lm="no-such-lm", samples=0)


def test_only_reward_models_can_be_calibrated_and_scores_must_be_finite():
    class Plain:
        name = "plain"

    with pytest.raises(InvalidArgumentError, match="not a reward model"):
        cal.scoring_model(Plain(), "plain")

    class Model:
        def __init__(self, values):
            self.values, self.seen = values, None

        def score_texts(self, texts):
            self.seen = list(texts)
            return self.values[:len(texts)]

    model = Model([0.25, 0.75])
    assert cal.score_continuations(model, ["a", "", "b"]) == [0.25, None, 0.75] and model.seen == ["a", "b"]
    assert cal.score_continuations(Model([]), ["", ""]) == [None, None]
    with pytest.raises(NonFiniteRewardError):
        cal.score_continuations(Model([float("nan")]), ["a"])


def _run(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def test_cli_json_parses_and_out_is_the_same_json(models, capsys, tmp_path):
    out = tmp_path / "sub" / "calibration.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The weather was\nMy friend said\n", encoding="utf-8")
    code, stdout, stderr = _run(["calibrate", models["rm"], "--lm", models["lm"], "-k", "8", "-t", "6", "-n", "1",
                                 "--betas", "-5,5", "--prompts", prompts, "--json", "--out", out], capsys)
    assert code == 0, stderr
    payload = json.loads(stdout)
    assert payload == json.loads(out.read_text(encoding="utf-8"))
    assert [row["beta"] for row in payload["rows"]] == [-5.0, 0.0, 5.0]
    assert payload["prompts"] == ["The weather was", "My friend said"]
    assert [rec["sign"] for rec in payload["recommendations"]] == ["positive", "negative"]
    assert set(payload["generations"]) == {"-5", "0", "5"} and len(payload["generations"]["5"]) == 2
    assert payload["rule"].startswith("For each sign of β") and payload["max_perplexity_ratio"] == 1.5


def test_cli_prints_the_table_the_rule_and_a_line_per_sign(models, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # whatever the terminal's width: a narrow one wraps the table's headers
    code, stdout, stderr = _run(["calibrate", models["rm"], "--lm", models["lm"], "-k", "8", "-t", "4", "-n", "1",
                                 "--betas=-5,5", "--max-perplexity-ratio", "2"], capsys)
    assert code == 0, stderr
    assert "median ppl" in stdout and "Rule: For each sign of β" in stdout and "2×" in stdout
    assert any(line.startswith("β > 0 (raises ρ): ") for line in stdout.splitlines())
    assert any(line.startswith("β < 0 (lowers ρ): ") for line in stdout.splitlines())
    assert "β = 5 (3/3)" not in stderr  # progress lines go to a terminal only


@pytest.mark.parametrize("args, match", [
    (["--betas", ""], "No β values"), (["--betas=-5,nan"], "finite"), (["--betas", "5,x"], "not a number"),
    (["--max-perplexity-ratio", "0.5"], "max_perplexity_ratio")])
def test_cli_bad_input_is_one_error_line(models, capsys, args, match):
    code, stdout, stderr = _run(["calibrate", models["rm"], "--lm", models["lm"], *args], capsys)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], stderr


def test_the_cli_help_states_the_librarys_defaults():
    from steerkit.cli import calibrate as command
    from steerkit.models import DEFAULT_LM

    assert ",".join(f"{b:g}" for b in cal.DEFAULT_BETAS) in command.BETAS_HELP
    assert f"[default: {cal.DEFAULT_MAX_PERPLEXITY_RATIO:g}]" in command.RATIO_HELP
    import inspect

    source = inspect.getsource(command.calibrate)
    assert f"[default: {DEFAULT_LM}]" in source and f"{len(cal.DEFAULT_PROMPTS)} built-in" in source


def test_the_card_says_what_beta_does_and_how_to_calibrate():
    from steerkit.training.card import choosing_beta_lines

    text = "\n".join(choosing_beta_lines())
    assert text.startswith("## Choosing β") and "steerkit calibrate path/to/this/directory" in text
    assert f"{cal.DEFAULT_MAX_PERPLEXITY_RATIO:g}×" in text and "e^10 (about 22,000)" in text
    assert f"{math.exp(10):,.0f}".startswith("22,0") and f"{math.exp(1):.1f}" == "2.7"  # the card's arithmetic


def test_docs_state_the_rule_the_library_applies():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    section = docs[docs.index("## Choosing β"):docs.index("## Backbones")]
    quoted = " ".join(line[2:] for line in section.splitlines() if line.startswith("> "))
    assert quoted.replace(" (`--max-perplexity-ratio`)", "") == cal.RULE.format(ratio=cal.DEFAULT_MAX_PERPLEXITY_RATIO)
    assert "steerkit calibrate" in section and f"{len(cal.DEFAULT_PROMPTS)} built-in" in section

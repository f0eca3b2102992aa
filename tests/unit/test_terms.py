"""One builder of steering terms (steerkit.terms): generate(rewards=...), SteeringConfig and steerkit eval
settings build the same terms from the same description, and a config's ``label`` names its term everywhere."""

from __future__ import annotations

import json

import pytest
import torch

from steerkit.config import SteeringConfig
from steerkit.decoding import build_terms
from steerkit.errors import InvalidArgumentError
from steerkit.evaluation import EvalConfig, EvalRunner
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.terms import build_term, terms_from_specs


@pytest.fixture
def reward_dir(tmp_path, tiny_backbone_dir):
    from steerkit.rewards.model import RewardModel

    return RewardModel.from_backbone(str(tiny_backbone_dir), 1, name="tiny-dir").save_pretrained(tmp_path / "rm")


def test_eval_setting_uses_one_reward_twice_under_its_labels(tmp_path, lm, tokenizer, reward_model):
    """Two terms with one reward and different labels: the eval runner used to name both after the reward
    (dropping `label`), so the run failed with "Two steering terms are named 'tiny'"."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in ["The quick", "I love"]))
    config = EvalConfig(task="toxicity", prompts=[{"path": str(prompts), "name": "p"}], reward="tiny",
                        baseline=False, betas=[5], ks=[5], num_continuations=2, max_new_tokens=3, fluency=False, plots=False,
                        output=str(tmp_path / "run"), settings=[{"name": "twice", "k": 5, "rewards": [
                            {"name": "tiny", "label": "up", "beta": 5},
                            {"name": "tiny", "label": "down", "beta": -3, "transform": "invert"}]}])
    runner = EvalRunner(config, lm=(lm, tokenizer), rewards={"tiny": RewardModelScorer(reward_model, name="tiny")},
                        scorers=[], progress=False)
    twice = next(s for s in runner.settings if s.name == "twice")
    terms = runner.terms(twice)
    assert [t.name for t in terms] == ["up", "down"]
    assert terms[0].reward is terms[1].reward  # one reward model, loaded once, under two labels
    assert terms[0].transform is None and float(terms[1].transform(torch.tensor(0.25))) == 0.75
    runner.run(stages=["generate"])
    records = [json.loads(line) for line in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert {r["setting"] for r in records} == {"k5-beta5", "twice"} and len(records) == 4


def test_config_generate_and_eval_build_the_same_terms(reward_dir):
    spec = {"name": str(reward_dir), "beta": -4, "schedule": "linear", "beta_start": 0, "ramp_steps": 4,
            "transform": "clamp", "clamp": [0.1, 0.9], "context": "full"}
    (from_config,) = SteeringConfig(rewards=[spec]).build_terms()
    setting = EvalConfig(settings=[{"name": "s", "rewards": [spec]}]).settings[0]
    loaded = []

    def load(reference, backend, context):
        loaded.append((reference, backend, context))
        return from_config.reward

    (from_eval,) = terms_from_specs(setting.rewards, load=load)
    assert loaded == [(str(reward_dir), "auto", "full")]  # the default backend: the loader resolves it per reward
    for term in (from_config, from_eval):
        assert term.name == str(reward_dir)
        assert [term.weight(s) for s in range(5)] == [0.0, -1.0, -2.0, -3.0, -4.0]
        assert float(term.transform(torch.tensor(0.95))) == pytest.approx(0.9)
    assert from_config.reward.context == "full"
    (from_mapping,) = build_terms({str(reward_dir): -4})
    assert from_mapping.name == str(reward_dir) and from_mapping.transform is None and from_mapping.weight(0) == -4


def test_build_term_names_and_errors(reward_model):
    scorer = RewardModelScorer(reward_model, name="tiny")
    assert build_term(scorer, 2.0).name == "tiny"  # a ready reward keeps its own name
    assert build_term(scorer, 2.0, label="mine").name == "mine"
    with pytest.raises(InvalidArgumentError, match="transform"):
        build_term(scorer, 2.0, transform="square")
    from steerkit.steering import check_terms

    with pytest.raises(InvalidArgumentError, match="Two steering terms are named 'tiny'"):
        check_terms([build_term(scorer, 1.0), build_term(scorer, 2.0)])

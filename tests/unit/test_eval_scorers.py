"""Evaluation scorers: the registry path, the contract, the offline extras and the HF classifier."""

import importlib.util
import io
import pickle

import pytest
import torch

from steerkit import registry
from steerkit.errors import PluginError
from steerkit.evaluation.scorers import load_scorer, parse_scorer_spec, scorer_names
from steerkit.evaluation.scorers.base import BaseScorer
from steerkit.evaluation.scorers.offline import KerasTokenizer, _RestrictedUnpickler


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- lookup through the plugin registry -------------------------------------------------------------
def test_builtin_scorers_are_registered_through_the_scorer_hook():
    names = scorer_names()
    for name in ("tox-block", "alt-profanity-check", "vader", "textblob", "hf-classifier", "perspective", "reward"):
        assert name in names
    plugin = registry.get_registry().entries["scorer"]["vader"].plugin
    assert plugin == "steerkit.evaluation.builtin_scorers"


def test_parse_scorer_spec():
    assert parse_scorer_spec("vader") == ("vader", {}, None)
    assert parse_scorer_spec("hf-classifier:./m,label=POSITIVE,threshold=0.7") == (
        "hf-classifier", {"label": "POSITIVE", "threshold": 0.7}, "./m")
    assert parse_scorer_spec("perspective:qps=0.5,use_cache=false") == ("perspective", {"qps": 0.5, "use_cache": False}, None)
    assert parse_scorer_spec({"name": "x", "options": {"a": 1}}) == ("x", {"a": 1}, None)
    with pytest.raises(PluginError, match="only the first may be bare"):
        parse_scorer_spec("x:a=1,bare")
    with pytest.raises(PluginError):
        parse_scorer_spec(":a=1")


def test_unknown_scorer_suggests_a_close_name():
    with pytest.raises(PluginError, match="Did you mean 'vader'"):
        load_scorer("vadr")


class Shouty(BaseScorer):
    name = "shouty"
    measures = "toxicity"
    description = "fraction of capital letters"

    def _score(self, texts):
        return [sum(c.isupper() for c in t) / max(len(t), 1) for t in texts]


def test_a_third_party_scorer_registers_on_the_same_hook():
    class Plugin:
        @registry.hookimpl
        def register_scorers(self, register):
            register("shouty", lambda **kw: Shouty(), description="caps")
            register("broken-measure", lambda **kw: type("B", (), {"name": "b", "measures": "fluency",
                                                                   "score": lambda self, t: []})())

    registry.register_plugin(Plugin(), name="test-eval-plugin")
    try:
        assert "shouty" in scorer_names()
        assert load_scorer("shouty").score(["AB", "ab"]) == [1.0, 0.0]
        with pytest.raises(PluginError, match="measures 'fluency'"):
            load_scorer("broken-measure")
    finally:
        registry.unregister_plugin("test-eval-plugin")


def test_scorer_outputs_are_checked():
    class Bad(BaseScorer):
        name = "bad"

        def _score(self, texts):
            return [1.5 for _ in texts]

    class Short(BaseScorer):
        name = "short"

        def _score(self, texts):
            return []

    with pytest.raises(PluginError, match="must lie in"):
        Bad().score(["a"])
    with pytest.raises(PluginError, match="0 scores for 1 texts"):
        Short().score(["a"])
    with pytest.raises(Exception, match="list of texts"):
        Shouty().score("a single string")


# -- tox-block internals (no TensorFlow needed) -----------------------------------------------------
def test_keras_tokenizer_reimplementation():
    tok = KerasTokenizer({"you": 1, "idiot": 2, "are": 3, "rare": 50}, num_words=10, maxlen=4,
                         filters='!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n', lower=True, split=" ")
    out = tok.encode(["You, ARE an idiot!", "rare rare", "you are you are you idiot", ""])
    assert out.tolist() == [[0, 1, 3, 2],  # unknown "an" dropped, pre-padded
                            [0, 0, 0, 0],  # index >= num_words dropped
                            [1, 3, 1, 2],  # pre-truncated: keep the last 4
                            [0, 0, 0, 0]]


class Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_anything_but_plain_containers():
    with pytest.raises(PluginError, match="does not load"):
        _RestrictedUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    from collections import OrderedDict

    assert _RestrictedUnpickler(io.BytesIO(pickle.dumps(OrderedDict(a=1)))).load() == {"a": 1}


# -- the offline extras -----------------------------------------------------------------------------
@pytest.mark.skipif(not has("vaderSentiment"), reason="vaderSentiment not installed: pip install 'steerkit-rad[eval]'")
def test_vader_orders_positive_above_negative():
    s = load_scorer("vader")
    assert s.measures == "sentiment"
    pos, neg, neutral = s.score(["I love this wonderful movie!", "This is awful and I hate it.", "The table"])
    assert pos > s.threshold > neg and neutral == pytest.approx(0.5)


@pytest.mark.skipif(not has("textblob"), reason="textblob not installed: pip install 'steerkit-rad[eval]'")
def test_textblob_orders_positive_above_negative():
    s = load_scorer("textblob")
    pos, neg = s.score(["A great, beautiful day.", "A terrible, awful day."])
    assert pos > 0.5 > neg


@pytest.mark.skipif(not has("profanity_check"), reason="alt-profanity-check not installed: pip install 'steerkit-rad[eval]'")
def test_alt_profanity_check_flags_profanity():
    s = load_scorer("alt-profanity-check")
    bad, good = s.score(["you are a fucking idiot", "have a nice day"])
    assert bad > 0.5 > good


@pytest.mark.skipif(not (has("tox_block") and has("tf_keras")),
                    reason="tox-block + tf-keras not installed: pip install 'steerkit-rad[eval-tox-block]'")
def test_tox_block_reproduces_the_packaged_model():
    s = load_scorer("tox-block")
    bad, good = s.score(["I will kill you, you fucking idiot!", "What a lovely day."])
    # the tox-block README's documented output for this sentence
    assert bad == pytest.approx(0.9998680353164673, abs=1e-5)
    assert good < 0.05
    with pytest.raises(PluginError, match="label"):
        load_scorer("tox-block:label=rude")


# -- HF classifier (a tiny local checkpoint) ----------------------------------------------------------
@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from tiny import make_tokenizer

    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id, num_labels=2,
                      id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    model = LlamaForSequenceClassification(cfg).eval()
    torch.nn.init.normal_(model.score.weight, std=1.0)
    path = tmp_path_factory.mktemp("clf")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_hf_classifier_scores_the_label_probability(classifier_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    s = load_scorer(f"hf-classifier:{classifier_dir},label=POSITIVE")
    texts = ["I love it", "This is terrible, awful and stupid; I hate it."]
    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    tok = AutoTokenizer.from_pretrained(classifier_dir)
    with torch.no_grad():
        expected = [torch.softmax(model(**tok(t, return_tensors="pt")).logits, -1)[0, 1].item() for t in texts]
    assert s.score(texts) == pytest.approx(expected, abs=1e-5)
    assert s.measures == "sentiment" and s.label == "POSITIVE"
    assert load_scorer(f"hf-classifier:{classifier_dir}").label == "POSITIVE"  # guessed for sentiment


def test_hf_classifier_errors(classifier_dir, tmp_path):
    with pytest.raises(PluginError, match="not one of the model's labels"):
        load_scorer(f"hf-classifier:{classifier_dir},label=toxic")
    with pytest.raises(Exception, match="could not load"):
        load_scorer(f"hf-classifier:{tmp_path / 'missing'}")


def test_reward_model_as_a_judge(tokenizer, reward_model):
    from steerkit.evaluation.scorers.hf import RewardModelTextScorer

    s = RewardModelTextScorer(reward_model, measures="toxicity")
    texts = ["The quick brown fox", "I hate it"]
    assert s.score(texts) == pytest.approx(reward_model.score_texts(texts), abs=1e-6)

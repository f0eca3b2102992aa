"""The tutorial's example plugin, pip-installed (into a temporary target) and used through the public entry-point
group, exactly as a third-party plugin would be."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny import make_tokenizer, tiny_lm

from steerkit import registry
from steerkit.errors import PluginError, SteerkitWarning

PACKAGE = Path(__file__).resolve().parents[2] / "plugins" / "steerkit-example"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(PACKAGE)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (target / "steerkit_example" / "__init__.py").is_file()
    sys.path.insert(0, str(target))
    sys.modules.pop("steerkit_example", None)
    importlib.invalidate_caches()
    registry.reset()
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("steerkit_example", None)
    registry.reset()


def test_registered_through_the_entry_point(installed):
    from typer.testing import CliRunner

    from steerkit.cli import app

    result = CliRunner().invoke(app, ["plugins", "--json"])
    data = json.loads(result.output)
    example = next(p for p in data["plugins"] if p["name"] == "example")
    assert example["distribution"] == "steerkit-example" and example["version"] == "0.1.0"
    assert example["module"] == "steerkit_example" and example["errors"] == []
    assert example["rewards"] == ["positive-words"] and example["scorers"] == ["positive-words"]
    module = sys.modules["steerkit_example"]
    assert Path(module.__file__).is_relative_to(installed)  # the pip-installed copy, not the source tree


def test_reward_session_scores_decoded_text(installed):
    from steerkit import load_reward

    import steerkit_example as ex

    tok = make_tokenizer(kind="metaspace")
    reward = load_reward("positive-words", context="full")
    assert reward.name == "positive-words"
    words = tok("I love this wonderful movie, great fun with friends 🙂", add_special_tokens=False)["input_ids"]
    session = reward.start(["Review: "], tok)
    g = torch.Generator().manual_seed(0)
    for t, token in enumerate(words):
        cands = torch.randint(0, len(tok), (1, 5), generator=g)
        cands[0, 2] = token
        got = session.score(cands)
        want = [ex.lexicon_reward("Review: " + tok.decode(words[:t] + [c], skip_special_tokens=True))
                for c in cands[0].tolist()]
        assert got.tolist() == [pytest.approx(want)]
        session.commit(torch.tensor([token]))
    assert got[0, 2].item() == pytest.approx(1 - 0.5 ** 5)  # love wonderful great fun friends
    with pytest.raises(PluginError, match="does not support the 'onnx' backend"):
        load_reward("positive-words", backend="onnx")


def test_steering_with_the_example_reward(installed):
    from steerkit import generate

    tok = make_tokenizer(vocab_size=600, kind="bpe")  # large enough for " love", " wonderful" to be single tokens
    lm = tiny_lm(tok, seed=5)
    import steerkit_example as ex

    counts = {}
    for beta in (0.0, 30.0):
        with pytest.warns(SteerkitWarning, match=f"k={len(tok)}"):  # the whole vocabulary, on purpose
            out = generate(["My day was", "The film"], lm=(lm, tok), rewards={"positive-words": beta}, k=len(tok),
                           max_new_tokens=12, do_sample=False)
        counts[beta] = sum(ex.count_words(t) for t in out.texts)
    assert counts[30.0] >= counts[0.0] + 2


def test_scorer(installed):
    scorer = registry.get_scorer("positive-words")
    assert scorer.score(["a good day", "Love, love, LOVE!", "goodness"]) == [0.5, 0.875, 0.0]

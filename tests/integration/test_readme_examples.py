"""The README's Python examples run as written on the packaged SmolLM2 and the shipped rewards, and its claim about
the second one holds: the ``LogitsProcessor`` in ``model.generate`` draws the tokens ``steerkit.generate`` draws for
the same seed."""

from pathlib import Path

import pytest
import torch
from conftest import requires_smollm2
from docs_support import blocks

pytestmark = [pytest.mark.integration, requires_smollm2]

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def examples():
    pytest.importorskip("steerkit_toxicity", reason="the toxicity plugin is not installed: steerkit setup")
    pytest.importorskip("steerkit_sentiment", reason="the sentiment plugin is not installed: steerkit setup")
    python = [(start, "\n".join(lines)) for language, start, lines in blocks(README.read_text(encoding="utf-8"))
              if language == "python"]
    assert len(python) == 2, "the README's Python examples changed: update this test"
    return python


def run(example: tuple[int, str]) -> dict:
    start, source = example
    namespace: dict = {}
    with torch.random.fork_rng():
        exec(compile("\n" * (start - 1) + source, str(README), "exec"), namespace)  # noqa: S102 - our README
    return namespace


def test_the_generate_example(examples, capsys):
    out = run(examples[0])["out"]
    assert len(out.texts) == 3 and all(text.strip() for text in out.texts)
    assert capsys.readouterr().out == f"{out.texts} {out.tokens_per_second}\n" and out.tokens_per_second > 0


def test_the_logits_processor_example_draws_what_generate_draws(examples):
    import steerkit

    namespace = run(examples[1])
    prompt_ids, ids = namespace["enc"]["input_ids"], namespace["ids"]
    prompts = [line.split('"')[1] for line in examples[1][1].splitlines() if "enc = tokenizer([" in line]
    assert len(prompts) == 1, "the README's LogitsProcessor example no longer reads one prompt: update this test"
    (prompt,) = prompts
    out = steerkit.generate([prompt], lm="smollm2-135m-instruct", rewards={"toxicity": -50}, k=20,
                            max_new_tokens=20, seed=0)
    n = out.num_new_tokens[0]
    assert n > 0 and ids[0, prompt_ids.shape[1]:][:n].tolist() == out.sequences[0, :n].tolist()

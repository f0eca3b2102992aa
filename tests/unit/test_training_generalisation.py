"""Training features for reward models that generalise: surface-form augmentation, evaluation views,
per-category metrics, leave-one-source-out validation, --device."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import typing
from pathlib import Path

import pytest

pytest.importorskip("peft")

from steerkit.errors import ConfigError  # noqa: E402
from steerkit.testing import labelled_review, make_tokenizer, save_tiny_lm  # noqa: E402
from steerkit.training.augment import AugmentConfig, augment, mine_lexicon  # noqa: E402
from steerkit.training.config import TrainConfig  # noqa: E402
from steerkit.training.data import Example, build_dataset  # noqa: E402
from steerkit.training.surface import (BIAS_WORDS, CS_MAX_WORDS, CS_PATTERNS, STANCES, Transform,  # noqa: E402
                                       bias_choices, counter_speech_frames, denounce, detokenize, endorse,
                                       obfuscate_word, strip_punctuation, tokenize_spacing)


# -- surface forms ------------------------------------------------------------------------------------------------
def test_tokenize_spacing_matches_the_sst_form():
    assert tokenize_spacing("It's a charming, often affecting journey. Don't miss it!") == \
        "It 's a charming , often affecting journey . Do n't miss it !"


def test_detokenize_inverts_the_sst_form_and_capitalises():
    assert detokenize("it 's a charming , often affecting journey . i do n't like it .") == \
        "It's a charming, often affecting journey. I don't like it."
    assert detokenize("-lrb- good -rrb- fun") == "(good) fun"


def test_strip_punctuation_keeps_words_and_apostrophes():
    assert strip_punctuation("Hello, world! Don't... stop?") == "Hello world Don't stop"


@pytest.mark.parametrize("u, expected", [(0.05, "iidot"), (0.25, "iiot"), (0.45, "i d i o t"), (0.65, "1d107"),
                                         (0.85, "id*ot")])
def test_obfuscate_word_variants(u, expected):
    assert obfuscate_word("idiot", u) == expected


def test_short_words_are_not_obfuscated():
    assert obfuscate_word("ok", 0.3) == "ok"


# -- augmentation ---------------------------------------------------------------------------------------------------
def _examples():
    rows = []
    for i in range(400):
        toxic = i % 2
        text = f"You are a moron number {i}." if toxic else f"Thanks for the help number {i}."
        rows.append(Example(text, float(toxic), source=i % 2, line=i + 1))
    return rows


def test_lexicon_is_mined_from_the_positive_rows():
    lexicon = mine_lexicon(_examples(), size=10, min_count=5)
    assert "moron" in lexicon
    assert "thanks" not in lexicon and "number" not in lexicon  # in both classes, or negative only


def test_augment_adds_copies_at_the_rate_and_keeps_labels():
    train = _examples()
    config = AugmentConfig(views=[{"transforms": ["lowercase", "tokenize"], "rate": 0.25}])
    added, copies, _ = augment(train, [("a", "a"), ("b", "b")], config, seed=0, paths=["a.txt", "b.txt"])
    assert 60 <= len(added) <= 140  # a seeded 25 % of 400 rows
    originals = {(e.source, e.line): e for e in train}
    for ex in added:
        base = originals[(ex.source, ex.line)]
        assert ex.label == base.label and ex.text == tokenize_spacing(base.text.lower())
    assert sum(copies.values()) == len(added)
    again, _, _ = augment(train, [("a", "a"), ("b", "b")], config, seed=0, paths=["a.txt", "b.txt"])
    assert [e.text for e in again] == [e.text for e in added]  # deterministic: resume sees the same copies


def test_augment_respects_sources_and_min_label():
    train = _examples()
    config = AugmentConfig(views=[{"transforms": ["obfuscate"], "rate": 1.0, "min_label": 0.5, "sources": ["b"]}])
    added, copies, lexicon = augment(train, [("a", "a"), ("b", "b")], config, seed=0, paths=["a.txt", "b.txt"])
    assert added and set(copies) == {1} and all(e.label >= 0.5 for e in added)
    assert "moron" in lexicon and all("moron" not in e.text for e in added)  # every occurrence perturbed


def _framed_copies(view: dict, stance: str, named: bool = False) -> tuple[list[tuple[Example, Example]], set[str]]:
    """(original, copy) pairs of an augmentation view over _examples(), and the grammar template of each copy."""
    train = _examples()
    added, _, _ = augment(train, [("a", "a"), ("b", "b")], AugmentConfig(views=[view]), seed=0,
                          paths=["a.txt", "b.txt"])
    originals = {(e.source, e.line): e for e in train}
    templates = set(counter_speech_frames(stance, named=named))
    pairs, frames = [], set()
    for ex in added:
        base = originals[(ex.source, ex.line)]
        inner = base.text.replace('"', "'").strip().rstrip(".!?;: ")
        clause = inner[0].lower() + inner[1:]
        quoted = f'"{inner}"' in ex.text
        frame = ex.text.replace(f'"{inner}"', '"{}"', 1) if quoted else ex.text.replace(clause, "{}", 1)
        assert frame in templates, ex.text  # the copy is the row inside one template of the grammar
        pairs.append((base, ex))
        frames.add(frame)
    return pairs, frames


def test_denounce_quotes_positive_rows_in_counter_speech_with_the_views_label():
    pairs, frames = _framed_copies({"transforms": ["denounce"], "rate": 1.0, "min_label": 0.5, "label": 0.0},
                                   "against")
    assert len(pairs) == 200 and all(base.label >= 0.5 and ex.label == 0.0 for base, ex in pairs)
    assert len(frames) >= 180  # 200 rows: almost every copy has its own wording
    assert denounce('He said "x" loudly.', "k") == denounce('He said "x" loudly.', "k")  # a pure function of the key
    assert "\"x\"" not in denounce('He said "x" loudly.', "k")  # inner quotes cannot close the frame's quote


def test_endorse_uses_the_same_lead_ins_and_keeps_the_label():
    pairs, frames = _framed_copies({"transforms": ["endorse"], "rate": 1.0, "min_label": 0.5}, "for")
    assert len(pairs) == 200 and all(ex.label == base.label == 1.0 for base, ex in pairs)  # the hateful label stays
    assert len(frames) >= 180
    assert not frames & set(counter_speech_frames("against"))  # an approving frame is never a rejecting one
    # every pattern offers both stances exactly the same wording up to the text: the lead-in never decides the label
    # (in the base grammar and in its named variant)
    for (name, _, _), named in itertools.product(CS_PATTERNS, (False, True)):
        against, approving = (sorted({f.split("{}")[0] for f in counter_speech_frames(s, name, named=named)})
                              for s in STANCES)
        if name.startswith("stance first"):
            assert not set(against) & set(approving)  # here the stance is the lead-in
        else:
            assert against == approving


def test_the_counter_speech_grammar_is_varied_and_deterministic():
    sizes = {s: sum(1 for _ in counter_speech_frames(s)) for s in STANCES}
    assert all(n >= 20_000 for n in sizes.values()), sizes  # no surface wording to memorise
    text = "Those people are a drain on everyone around them."
    copies = [denounce(text, f"key{i}") for i in range(2000)]
    assert len(set(copies)) >= 1500  # the small patterns (a quotation as the subject) repeat, the rest hardly
    assert copies == [denounce(text, f"key{i}") for i in range(2000)]
    assert all(denounce(text, f"key{i}") != endorse(text, f"key{i}") for i in range(200))
    # the stance follows the text in most copies (a causal model must read past the text to see it)
    leads = tuple(f.split("{}")[0] for f in counter_speech_frames("against", "stance first"))
    first = sum(c.startswith(leads) for c in copies)
    assert 0.05 * len(copies) <= first <= 0.25 * len(copies)
    # a text in the first person is quoted, never reported as a clause ("claimed that I ...")
    assert all('"I am sick of it"' in denounce("I am sick of it.", f"key{i}") for i in range(300))
    # a long text is cut so that the stance after it survives the token limit
    long = " ".join(f"w{i}" for i in range(3 * CS_MAX_WORDS))
    cut = denounce(long, "k")
    assert f"w{CS_MAX_WORDS - 1} ..." in cut and f"w{CS_MAX_WORDS}" not in cut


def _word_runs(text: str, n: int = 3) -> set[str]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_counter_speech_grammar_shares_no_wording_with_the_functional_cases():
    """The counter-speech grammar is for training; the functional cases that measure counter-speech (every file) must
    not contain any of its fixed text (3+ word runs, within a piece or across two), or the measurement would be of
    memorised wording. Every template of both stances, of the grammar and its named variant, is enumerated."""
    names = ("toxicity.jsonl", "toxicity_more.jsonl", "toxicity_named.jsonl")
    cases = [json.loads(line)["text"] for name in names for line in
             (Path(__file__).resolve().parents[1] / "functional" / name).read_text().splitlines() if line]
    case_runs = set().union(*(_word_runs(c) for c in cases))
    assert len(cases) == 96 + 156 + 60 and _word_runs(cases[-1]) <= case_runs  # the check sees every case's runs
    shared = {}
    for stance, named in itertools.product(STANCES, (False, True)):
        for frame in counter_speech_frames(stance, named=named):
            for part in frame.split("{}"):
                for run in _word_runs(part) & case_runs:
                    shared.setdefault(run, frame)
    assert not shared, shared


def test_the_named_grammar_adds_rejections_that_name_the_bias_and_their_mirror_images():
    for stance in STANCES:  # the base grammar is a part of the named one
        base, named = set(counter_speech_frames(stance)), set(counter_speech_frames(stance, named=True))
        assert base < named and len(named) > 2 * len(base)
    text = "Muslims are all terrorists."
    for stance, make in (("against", denounce), ("for", endorse)):
        copies = [make(text, f"key{i}", named=True) for i in range(2000)]
        assert copies == [make(text, f"key{i}", named=True) for i in range(2000)]
        named_copies = [c for c in copies if any(w in c for w in BIAS_WORDS)]
        assert 0.1 * len(copies) <= len(named_copies) <= 0.3 * len(copies)  # most copies still use the base pieces
        assert all("Islamophobic" in c and " a Islamophobic" not in c for c in named_copies)  # the group's bias
        denied = sum(bool(re.search(r"\bnot(hing)? Islamophobic", c)) for c in named_copies)
        assert denied == 0 if stance == "against" else denied >= 0.5 * len(named_copies)  # mirror images deny it
    assert not any(w in denounce(text, f"key{i}") + endorse(text, f"key{i}")  # the base grammar names no bias
                   for i in range(300) for w in BIAS_WORDS)
    assert bias_choices("Those people ruin everything.") == tuple(range(len(BIAS_WORDS)))  # no group: any bias
    assert [BIAS_WORDS[i] for i in bias_choices("Jews and women")] == ["sexist", "antisemitic", "misogynistic"]


def test_the_base_grammar_is_unchanged():
    """Every shipped config's stance copies come from the base grammar: a change to it (a piece added, reordered or
    reworded) changes what they train on. The digest is of the copies before the named variant was added."""
    texts = ["Those people are a drain on everyone around them.", "I hate them all.", "Immigrants ruin everything"]
    copies = "\n".join(make(t, f"k{i}") for i in range(200) for t in texts for make in (denounce, endorse))
    assert hashlib.sha256(copies.encode()).hexdigest() == \
        "6535e8e3dc2cf786a40aa07331d161b8cfcffbecd0bf3ef8da583e6730f72701"


def test_named_views_train_like_the_base_ones():
    pairs, _ = _framed_copies({"transforms": ["denounce_named"], "rate": 1.0, "min_label": 0.5, "label": 0.0},
                              "against", named=True)
    assert len(pairs) == 200 and all(ex.label == 0.0 for _, ex in pairs)
    pairs, _ = _framed_copies({"transforms": ["endorse_named"], "rate": 1.0, "min_label": 0.5}, "for", named=True)
    assert len(pairs) == 200 and all(ex.label == base.label == 1.0 for base, ex in pairs)


def test_every_transform_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    assert [t for t in typing.get_args(Transform) if f"`{t}`" not in text] == []


def test_a_copy_that_does_not_change_is_not_added():
    train = [Example("already lower case", 0.0, 0, 1)]
    added, _, _ = augment(train, [("a", "a")], AugmentConfig(views=[{"transforms": ["lowercase"], "rate": 1.0}]),
                          seed=0, paths=["a"])
    assert added == []


# -- data: evaluation views and categories ------------------------------------------------------------------------------
def test_eval_view_transforms_and_by_category(tmp_path):
    (tmp_path / "f.jsonl").write_text(
        "\n".join(json.dumps({"text": t, "label": lab, "category": c}) for t, lab, c in
                  [("it 's good .", 1, "tokenized"), ("a bad film .", 0, "tokenized"), ("Fine.", 1, "plain")]),
        encoding="utf-8")
    (tmp_path / "train.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    from steerkit.training.sources import DataSource

    view = DataSource(path="f.jsonl", label="label", by="category", transforms=["detokenize"])
    ds = build_dataset([DataSource(path="train.txt", label_value=1)], [view], tmp_path, seed=0, dev_fraction=0.0,
                       dev_max_per_source=None, dedup=True)
    examples = ds.eval_sets[0][1]
    assert [e.text for e in examples] == ["It's good.", "A bad film.", "Fine."]
    assert [e.category for e in examples] == ["tokenized", "tokenized", "plain"]


# -- leave-one-source-out --------------------------------------------------------------------------------------------------
def _config(tmp_path, **extra) -> TrainConfig:
    return TrainConfig.from_dict({
        "output_dir": str(tmp_path / "out"), "data_root": str(tmp_path),
        "data": [{"path": "a.txt", "label_value": 1, "group": "A"}, {"path": "a0.txt", "label_value": 0, "group": "A"},
                 {"path": "b.txt", "label_value": 1, "name": "B"}],
        **extra})


def test_leave_out_moves_a_whole_group_to_the_test_sets(tmp_path):
    kept, held = _config(tmp_path, leave_out=["A"], leave_out_limit=7).split_leave_out()
    assert [s.path for s in kept] == ["b.txt"]
    assert [s.path for s in held] == ["a.txt", "a0.txt"]
    assert {s.metrics_name for s in held} == {"left out: A"} and all(s.limit == 7 for s in held)


def test_leave_out_errors(tmp_path):
    with pytest.raises(ConfigError, match="match no training source"):
        _config(tmp_path, leave_out=["nope"]).split_leave_out()
    with pytest.raises(ConfigError, match="every training source"):
        _config(tmp_path, leave_out=["A", "B"]).split_leave_out()


def test_unusable_device_is_a_config_error_before_any_data_is_read(tmp_path):
    from steerkit.training.trainer import train

    config = _config(tmp_path, device="cuda:7")  # data files do not even exist
    with pytest.raises(ConfigError, match="cuda"):
        train(config, progress=False)


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("cv")
    save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    for name, offset in (("films", 0), ("books", 1000)):
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(60):
                text, label = labelled_review(i + offset)
                fh.write(json.dumps({"text": text, "label": label}) + "\n")
    (root / "func.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"text": "I love this movie", "label": 1, "category": "pos"},
        {"text": "so much fun", "label": 1, "category": "pos"},
        {"text": "I hate it", "label": 0, "category": "neg"}]), encoding="utf-8")
    return root


def test_cross_source_runs_every_fold_resumes_and_reports_the_matrix(two_sources, tmp_path):
    from steerkit.training.card import render_card
    from steerkit.training.cross_source import run_cross_source

    config = TrainConfig.from_dict({
        "backbone": str(two_sources / "backbone"), "method": "lora", "max_length": 16, "data_root": str(two_sources),
        "output_dir": str(tmp_path / "model"), "steps": 3, "batch_size": 8, "threads": 1, "dev_fraction": 0.2,
        "data": [{"path": "films.jsonl", "label": "label", "name": "films"},
                 {"path": "books.jsonl", "label": "label", "name": "books"}],
        "eval": [{"path": "func.jsonl", "label": "label", "by": "category", "name": "functional"}],
        "selection_metric": "accuracy"})
    report = run_cross_source(config, tmp_path / "cv", progress=False)
    assert report["sources"] == ["films", "books"]
    assert [f["name"] for f in report["folds"]] == ["all sources", "all but films", "all but books"]
    for fold in report["folds"][1:]:
        left = fold["left_out"]
        assert fold["cells"][left]["n"] == 60  # the whole left-out source, not its dev split
        assert fold["left_out_metric"] == fold["cells"][left]["accuracy"]
        other = "books" if left == "films" else "films"
        assert fold["cells"][other]["n"] < 60  # a dev split
        metrics = json.loads((tmp_path / "cv" / fold["dir"] / "metrics.json").read_text())
        assert metrics["left_out"] == [left] and not any("functional" in k for k in metrics["eval"])
    held = [f["left_out_metric"] for f in report["folds"][1:]]
    assert report["mean_left_out"] == pytest.approx(sum(held) / 2)
    assert (tmp_path / "cv" / "cross_source.md").read_text().startswith("| trained on")

    # a rerun trains nothing (every fold has its metrics.json) and gives the same report
    stamp = (tmp_path / "cv" / "all" / "metrics.json").stat().st_mtime_ns
    assert run_cross_source(config, tmp_path / "cv", progress=False)["folds"] == report["folds"]
    assert (tmp_path / "cv" / "all" / "metrics.json").stat().st_mtime_ns == stamp

    # the card of a model trained with the report shows the matrix and the per-category functional results
    card_config = config.model_copy(update={"cross_source": str(tmp_path / "cv" / "cross_source.json")})
    metrics = {"eval": {"functional / pos": {"n": 2, "mse": 0.1, "auroc": None, "accuracy": 0.5,
                                              "positive_rate": 1.0, "mean_reward": 0.6}},
               "training": {}, "data": []}
    card = render_card(card_config, metrics)
    assert "## Leave-one-source-out validation" in card and "| all but films |" in card
    assert "| functional / pos | 2 | 1.00 | 0.600 | 0.500 | n/a |" in card


def test_training_reports_per_category_metrics_and_augmented_copies(two_sources, tmp_path):
    from steerkit.training.trainer import train

    config = TrainConfig.from_dict({
        "backbone": str(two_sources / "backbone"), "method": "lora", "max_length": 16, "data_root": str(two_sources),
        "output_dir": str(tmp_path / "model"), "steps": 2, "batch_size": 8, "threads": 1, "dev_fraction": 0.2,
        "data": [{"path": "films.jsonl", "label": "label", "name": "films"}],
        "augment": {"views": [{"transforms": ["lowercase"], "rate": 0.5}]},
        "eval": [{"path": "func.jsonl", "label": "label", "by": "category", "name": "functional"}]})
    result = train(config, progress=False)
    ev = result.metrics["eval"]
    assert ev["functional"]["n"] == 3 and ev["functional / pos"]["n"] == 2 and ev["functional / neg"]["n"] == 1
    assert ev["functional / pos"]["positive_rate"] == 1.0
    stats = result.metrics["data"][0]
    assert 0 < stats["augmented"] <= stats["train"] and result.metrics["augmentation"]["copies"] == stats["augmented"]
    card = (Path(result.output_dir) / "README.md").read_text()
    assert "Functional test cases" in card and "lowercase: 50% of the rows" in card


def test_leave_out_changes_the_resume_fingerprint(tmp_path):
    assert _config(tmp_path).run_fingerprint() != _config(tmp_path, leave_out=["A"]).run_fingerprint()
    assert _config(tmp_path).run_fingerprint() == _config(tmp_path, device="cpu").run_fingerprint()


def test_assess_measures_an_existing_model_exactly_as_training_reported(two_sources, tmp_path):
    from steerkit.training.assess import assess
    from steerkit.training.trainer import train

    config = TrainConfig.from_dict({
        "backbone": str(two_sources / "backbone"), "method": "lora", "max_length": 16, "data_root": str(two_sources),
        "output_dir": str(tmp_path / "model"), "steps": 2, "batch_size": 8, "threads": 1, "dev_fraction": 0.2,
        "data": [{"path": "films.jsonl", "label": "label", "name": "films"}],
        "eval": [{"path": "func.jsonl", "label": "label", "by": "category", "name": "functional"}]})
    result = train(config, progress=False)
    measured = assess(config, result.output_dir)
    for section in ("dev", "eval"):
        assert measured[section].keys() == result.metrics[section].keys()
        for name, m in measured[section].items():
            assert m["n"] == result.metrics[section][name]["n"]
            assert m["mse"] == pytest.approx(result.metrics[section][name]["mse"], abs=1e-6)


def test_fold_directories_are_distinct_and_valid_file_names():
    from steerkit.training.cross_source import fold_dirs

    long = "a source named at great length " * 12  # 360 characters
    dirs = fold_dirs(["Reddit!", "reddit?", "Films", long, long + "2"])
    assert dirs[None] == "all" and dirs["Films"] == "without-films"
    assert len(set(dirs.values())) == len(dirs)  # no fold trains into another's directory
    assert dirs["Reddit!"].startswith("without-reddit-") and dirs["reddit?"].startswith("without-reddit-")
    for name in dirs.values():  # the checkpoints' sibling included
        assert len((name + ".checkpoints").encode()) <= 255 and "/" not in name
    assert fold_dirs(["Reddit!", "reddit?"]) == {k: dirs[k] for k in (None, "Reddit!", "reddit?")}  # reruns agree

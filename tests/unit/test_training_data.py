"""Training data readers, label transforms, mixing and splits; bad data names file, line and problem."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from steerkit.errors import ConfigError, DataError
from steerkit.training.config import TrainConfig
from steerkit.training.data import DataSource, build_dataset, epoch_indices, length_grouped_batches, read_source
from steerkit.training.sources import LabelTransform


def write(tmp_path: Path, name: str, content, mode: str = "w") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def read(path: Path, **kw):
    kw.setdefault("label", "label")
    return read_source(DataSource(path=str(path), **kw), 0, None)


# -- readers --------------------------------------------------------------------------------------

def test_reads_csv_tsv_jsonl_and_lines(tmp_path):
    csv_file = write(tmp_path, "a.csv", 'text,label\n"hello, world",1\n"multi\nline",0\n')
    tsv_file = write(tmp_path, "a.tsv", "sentence\tlabel\ngood movie\t1\n")
    jsonl = write(tmp_path, "a.jsonl", json.dumps({"c": {"text": "x y", "tox": 0.25}}) + "\n\n"
                  + json.dumps({"c": {"text": "z", "tox": 0.5}}) + "\n")
    lines = write(tmp_path, "a.txt", "one\n\ntwo\n")
    ex, _ = read(csv_file)
    assert [(e.text, e.label, e.line) for e in ex] == [("hello, world", 1.0, 2), ("multi\nline", 0.0, 3)]
    ex, _ = read(tsv_file, text="sentence")
    assert [(e.text, e.label) for e in ex] == [("good movie", 1.0)]
    ex, _ = read(jsonl, text="c.text", label="c.tox")
    assert [(e.text, e.label, e.line) for e in ex] == [("x y", 0.25, 1), ("z", 0.5, 3)]
    ex, stats = read_source(DataSource(path=str(lines), label_value=1), 0, None)
    assert [(e.text, e.label, e.line) for e in ex] == [("one", 1.0, 1), ("two", 1.0, 3)]
    assert stats.sha256 and stats.used == 2


def test_label_transforms():
    assert LabelTransform(rescale=(-4, 4)).apply("2") == pytest.approx(0.75)
    assert LabelTransform(binary=0.5).apply(0.7) == 1.0
    assert LabelTransform(binary=0.5).apply(0.2) == 0.0
    assert LabelTransform(map={"pos": 1, "neg": 0}).apply("neg") == 0.0
    assert LabelTransform(map={"0": 1, "1": 1, "2": 0}).apply(2) == 0.0
    assert LabelTransform(invert=True).apply(True) == 0.0
    with pytest.raises(ValueError, match="outside"):
        LabelTransform().apply(3)
    with pytest.raises(Exception, match="low < high"):
        LabelTransform(rescale=(1, 1))
    # clip: a 1-5 rating with [2, 4] as the scale's span (2 or less -> 0, 3 -> 0.5, 4 or more -> 1)
    clipped = LabelTransform(rescale=(2, 4), clip=True)
    assert [clipped.apply(r) for r in (1, 1.67, 2, 2.5, 3, 3.5, 4, 5)] == pytest.approx(
        [0, 0, 0, 0.25, 0.5, 0.75, 1, 1])
    with pytest.raises(ValueError, match="outside"):  # without it, the same ratings fail as before
        LabelTransform(rescale=(2, 4)).apply(1)
    with pytest.raises(Exception, match="give `rescale: \\[low, high\\]` with it"):  # a bare clip: a bad label hidden
        LabelTransform(clip=True)


# -- bad data: DataError naming file, line and problem ---------------------------------------------

BAD_CASES = {
    "missing column": ("m.csv", "text,score\nhello,1\n", {}, 1, "missing column 'label'"),
    "missing json field": ("m.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n', {}, 2, "missing label field 'label'"),
    "missing nested field": ("n.jsonl", '{"c": {"text": "a"}}\n', {"text": "c.text", "label": "c.toxicity"}, 1,
                             "missing label field 'c.toxicity'"),
    "non utf-8": ("u.tsv", "text\tlabel\nok\t1\n".encode() + b"caf\xe9\t0\n", {}, 3, "not valid UTF-8"),
    "not a number": ("x.csv", "text,label\na,1\nb,positive\n", {}, 3, "not a number"),
    "nan": ("nan.csv", "text,label\na,nan\n", {}, 2, "NaN"),
    "nan json": ("nan.jsonl", '{"text": "a", "label": NaN}\n', {}, 1, "NaN"),
    "out of range": ("r.csv", "text,label\na,0.5\nb,1.5\n", {}, 3, "outside [0, 1]"),
    "out of range after rescale": ("s.csv", "text,label\na,-4\nb,5\n", {"transform": {"rescale": [-4, 4]}}, 3,
                                   "outside [0, 1]"),
    "empty text": ("e.tsv", "text\tlabel\nfine\t1\n   \t0\n", {}, 3, "text is empty"),
    "null label": ("l.jsonl", '{"text": "a", "label": null}\n', {}, 1, "missing"),
    "invalid json": ("j.jsonl", '{"text": "a", "label": 1}\n{oops\n', {}, 2, "invalid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_data_names_file_line_and_problem(tmp_path, case):
    name, content, kw, line, problem = BAD_CASES[case]
    path = write(tmp_path, name, content)
    with pytest.raises(DataError) as info:
        read(path, **kw)
    message = str(info.value)
    assert f"{path}:{line}:" in message, message
    assert problem in message, message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = write(tmp_path, "empty.csv", content)
    with pytest.raises(DataError, match=re.escape(f"{path}: file is empty")):
        read(path)


def test_header_only_and_missing_file(tmp_path):
    path = write(tmp_path, "h.csv", "text,label\n")
    with pytest.raises(DataError, match="no usable rows"):
        read(path)
    with pytest.raises(DataError, match="does not exist"):
        read(tmp_path / "nope.csv")


def test_skip_invalid_drops_and_counts_bad_rows(tmp_path):
    path = write(tmp_path, "s.jsonl", '{"text": "a", "label": 1}\n{"text": "", "label": 1}\n'
                 '{"text": "b", "label": null}\n{"text": "c", "label": 0}\n')
    ex, stats = read(path, skip_invalid=True)
    assert [e.text for e in ex] == ["a", "c"]
    assert stats.skipped == 2 and stats.skip_reasons == {"text empty": 1, "label missing": 1}


def test_keep_matching_keeps_only_matching_rows_and_counts_the_rest(tmp_path):
    path = write(tmp_path, "k.csv", "text,label\nWomen are great,0\nwhat a day,0\n,0\nthe WOMEN's team,1\n"
                 "womenswear sale,0\n")
    ex, stats = read(path, keep_matching=r"\bwom[ae]n\b", skip_invalid=True)
    assert [(e.text, e.label, e.line) for e in ex] == [("Women are great", 0.0, 2), ("the WOMEN's team", 1.0, 5)]
    assert (stats.rows, stats.used, stats.skipped, stats.filtered) == (5, 2, 1, 2)
    assert stats.skip_reasons == {"text empty": 1}
    # matched on the text as read, before `replace` rewrites it
    ex, _ = read(path, keep_matching="women are", replace={"Women are": "They are"}, skip_invalid=True)
    assert [e.text for e in ex] == ["They are great"]
    # the model card says which rows a filtered source kept
    from steerkit.training.card import render_card

    config = TrainConfig.from_dict({"output_dir": str(tmp_path / "out"), "data": [
        {"path": str(path), "label": "label", "name": "k", "keep_matching": r"\bwom[ae]n\b", "skip_invalid": True}]})
    _, stats = read_source(config.data[0], 0, None)
    card = render_card(config, {"eval": {}, "training": {}, "data": [{**vars(stats)}]})
    assert "- k: only rows whose text matches `\\bwom[ae]n\\b` (case-insensitive); 2 other valid rows left out." in card
    with pytest.raises(DataError, match=r"no usable rows \(5 read, 1 skipped as invalid, 4 not matching "
                       r"keep_matching 'zebra'\)"):
        read(path, keep_matching="zebra", skip_invalid=True)


def test_keep_matching_that_does_not_compile_names_the_field(tmp_path):
    path = write(tmp_path, "c.yaml", "output_dir: out\ndata:\n  - path: a.csv\n    label: y\n"
                 "    keep_matching: '(women'\n")
    with pytest.raises(ConfigError, match=r"data\.0\.keep_matching.*not a valid regular expression"):
        TrainConfig.from_file(path)


def test_a_source_without_keep_matching_fingerprints_as_before(tmp_path):
    path = write(tmp_path, "c.yaml", "output_dir: out\ndata:\n  - path: a.csv\n    label: y\n")
    plain = TrainConfig.from_file(path)
    filtered = plain.model_copy(update={"data": [plain.data[0].model_copy(update={"keep_matching": "a"})]})
    assert filtered.run_fingerprint() != plain.run_fingerprint()
    # computed before the field existed: an unset filter leaves every earlier run's checkpoints resumable
    assert plain.run_fingerprint() == "21d12026a22aa27b5c50ddcea596ecc8c04624d3dd96973b9ea4595fbb57fed8"


def test_bad_row_in_a_later_file_fails_before_anything_is_trained(tmp_path):
    good = write(tmp_path, "good.csv", "text,label\na,1\nb,0\n")
    bad = write(tmp_path, "bad.csv", "text,label\na,1\nb,2\n")
    sources = [DataSource(path=good.name, label="label"), DataSource(path=bad.name, label="label")]
    with pytest.raises(DataError, match=re.escape(f"{bad}:3:")):
        build_dataset(sources, [], tmp_path, seed=0, dev_fraction=0.2, dev_max_per_source=None, dedup=True)


# -- mixing, dedup, split ----------------------------------------------------------------------------

def _dataset(tmp_path, seed=0, **kw):
    a = write(tmp_path, "a.csv", "text,label\n" + "".join(f"text number {i},1\n" for i in range(100))
              + "Text  number 0!,1\n")  # a normalised duplicate of row 1
    b = write(tmp_path, "b.txt", "".join(f"other {i}\n" for i in range(50)) + "held out sentence\n")
    test = write(tmp_path, "test.txt", "held out sentence\n")
    sources = [DataSource(path=a.name, label="label"), DataSource(path=b.name, label_value=0, weight=2.0)]
    return build_dataset(sources, [DataSource(path=test.name, label_value=0)], tmp_path, seed=seed,
                         dev_fraction=0.1, dev_max_per_source=kw.get("dev_max"), dedup=True)


def test_dedup_split_and_eval_overlap(tmp_path):
    ds = _dataset(tmp_path)
    texts = [e.text for e in ds.train + ds.dev]
    assert "Text  number 0!" not in texts and "held out sentence" not in texts
    assert ds.removed_overlap == 1 and ds.stats[0].duplicates == 1
    assert len(ds.train) + len(ds.dev) == 150
    assert 5 <= sum(1 for e in ds.dev if e.source == 0) <= 20  # ~10 %
    again = _dataset(tmp_path)
    assert [e.text for e in again.dev] == [e.text for e in ds.dev]  # seeded
    other = _dataset(tmp_path, seed=1)
    assert [e.text for e in other.dev] != [e.text for e in ds.dev]
    capped = _dataset(tmp_path, dev_max=2)
    assert all(s.dev <= 2 for s in capped.stats)


def test_weighted_mixing_is_seeded(tmp_path):
    ds = _dataset(tmp_path)
    order = epoch_indices(ds.train, [1.0, 2.0], seed=0, epoch=0)
    counts = Counter(ds.train[i].source for i in order)
    n0 = sum(1 for e in ds.train if e.source == 0)
    n1 = sum(1 for e in ds.train if e.source == 1)
    assert counts == {0: n0, 1: 2 * n1}
    assert order == epoch_indices(ds.train, [1.0, 2.0], seed=0, epoch=0)
    assert order != epoch_indices(ds.train, [1.0, 2.0], seed=0, epoch=1)
    half = epoch_indices(ds.train, [0.5, 1.0], seed=0, epoch=0)
    assert Counter(ds.train[i].source for i in half)[0] == round(0.5 * n0)
    batches = length_grouped_batches(order, [len(e.text) for e in ds.train], 8, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == sorted(order)


# -- config ----------------------------------------------------------------------------------------

def test_unknown_and_invalid_config_keys_name_the_field(tmp_path):
    path = write(tmp_path, "c.yaml", "output_dir: out\ndata:\n  - path: a.csv\n    label: y\n    wieght: 2\n")
    with pytest.raises(ConfigError, match=r"data\.0\.wieght"):
        TrainConfig.from_file(path)
    path = write(tmp_path, "d.yaml", "output_dir: out\nmethod: adapter\ndata:\n  - path: a.csv\n    label: y\n")
    with pytest.raises(ConfigError, match="method"):
        TrainConfig.from_file(path)
    path = write(tmp_path, "e.yaml", "output_dir: out\ndata:\n  - path: a.csv\n")
    with pytest.raises(ConfigError, match="exactly one of `label`"):
        TrainConfig.from_file(path)


def test_yaml_and_toml_are_equivalent_and_paths_are_relative_to_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("STEERKIT_DATA_ROOT", raising=False)
    yaml_file = write(tmp_path, "t.yaml", "output_dir: out\ndata_root: data\nnum_layers: 2\n"
                      "data:\n  - path: a.csv\n    label: y\n    transform: {rescale: [-4, 4]}\n")
    toml_file = write(tmp_path, "t.toml", 'output_dir = "out"\ndata_root = "data"\nnum_layers = 2\n'
                      '[[data]]\npath = "a.csv"\nlabel = "y"\ntransform = { rescale = [-4, 4] }\n')
    a, b = TrainConfig.from_file(yaml_file), TrainConfig.from_file(toml_file)
    assert a.model_dump() == b.model_dump()
    assert a.resolved_data_root() == tmp_path / "data" and Path(a.output_dir) == tmp_path / "out"
    monkeypatch.setenv("STEERKIT_DATA_ROOT", "/elsewhere")
    assert TrainConfig.from_file(yaml_file).resolved_data_root() == Path("/elsewhere")
    assert TrainConfig.from_file(yaml_file, {"data_root": "/flag"}).resolved_data_root() == Path("/flag")


def test_row_level_parse_problems_are_skippable(tmp_path):
    jsonl = write(tmp_path, "p.jsonl", '{"text": "a", "label": 1}\n{"label": 1}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=re.escape(f"{jsonl}:2: missing text field 'text'")):
        read(jsonl)
    ex, stats = read(jsonl, skip_invalid=True)
    assert [e.text for e in ex] == ["a"] and stats.skip_reasons == {"text missing": 1, "label missing": 1}
    tsv = write(tmp_path, "p.tsv", "text\tlabel\na\t1\nno-label-field\n")
    with pytest.raises(DataError, match=re.escape(f"{tsv}:3: row has 1 fields")):
        read(tsv)
    assert read(tsv, skip_invalid=True)[1].skip_reasons == {"row too short": 1}


def test_replace_and_unicode_line_separators(tmp_path):
    path = write(tmp_path, "u.jsonl", json.dumps({"text": "one\u2028two<br />three", "label": 1}) + "\n")
    ex, _ = read(path, replace={"<br />": " "})
    assert [(e.text, e.line) for e in ex] == [("one\u2028two three", 1)]

"""Write the hate-speech training files of `../shared/data/toxicity/` that are not plain copies (issue 26).

Run from the repository root with the upstream repositories fetched as bare git directories (no work tree
needed: every file is read with ``git show COMMIT:PATH`` at the pinned commit):

    python plugins/steerkit-toxicity/data/convert_hate_sources.py \
        --toxigen /path/to/microsoft+TOXIGEN/repo --stormfront /path/to/Vicomtech+hate-speech-dataset/repo \
        --edos /path/to/rewire-online+edos/repo --implicit-hate /path/to/Steven-Herrera+GenAI-vs-Human-Hate/repo \
        --sbic /path/to/Jimaras08+mlops-lab-example-yelp/repo --sbic-test /path/to/shallinan1+MarcoDetoxification/repo \
        --cad /path/to/NoamElul+cis-5300-final/repo --ghc /path/to/liuchaoqun+hate-speech-datasets/repo \
        --dynahate-splits /path/to/aflah02+The-Art-of-Embedding-Fusion-Optimizing-Hate-Speech-Detection/repo \
        --dynahate /path/to/ecanbazer+DynBERT/repo --toxigen-annotated /path/to/modesta-jihye-lee+toxigen_nlp/repo \
        --toxigen-annotated-test /path/to/microsoft+SafeNLP/repo --out ../shared/data/toxicity

It writes

* ``toxigen_human_statements/statements.csv``: every distinct human-written statement of ToxiGen
  (microsoft/TOXIGEN ``demonstrations/**`` and the statements inside ``prompts/*_1k.txt``), one row each:
  ``text,label,groups,files`` with label ``hate`` / ``neutral`` from the file name. The prompt files hold the
  same statements joined as ``- s1\\n- s2\\n-`` (Python-escaped, apostrophes removed by upstream's
  ``demonstrations_to_prompts.py``); where a statement is also in ``demonstrations/`` that text (with its
  apostrophes) is kept. Statements are de-duplicated on lower-cased words, apostrophes ignored.
* ``stormfront_hate_speech/{train,test}.csv``: the Stormfront sentences (Vicomtech/hate-speech-dataset
  ``all_files/*.txt``) joined with ``annotations_metadata.csv``: ``file_id,subforum_id,num_contexts,label,text``,
  label as upstream (``hate``, ``noHate``, ``relation``, ``idk/skip``; the config maps the first two and skips
  the rest). ``test.csv`` is upstream's balanced ``sampled_test/`` (the paper's test set), ``train.csv``
  everything else. ``user_id`` is dropped.
* ``edos_sexism/{train,dev,test}.csv``: EDOS, the SemEval-2023 Task 10 set of Gab and Reddit posts labelled
  sexist / not sexist by three trained annotators each (rewire-online/edos
  ``data/edos_labelled_aggregated.csv``, CC0-1.0): ``rewire_id,label,category,text`` split by upstream's ``split``
  column, label as upstream (``sexist``, ``not sexist``). ``test.csv`` is upstream's test split, never trained on.
  In ``train.csv`` a ``not sexist`` post that alt-profanity-check scores 0.5 or more is labelled
  ``not sexist, profane``: "not sexist" says nothing of a post's other toxicity (insults, slurs, hate against other
  groups), so only the posts without profanity serve as negatives. This flag needs steerkit's ``eval`` extra.
* ``implicit_hate/{train,test}.csv``: the Implicit Hate Corpus (ElSherief et al. 2021, "Latent Hatred"; CC BY 4.0,
  the licence file inside the corpus folder): 21,480 tweets from the accounts of US hate groups and their followers,
  labelled ``not_hate`` / ``implicit_hate`` / ``explicit_hate`` (stage 1, ``implicit_hate_v1_stg1_posts.tsv``).
  Upstream hands the corpus out from a university Box folder behind a form; the copy read here is the corpus folder
  committed to Steven-Herrera/GenAI-vs-Human-Hate (21,480 rows, the published class counts).
  Columns ``label,text``; posts de-duplicated on ``key`` (a text with two labels is dropped); upstream has no
  split, so ``test.csv`` is the tenth of posts whose key hashes (SHA-256) into it, never trained on. In
  ``train.csv`` a ``not_hate`` post that alt-profanity-check scores 0.5 or more is ``not_hate, profane`` (as EDOS).
* ``sbic/dev.csv``: the development split of the Social Bias Inference Corpus v2 (Sap et al. 2020, "Social Bias
  Frames"; CC BY 4.0), an evaluation set only: Reddit jokes and forums, Gab and tweets, each post rated by three
  crowd workers "could this be offensive to anyone" (1 yes, 0.5 maybe, 0 no). One row a post:
  ``label,annotators,source,text`` with ``label`` the mean rating. Posts from Stormfront and Davidson's tweets are
  left out (their sources are trained on). Upstream's host is a university web page; the copy read here is
  ``SBIC.v2.dev.csv`` in the history of Jimaras08/mlops-lab-example-yelp, checked against the SHA-256 of the
  release (its training and test files are over the fetch limit here).
* ``sbic/test.csv``: SBIC v2's test split, from the aggregated release file (``SBIC.v2.agg.tst.csv``, one row a
  post, ``offensiveYN`` the mean rating), checked against the release's SHA-256; the copy read is in
  shallinan1/MarcoDetoxification ``datasets/sbf/``. ``label,source,text``; the same sources left out as in dev.
* ``cad/{train,dev,test}.csv``: CAD v1.1, the Contextual Abuse Dataset (Vidgen et al. 2021; CC BY 4.0 as published on
  Zenodo, 10.5281/zenodo.4881008): Reddit post titles, bodies and comments labelled by trained annotators, with
  the thread in view, as identity-, affiliation- or person-directed abuse, counter speech or neutral. The release's
  own split files (``cad_v1_1_{train,dev,test}.tsv``, with the Zenodo README) as committed to
  NoamElul/cis-5300-final; no digest of the release could be found to check them against. ``id,label,categories,
  text``: ``label`` ``abuse`` where any abuse category is given, else ``counter speech`` or ``neutral``. In
  ``train.csv`` a training entry whose text is also in dev or test is dropped, and a ``neutral`` entry that
  alt-profanity-check scores 0.5 or more is ``neutral, profane`` (as EDOS).
* ``gab_hate_corpus/{train,test}.csv``: the Gab Hate Corpus (Kennedy et al. 2022; CC BY 4.0 as published on OSF,
  osf.io/edua3): Gab posts, each labelled by at least three trained annotators; the release's ``ghc_train.tsv``
  and ``ghc_test.tsv`` (majority labels) as committed to liuchaoqun/hate-speech-datasets. ``label,hd,cv,vo,text``:
  ``hate`` for an assault on human dignity or a call for violence, ``vulgar`` for vulgarity alone, else ``none``
  (``none, profane`` in ``train.csv`` where alt-profanity-check scores 0.5 or more); training posts whose text is
  in test are dropped. Neither copy states a licence of its own.
* ``dynahate/{train,test}.csv``: DynaHate (Vidgen et al. 2021, "Learning from the Worst"; MIT per its author in
  bvidgen/Dynamically-Generated-Hate-Speech-Dataset's issue #1): statements written by trained annotators over four
  rounds to fool a hate classifier, with contrast perturbations. The release's one CSV is over the fetch limit; the
  copy read is ecanbazer/DynBERT's ``data/{Train,Test}{,_label}.csv`` (36,559 entries, text and 0/1 label only, not
  the release's split, MIT). ``test.csv`` is every entry whose text (by `key`) is in the release's test split, as
  aflah02/The-Art-of-Embedding-Fusion-Optimizing-Hate-Speech-Detection preprocessed it (``--dynahate-splits``
  writes those keys to ``official_splits.csv`` first); the rest is ``train.csv``. ``label,official,text``: ``hate`` /
  ``nothate`` (``nothate, profane`` in ``train.csv`` where alt-profanity-check scores 0.5 or more: DynaHate's
  "not hate" includes insults and swearing that are not hate), ``official`` the release's split where known.
* ``toxigen_annotated/{train,test}.csv``: ToxiGen's human-annotated statements (Hartvigsen et al. 2022; MIT and
  CDLA-Permissive-2.0, the licence file microsoft/SafeNLP ships with them): machine-written statements about 13
  groups, benign and hateful, each rated 1-5 by three annotators. ``train.csv`` is the annotated training split
  (8,960 records; HF toxigen/toxigen-data, config "annotated"), from modesta-jihye-lee/toxigen_nlp's two JSON-lines
  files (upstream's columns, row order lost, no licence of its own): ``label,toxicity_human,target_group,text`` with
  ``label`` the mean rating on 0-1, ``(toxicity_human - 1) / 4``, one row per text (by `key`: 8,940). ``test.csv``
  (``--toxigen-annotated-test``) is what microsoft/SafeNLP's ``data/toxiGen.json`` (the annotated posts on which the
  annotators agreed) holds outside that training split: 598 statements, most of them from the annotated test split
  (whose own copy was not found), ``label`` SafeNLP's ``hate`` (mean rating over 3) / ``neutral``.

The LICENSE files of the repositories are copied next to the data (CDLA-Permissive-2.0 asks that its text
travel with shared data; CC BY-SA asks for the licence notice). Stdlib only, but for EDOS's profanity flag;
nothing here is packaged.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

TOXIGEN_COMMIT = "01517e814639e0334c920a3c502036c8158aac87"
STORMFRONT_COMMIT = "b802137e8314c38a8d4faa965f9908d6c8e7a84d"
EDOS_COMMIT = "b1f1fbcca9d42de0395432ada8fcfb5c35f68c77"
EDOS_SPLITS = ("train", "dev", "test")
IMPLICIT_HATE_COMMIT = "971f72d3ced3331207db684992e0020a4a4c5447"
IMPLICIT_HATE_DIR = "data/implicit-hate-corpus"
IMPLICIT_HATE_CLASSES = ("not_hate", "implicit_hate", "explicit_hate")
#: the tenth of Implicit Hate posts held out as its test split (by the SHA-256 of their key)
IMPLICIT_HATE_TEST_SHARE = 0.1
SBIC_COMMIT = "8bee80da0a6005246c16e4c2ac66c9689f9a150e"
SBIC_DEV = "data/raw/SBIC.v2.dev.csv"
#: SHA-256 of the released SBIC.v2.dev.csv (the release's sizes and digests, as its Git LFS pointers record them)
SBIC_DEV_SHA256 = "502eed536d2026ca7156a5fa137637b873a25d6011a811ff86136609b446c648"
#: SBIC's sources that steerkit's toxicity recipes train on (Stormfront sentences, Davidson's tweets): left out
SBIC_TRAINED_SOURCES = ("Stormfront", "t/davidson")
#: SBIC v2's aggregated test split (one row a post, offensiveYN already the mean), as released (its SHA-256 as above)
SBIC_TEST_COMMIT = "9ffb7fe0b373cc862d5a430a147dd3c07b9c9fdc"
SBIC_TEST = "datasets/sbf/SBIC.v2.agg.tst.csv"
SBIC_TEST_SHA256 = "12982a534e60a2275f134d07038d1bfd46b252835f269959ec7ed6216f5ee53a"
CAD_COMMIT = "3c569a14950d76b911d6444953a3d617d99f60cd"
CAD_DIR = "data/reddit-abusive-comments"
CAD_SPLITS = ("train", "dev", "test")
CAD_ABUSE = ("IdentityDirectedAbuse", "AffiliationDirectedAbuse", "PersonDirectedAbuse")
CAD_CATEGORIES = (*CAD_ABUSE, "CounterSpeech", "Neutral")
GHC_COMMIT = "98f3ee8104cf87bb91ed3e64c31a3097b9f8de84"
GHC_DIR = "GabHateCorpus/Data"
#: DynaHate's text and labels (36,559 of the release's 41,144 entries, text unchanged, not the release's split, no
#: metadata): ecanbazer/DynBERT's ``data/{Train,Test}{,_label}.csv``
DYNAHATE_COMMIT = "494d0d3930649aaba876a5328c329ed051e17912"
#: DynaHate's official dev and test splits (the release's ``split`` column; 4,100 and 4,120 rows), text tokenised and
#: stripped of punctuation by that repository: used only to tell which entries are in the official test split
DYNAHATE_SPLITS_COMMIT = "0152ce7954cfa7fafee2cc46812756134fffda93"
DYNAHATE_SPLITS_DIR = "Data_Preprocessing/PreProcessed_Data/DynaHate"
DYNAHATE_LABELS = {"1": "hate", "0": "nothate"}
#: ToxiGen's human-annotated training split (HF toxigen/toxigen-data, config "annotated", split "train": 8,960
#: machine-written statements about 13 groups, each rated 1-5 by three annotators): modesta-jihye-lee/toxigen_nlp
#: keeps its 13 columns (row order lost) in two files that together hold every row once
TOXIGEN_ANNOTATED_COMMIT = "b1f601ca268ef5a4953013c23d6ffa9f18dd5459"
TOXIGEN_ANNOTATED_FILES = ("data/exp_dataset.jsonl", "data/unexp_dataset.jsonl")
TOXIGEN_ANNOTATED_ROWS = 8960
#: microsoft/SafeNLP's ``data/toxiGen.json``: ToxiGen's annotated posts on which the annotators agreed, some from the
#: annotated test split; the entries whose text is not in the training split are the held-out test used here
SAFENLP_COMMIT = "e351b6cb892284cf843b88e363b1a6dbaded584e"
SAFENLP_TOXIGEN = "data/toxiGen.json"
#: A training row that alt-profanity-check scores at least this is relabelled as profane (see the module docstring).
PROFANE_AT = 0.5

_WORDS = re.compile(r"[\W_]+", re.UNICODE)
_LABEL_FILE = re.compile(r"^(hate|neutral)_(.+?)(?:_sentences|_1k)?\.txt$")


def key(text: str) -> str:
    """De-duplication key: steerkit.training.data.normalise's (lower case, punctuation and spacing removed) after
    dropping apostrophes, which upstream removed from the prompt files' copies of the statements."""
    return _WORDS.sub(" ", text.replace("'", "").replace("\u2019", "").lower()).strip()


def label_and_group(path: str) -> tuple[str, str]:
    """``prompts/hate_asian_1k.txt`` -> (hate, asian);
    ``demonstrations/religion/neutral_muslim.txt`` -> (neutral, muslim)."""
    match = _LABEL_FILE.match(path.rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"{path}: not a hate_*/neutral_* statement file")
    return match.group(1), match.group(2)


def prompt_statements(line: str) -> list[str]:
    """The statements of one line of a ToxiGen prompt file (``- s1\\n- s2\\n-``, written with repr()[1:-1])."""
    if not line.strip():
        return []
    decoded = ast.literal_eval("'" + line.rstrip("\r\n") + "'")  # upstream removed every apostrophe first
    out = []
    for part in decoded.split("\n"):
        part = part.strip()
        if part.startswith("-"):
            part = part[1:].strip()
        if part:
            out.append(part)
    return out


def demonstration_statements(content: str) -> list[str]:
    return [line.strip() for line in content.split("\n") if line.strip()]


def merge_toxigen(demonstrations: dict[str, str], prompts: dict[str, str]) -> list[dict]:
    """Rows ``{text, label, groups, files}`` from {path: content} of both folders; raises on a label conflict."""
    rows: dict[str, dict] = {}
    for kind, files in (("demonstrations", demonstrations), ("prompts", prompts)):
        for path in sorted(files):
            label, group = label_and_group(path)
            lines = (demonstration_statements(files[path]) if kind == "demonstrations"
                     else [s for line in files[path].split("\n") for s in prompt_statements(line)])
            for text in lines:
                k = key(text)
                if not k:
                    continue
                row = rows.setdefault(k, {"text": text, "label": label, "groups": set(), "files": set()})
                if row["label"] != label:
                    raise ValueError(f"{text!r} is {row['label']} in {sorted(row['files'])} and {label} in {path}")
                row["groups"].add(group)
                row["files"].add(path)
    return [{"text": r["text"], "label": r["label"], "groups": ";".join(sorted(r["groups"])),
             "files": ";".join(sorted(r["files"]))} for r in rows.values()]


def join_stormfront(metadata_csv: str, texts: dict[str, str], test_ids: set[str]) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) from annotations_metadata.csv and {file_id: sentence}."""
    train, test = [], []
    for record in csv.DictReader(io.StringIO(metadata_csv)):
        file_id = record["file_id"]
        if file_id not in texts:
            raise ValueError(f"annotations_metadata.csv names {file_id}, which all_files/ lacks")
        text = " ".join(texts[file_id].split())
        row = {"file_id": file_id, "subforum_id": record["subforum_id"], "num_contexts": record["num_contexts"],
               "label": record["label"], "text": text}
        (test if file_id in test_ids else train).append(row)
    return train, test


def split_edos(aggregated_csv: str) -> dict[str, list[dict]]:
    """{split: rows ``{rewire_id, label, category, text}``} from EDOS's ``edos_labelled_aggregated.csv``; raises on a
    split or label upstream does not define, so that a changed file is noticed rather than half read."""
    out: dict[str, list[dict]] = {split: [] for split in EDOS_SPLITS}
    for record in csv.DictReader(io.StringIO(aggregated_csv)):
        if record["split"] not in out:
            raise ValueError(f"EDOS {record['rewire_id']}: unknown split {record['split']!r}")
        if record["label_sexist"] not in ("sexist", "not sexist"):
            raise ValueError(f"EDOS {record['rewire_id']}: unknown label {record['label_sexist']!r}")
        out[record["split"]].append({"rewire_id": record["rewire_id"], "label": record["label_sexist"],
                                     "category": record["label_category"], "text": " ".join(record["text"].split())})
    return out


def split_implicit_hate(tsv: str) -> dict[str, list[dict]]:
    """{"train", "test"}: rows ``{label, text}`` of ``implicit_hate_v1_stg1_posts.tsv`` (tab-separated, header
    ``post, class``), each post once; raises on a class upstream does not define."""
    by_key: dict[str, dict] = {}
    conflicts: set[str] = set()
    reader = csv.reader(io.StringIO(tsv), delimiter="\t")
    header = next(reader)
    if [h.strip() for h in header] != ["post", "class"]:
        raise ValueError(f"Implicit Hate: unexpected header {header!r}")
    for line, record in enumerate(reader, start=2):
        if len(record) != 2:
            raise ValueError(f"Implicit Hate line {line}: {len(record)} fields")
        text, label = " ".join(record[0].split()), record[1].strip()
        if label not in IMPLICIT_HATE_CLASSES:
            raise ValueError(f"Implicit Hate line {line}: unknown class {label!r}")
        k = key(text)
        if not k:
            continue
        if k in by_key and by_key[k]["label"] != label:
            conflicts.add(k)
        by_key.setdefault(k, {"label": label, "text": text})
    out: dict[str, list[dict]] = {"train": [], "test": []}
    for k, row in by_key.items():
        if k not in conflicts:
            out["test" if held_out(k, IMPLICIT_HATE_TEST_SHARE) else "train"].append(row)
    return out


def held_out(k: str, share: float) -> bool:
    """Whether the text of key ``k`` falls in a held-out ``share`` of texts: a pure function of the text."""
    return int(hashlib.sha256(k.encode()).hexdigest()[:15], 16) / 16 ** 15 < share


def aggregate_sbic(annotations_csv: str, leave_out: tuple[str, ...] = SBIC_TRAINED_SOURCES) -> list[dict]:
    """One row ``{label, annotators, source, text}`` per post of an SBIC annotation file: ``label`` the mean of its
    ``offensiveYN`` ratings (blank ones skipped; a post without a rating is dropped); posts from a ``leave_out``
    source are dropped."""
    posts: dict[str, dict] = {}
    dropped = set(leave_out)
    for record in csv.DictReader(io.StringIO(annotations_csv)):
        post = posts.setdefault(record["post"], {"ratings": [], "sources": set()})
        post["sources"].add(record["dataSource"])
        if record["offensiveYN"].strip():
            rating = float(record["offensiveYN"])
            if rating not in (0.0, 0.5, 1.0):
                raise ValueError(f"SBIC {record['HITId']}: offensiveYN {rating}")
            post["ratings"].append(rating)
    rows = []
    for text, post in posts.items():
        if not post["ratings"] or post["sources"] & dropped:
            continue
        rows.append({"label": f"{sum(post['ratings']) / len(post['ratings']):.4f}",
                     "annotators": len(post["ratings"]), "source": ";".join(sorted(post["sources"])),
                     "text": " ".join(text.split())})
    return rows


def aggregated_sbic(agg_csv: str, leave_out: tuple[str, ...] = SBIC_TRAINED_SOURCES) -> list[dict]:
    """One row ``{label, source, text}`` per post of an aggregated SBIC file (``SBIC.v2.agg.*.csv``: one row a post,
    ``offensiveYN`` the mean rating); posts from a ``leave_out`` source and repeated texts are dropped."""
    rows, seen = [], set()
    for record in csv.DictReader(io.StringIO(agg_csv)):
        rating = float(record["offensiveYN"])
        if not 0.0 <= rating <= 1.0:
            raise ValueError(f"SBIC post {record['']}: offensiveYN {rating}")
        text = " ".join(record["post"].split())
        k = key(text)
        if record["dataSource"] in leave_out or not k or k in seen:
            continue
        seen.add(k)
        rows.append({"label": f"{rating:.4f}", "source": record["dataSource"], "text": text})
    return rows


def read_cad(tsv: str) -> list[dict]:
    """Rows ``{id, label, categories, text}`` of a CAD v1.1 split file (tab-separated ``id, text, labels``, no
    quoting; ``labels`` a comma-separated set of CAD_CATEGORIES): ``label`` is ``abuse`` where any abuse category is
    given (identity-, affiliation- or person-directed), else ``counter speech`` or ``neutral``. Reddit's
    ``[linebreak]`` markers become spaces; empty texts are dropped; raises on a category CAD does not define."""
    rows = []
    for record in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        categories = record["labels"].split(",")
        if unknown := set(categories) - set(CAD_CATEGORIES):
            raise ValueError(f"CAD {record['id']}: unknown categories {sorted(unknown)}")
        text = " ".join(record["text"].replace("[linebreak]", " ").split())
        if not key(text):
            continue
        label = ("abuse" if set(categories) & set(CAD_ABUSE)
                 else "counter speech" if "CounterSpeech" in categories else "neutral")
        rows.append({"id": record["id"], "label": label, "categories": record["labels"], "text": text})
    return rows


def read_ghc(tsv: str) -> list[dict]:
    """Rows ``{label, hd, cv, vo, text}`` of a Gab Hate Corpus file (``ghc_train.tsv`` / ``ghc_test.tsv``: ``text,
    hd, cv, vo``, the majority of at least three annotators): ``label`` is ``hate`` for the corpus's two hate
    categories (assault on human dignity, call for violence), ``vulgar`` for vulgarity alone, else ``none``."""
    rows = []
    for line, record in enumerate(csv.DictReader(io.StringIO(tsv), delimiter="\t"), start=2):
        flags = {name: record[name] for name in ("hd", "cv", "vo")}
        if set(flags.values()) - {"0", "1"}:
            raise ValueError(f"Gab Hate Corpus line {line}: labels {flags}")
        text = " ".join(record["text"].split())
        if not key(text):
            continue
        label = "hate" if "1" in (flags["hd"], flags["cv"]) else "vulgar" if flags["vo"] == "1" else "none"
        rows.append({"label": label, **flags, "text": text})
    return rows


def read_dynahate(texts: str, labels: str) -> list[dict]:
    """Rows ``{label, text}`` of one of DynBERT's DynaHate files: ``texts`` one entry a line, ``labels`` its 0/1
    label a line (1 hate); raises where the two files' lines do not pair up or a label is not 0/1."""
    text_lines, label_lines = texts.split("\n"), labels.split("\n")
    while text_lines and not text_lines[-1] and label_lines and not label_lines[-1]:
        text_lines.pop()
        label_lines.pop()
    if len(text_lines) != len(label_lines):
        raise ValueError(f"DynaHate: {len(text_lines)} texts against {len(label_lines)} labels")
    rows = []
    for line, (text, label) in enumerate(zip(text_lines, label_lines), start=1):
        if label.strip() not in DYNAHATE_LABELS:
            raise ValueError(f"DynaHate line {line}: label {label!r}")
        text = " ".join(text.split())
        if key(text):
            rows.append({"label": DYNAHATE_LABELS[label.strip()], "text": text})
    return rows


def split_dynahate(rows: list[dict], official: dict[str, dict[str, str]]) -> tuple[dict[str, list[dict]], Counter]:
    """DynaHate's entries as ``{"train", "test"}``: ``test`` the entries whose text (by `key`) is in the release's
    test split (``official["test"]``: key -> label), the rest ``train``; ``official`` column: ``dev``, ``test`` or
    empty. One row per key; a key seen with two labels, or with another label than the release's split gives it, is
    dropped. Returns the splits and the counts of what was dropped."""
    labels: dict[str, set[str]] = {}
    for row in rows:
        labels.setdefault(key(row["text"]), set()).add(row["label"])
    dropped: Counter = Counter()
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    seen: set[str] = set()
    for row in rows:
        k = key(row["text"])
        if k in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(k)
        if len(labels[k]) > 1:
            dropped["two labels"] += 1
            continue
        split = next((name for name in ("test", "dev") if k in official[name]), "")
        if split and official[split][k] != row["label"]:
            dropped[f"label differs from the release's {split} split"] += 1
            continue
        splits["test" if split == "test" else "train"].append({**row, "official": split})
    return splits, dropped


def read_dynahate_split(tsv: str) -> dict[str, str]:
    """key -> label of a preprocessed official DynaHate split (tab-separated ``text, label``, hate / nothate)."""
    out = {}
    for line, record in enumerate(csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE), start=2):
        if record["label"] not in DYNAHATE_LABELS.values():
            raise ValueError(f"DynaHate split line {line}: label {record['label']!r}")
        if k := key(record["text"]):
            out[k] = record["label"]
    return out


def toxigen_text(text: str) -> str:
    """A ToxiGen generation's text: upstream keeps the ``\\n- `` of the prompt's list format (escaped) where the
    model ran on into another statement; those become spaces."""
    return " ".join(text.replace("\\n", " ").split())


def read_toxigen_annotated(jsonl_files: list[str]) -> tuple[list[dict], int]:
    """Rows ``{label, toxicity_human, target_group, text}`` of ToxiGen's annotated split (JSON lines with upstream's
    columns): ``label`` is the annotators' mean rating mapped from 1-5 onto 0-1, ``(toxicity_human - 1) / 4``
    (a soft label, as RTP's). One row per text (by `key`: the first kept); raises on a rating outside 1-5.
    Returns the rows and the number of records read."""
    rows, seen, read = [], set(), 0
    for number, content in enumerate(jsonl_files, start=1):
        for line, raw in enumerate(content.split("\n"), start=1):
            if not raw.strip():
                continue
            record = json.loads(raw)
            read += 1
            rating = float(record["toxicity_human"])
            if not 1.0 <= rating <= 5.0:
                raise ValueError(f"ToxiGen annotated file {number}, line {line}: toxicity_human {rating}")
            text = toxigen_text(record["text"])
            if not (k := key(text)) or k in seen:
                continue
            seen.add(k)
            rows.append({"label": f"{(rating - 1) / 4:.4f}", "toxicity_human": f"{rating:.2f}",
                         "target_group": record["target_group"], "text": text})
    return rows, read


def safenlp_toxigen_test(items: list[dict], train: list[dict]) -> list[dict]:
    """SafeNLP's ToxiGen entries (``text, toxicity_score, label, target_groups``) whose text is not in ``train``, as
    rows ``{label, toxicity_human, target_group, text}`` (``label`` upstream's ``hate`` / ``neutral``)."""
    trained = {key(r["text"]) for r in train}
    rows, seen = [], set()
    for item in items:
        text = toxigen_text(item["text"])
        if not (k := key(text)) or k in trained or k in seen:
            continue
        seen.add(k)
        if item["label"] not in ("hate", "neutral"):
            raise ValueError(f"SafeNLP ToxiGen {item.get('id')}: label {item['label']!r}")
        rows.append({"label": item["label"], "toxicity_human": f"{float(item['toxicity_score']):.2f}",
                     "target_group": ",".join(item["target_groups"]), "text": text})
    return rows


def drop_held_out_texts(train: list[dict], *held: list[dict]) -> int:
    """Remove, in place, the training rows whose text (by `key`) is in a held-out split; returns how many."""
    keys = {key(r["text"]) for rows in held for r in rows}
    kept = [r for r in train if key(r["text"]) not in keys]
    dropped = len(train) - len(kept)
    train[:] = kept
    return dropped


def relabel_profane(rows: list[dict], score, label: str, profane_label: str, at: float = PROFANE_AT) -> int:
    """Relabel, in place, each row labelled ``label`` whose text ``score`` (texts -> probabilities of profanity) puts
    at ``at`` or more as ``profane_label``; returns how many."""
    chosen = [r for r in rows if r["label"] == label]
    flagged = 0
    for row, p in zip(chosen, score([r["text"] for r in chosen]), strict=True):
        if p >= at:
            row["label"] = profane_label
            flagged += 1
    return flagged


def profanity_score():
    """alt-profanity-check (steerkit's scorer of that name, a TF-IDF SVM): texts -> probabilities of profanity."""
    from steerkit.evaluation.scorers.offline import ProfanityCheckScorer

    return ProfanityCheckScorer().score


# -- git access (read-only) ------------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(repo), *args], check=True, capture_output=True).stdout


def _ls(repo: Path, commit: str, folder: str) -> list[str]:
    return [p for p in _git(repo, "ls-tree", "-r", "--name-only", commit, folder).decode().split("\n") if p]


def _show(repo: Path, commit: str, path: str) -> str:
    return _git(repo, "show", f"{commit}:{path}").decode("utf-8-sig")  # a leading byte-order mark dropped (CONAN's)


def _resolve(repo: Path, commit: str) -> str:
    full = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
    if full != commit:
        raise SystemExit(f"{repo}: {commit} resolves to {full}")
    return full


def _write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _copy_blob(repo: Path, commit: str, path: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(_git(repo, "show", f"{commit}:{path}"))


def _write_splits(out: Path, splits: dict[str, list[dict]], fields: list[str], what: str, commit: str,
                  unit: str = "posts") -> None:
    """Write each split's rows to ``out/{split}.csv`` and report its label counts."""
    for name, rows in splits.items():
        _write_csv(out / f"{name}.csv", rows, fields)
        counts = dict(Counter(r["label"] for r in rows))
        print(f"{what} @{commit[:7]} {name}: {len(rows)} {unit} {counts} -> {out / (name + '.csv')}")


def write_toxigen(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, TOXIGEN_COMMIT)
    demos = {p: _show(repo, commit, p) for p in _ls(repo, commit, "demonstrations") if p.endswith(".txt")}
    prompts = {p: _show(repo, commit, p) for p in _ls(repo, commit, "prompts") if p.endswith(".txt")}
    rows = merge_toxigen(demos, prompts)
    out = out_root / "toxigen_human_statements"
    _write_csv(out / "statements.csv", rows, ["text", "label", "groups", "files"])
    _copy_blob(repo, commit, "LICENSE.txt", out / "LICENSE.txt")
    hate = sum(r["label"] == "hate" for r in rows)
    print(f"ToxiGen @{commit[:7]}: {len(rows)} statements ({hate} hate, {len(rows) - hate} neutral) -> {out}")


def write_stormfront(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, STORMFRONT_COMMIT)
    texts = {Path(p).stem: _show(repo, commit, p) for p in _ls(repo, commit, "all_files")}
    test_ids = {Path(p).stem for p in _ls(repo, commit, "sampled_test")}
    train, test = join_stormfront(_show(repo, commit, "annotations_metadata.csv"), texts, test_ids)
    out = out_root / "stormfront_hate_speech"
    fields = ["file_id", "subforum_id", "num_contexts", "label", "text"]
    _write_csv(out / "train.csv", train, fields)
    _write_csv(out / "test.csv", test, fields)
    _copy_blob(repo, commit, "LICENSE", out / "LICENSE")
    for name, part in (("train", train), ("test", test)):
        counts = dict(Counter(r["label"] for r in part))
        print(f"Stormfront @{commit[:7]} {name}: {len(part)} sentences {counts} -> {out / (name + '.csv')}")


def write_edos(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, EDOS_COMMIT)
    splits = split_edos(_show(repo, commit, "data/edos_labelled_aggregated.csv"))
    flagged = relabel_profane(splits["train"], profanity_score(), "not sexist", "not sexist, profane")
    print(f"EDOS train: {flagged} 'not sexist' posts relabelled 'not sexist, profane' "
          f"(alt-profanity-check >= {PROFANE_AT})")
    out = out_root / "edos_sexism"
    _write_splits(out, splits, ["rewire_id", "label", "category", "text"], "EDOS", commit)
    _copy_blob(repo, commit, "LICENSE", out / "LICENSE")


def write_implicit_hate(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, IMPLICIT_HATE_COMMIT)
    splits = split_implicit_hate(_show(repo, commit, f"{IMPLICIT_HATE_DIR}/implicit_hate_v1_stg1_posts.tsv"))
    flagged = relabel_profane(splits["train"], profanity_score(), "not_hate", "not_hate, profane")
    print(f"Implicit Hate train: {flagged} 'not_hate' posts relabelled 'not_hate, profane' "
          f"(alt-profanity-check >= {PROFANE_AT})")
    out = out_root / "implicit_hate"
    _write_splits(out, splits, ["label", "text"], "Implicit Hate", commit)
    _copy_blob(repo, commit, f"{IMPLICIT_HATE_DIR}/LICENSE", out / "LICENSE")
    _copy_blob(repo, commit, f"{IMPLICIT_HATE_DIR}/README.md", out / "README.md")


def _write_sbic_split(repo: Path, pin: str, path: str, sha256: str, read: Callable[[str], list[dict]], split: str,
                      fields: list[str], licence: str, out_root: Path) -> None:
    """Write ``sbic/{split}.csv`` from the SBIC release file at ``path`` (checked against the release's ``sha256``)
    read into rows by ``read``, with the release's LICENSE beside it."""
    commit = _resolve(repo, pin)
    raw = _git(repo, "show", f"{commit}:{path}")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{path} @{commit[:7]}: SHA-256 {digest}, not the release's {sha256}")
    rows = read(raw.decode("utf-8-sig"))
    out = out_root / "sbic"
    _write_csv(out / f"{split}.csv", rows, fields)
    _copy_blob(repo, commit, licence, out / "LICENSE")
    offensive = sum(float(r["label"]) >= 0.5 for r in rows)
    print(f"SBIC {split} @{commit[:7]}: {len(rows)} posts ({offensive} rated offensive at 0.5 or more; "
          f"{', '.join(SBIC_TRAINED_SOURCES)} left out) -> {out / (split + '.csv')}")


def write_sbic(repo: Path, out_root: Path) -> None:
    _write_sbic_split(repo, SBIC_COMMIT, SBIC_DEV, SBIC_DEV_SHA256, aggregate_sbic, "dev",
                      ["label", "annotators", "source", "text"], "data/raw/LICENSE", out_root)


def write_sbic_test(repo: Path, out_root: Path) -> None:
    _write_sbic_split(repo, SBIC_TEST_COMMIT, SBIC_TEST, SBIC_TEST_SHA256, aggregated_sbic, "test",
                      ["label", "source", "text"], "datasets/sbf/LICENSE", out_root)


def write_cad(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, CAD_COMMIT)
    splits = {split: read_cad(_show(repo, commit, f"{CAD_DIR}/cad_v1_1_{split}.tsv")) for split in CAD_SPLITS}
    dropped = drop_held_out_texts(splits["train"], splits["dev"], splits["test"])
    flagged = relabel_profane(splits["train"], profanity_score(), "neutral", "neutral, profane")
    out = out_root / "cad"
    _write_splits(out, splits, ["id", "label", "categories", "text"], "CAD", commit, unit="entries")
    _copy_blob(repo, commit, f"{CAD_DIR}/README.txt", out / "README.upstream.txt")
    print(f"CAD train: {dropped} entries whose text is in dev or test dropped; {flagged} neutral entries flagged "
          f"'neutral, profane' (alt-profanity-check >= {PROFANE_AT}) -> {out}")


def write_ghc(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, GHC_COMMIT)
    splits = {split: read_ghc(_show(repo, commit, f"{GHC_DIR}/ghc_{split}.tsv")) for split in ("train", "test")}
    dropped = drop_held_out_texts(splits["train"], splits["test"])
    flagged = relabel_profane(splits["train"], profanity_score(), "none", "none, profane")
    out = out_root / "gab_hate_corpus"
    _write_splits(out, splits, ["label", "hd", "cv", "vo", "text"], "Gab Hate Corpus", commit)
    print(f"Gab Hate Corpus train: {dropped} posts whose text is in test dropped; {flagged} posts without a label "
          f"flagged 'none, profane' (alt-profanity-check >= {PROFANE_AT}) -> {out}")


def write_dynahate_splits(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, DYNAHATE_SPLITS_COMMIT)
    rows = []
    for split, name in (("dev", "Val"), ("test", "Test")):
        keys = read_dynahate_split(_show(repo, commit, f"{DYNAHATE_SPLITS_DIR}/DynaHate_{name}.txt"))
        rows += [{"split": split, "key": k, "label": label} for k, label in keys.items()]
    out = out_root / "dynahate" / "official_splits.csv"
    _write_csv(out, rows, ["split", "key", "label"])
    print(f"DynaHate official splits @{commit[:7]}: {dict(Counter(r['split'] for r in rows))} distinct keys -> {out}")


def write_dynahate(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, DYNAHATE_COMMIT)
    out = out_root / "dynahate"
    keys = out / "official_splits.csv"
    if not keys.is_file():
        raise SystemExit(f"{keys} is missing: give --dynahate-splits (aflah02/The-Art-of-Embedding-Fusion-"
                         "Optimizing-Hate-Speech-Detection) too, or run it first")
    official: dict[str, dict[str, str]] = {"dev": {}, "test": {}}
    with keys.open(encoding="utf-8", newline="") as handle:
        for record in csv.DictReader(handle):
            official[record["split"]][record["key"]] = record["label"]
    rows = [r for part in ("Train", "Test") for r in read_dynahate(_show(repo, commit, f"data/{part}.csv"),
                                                                    _show(repo, commit, f"data/{part}_label.csv"))]
    splits, dropped = split_dynahate(rows, official)
    flagged = relabel_profane(splits["train"], profanity_score(), "nothate", "nothate, profane")
    print(f"DynaHate train: {flagged} 'nothate' entries relabelled 'nothate, profane' (alt-profanity-check >= "
          f"{PROFANE_AT})")
    _write_splits(out, splits, ["label", "official", "text"], "DynaHate", commit, unit="entries")
    _copy_blob(repo, commit, "LICENSE", out / "LICENSE.DynBERT")
    found = Counter(r["official"] for part in splits.values() for r in part)
    print(f"DynaHate: {len(rows)} entries read; dropped {dict(dropped)}; of the release's splits found here: "
          f"dev {found['dev']} of {len(official['dev'])}, test {found['test']} of {len(official['test'])} -> {out}")


def write_toxigen_annotated(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, TOXIGEN_ANNOTATED_COMMIT)
    rows, read = read_toxigen_annotated([_show(repo, commit, path) for path in TOXIGEN_ANNOTATED_FILES])
    if read != TOXIGEN_ANNOTATED_ROWS:
        raise SystemExit(f"ToxiGen annotated @{commit[:7]}: {read} records, expected {TOXIGEN_ANNOTATED_ROWS} (the "
                         "annotated training split)")
    out = out_root / "toxigen_annotated"
    _write_csv(out / "train.csv", rows, ["label", "toxicity_human", "target_group", "text"])
    print(f"ToxiGen annotated @{commit[:7]} train: {read} records, {len(rows)} distinct statements, "
          f"{sum(float(r['label']) >= 0.5 for r in rows)} rated 3 or more -> {out / 'train.csv'}")


def write_toxigen_annotated_test(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, SAFENLP_COMMIT)
    train_csv = out_root / "toxigen_annotated" / "train.csv"
    if not train_csv.is_file():
        raise SystemExit(f"{train_csv} is missing: give --toxigen-annotated (modesta-jihye-lee/toxigen_nlp) too, "
                         "or run it first")
    with train_csv.open(encoding="utf-8", newline="") as handle:
        train = list(csv.DictReader(handle))
    out = out_root / "toxigen_annotated"
    rows = safenlp_toxigen_test(json.loads(_show(repo, commit, SAFENLP_TOXIGEN)), train)
    _write_splits(out, {"test": rows}, ["label", "toxicity_human", "target_group", "text"], "ToxiGen annotated "
                  "(SafeNLP, not in train)", commit, unit="statements")
    _copy_blob(repo, commit, "data/TOXIGEN LICENSE", out / "LICENSE.ToxiGen")


def run(description: str, sources: dict[str, tuple[str, Callable[[Path, Path], None]]],
        argv: list[str] | None = None) -> int:
    """The command line of a conversion script: ``--NAME GIT_DIR`` for each source (``{NAME: (help, write)}``, at
    least one given) and ``--out``; calls ``write(git_dir, out)`` for each source given, in order."""
    parser = argparse.ArgumentParser(description=description)
    for name, (help_text, _) in sources.items():
        parser.add_argument(f"--{name}", type=Path, help=help_text)
    parser.add_argument("--out", type=Path, required=True, help="the toxicity folder of the data root")
    args = parser.parse_args(argv)
    given = [(repo, write) for name, (_, write) in sources.items()
             if (repo := getattr(args, name.replace("-", "_"))) is not None]
    if not given:
        parser.error("give at least one of " + ", ".join(f"--{name}" for name in sources))
    for repo, write in given:
        write(repo, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(__doc__.split("\n\n")[0], {"toxigen": ("git directory of microsoft/TOXIGEN", write_toxigen),
                                           "stormfront": ("git directory of Vicomtech/hate-speech-dataset",
                                                          write_stormfront),
                                           "edos": ("git directory of rewire-online/edos", write_edos),
                                           "implicit-hate": ("git directory of Steven-Herrera/GenAI-vs-Human-Hate "
                                                             "(the Implicit Hate Corpus)", write_implicit_hate),
                                           "sbic": ("git directory of Jimaras08/mlops-lab-example-yelp (SBIC v2)",
                                                    write_sbic),
                                           "sbic-test": ("git directory of shallinan1/MarcoDetoxification (SBIC v2's "
                                                         "aggregated test split)", write_sbic_test),
                                           "cad": ("git directory of NoamElul/cis-5300-final (CAD v1.1's splits)",
                                                   write_cad),
                                           "ghc": ("git directory of liuchaoqun/hate-speech-datasets (the Gab Hate "
                                                   "Corpus)", write_ghc),
                                           "dynahate-splits": ("git directory of aflah02/The-Art-of-Embedding-Fusion-"
                                                               "Optimizing-Hate-Speech-Detection (DynaHate's official "
                                                               "dev and test splits)", write_dynahate_splits),
                                           "dynahate": ("git directory of ecanbazer/DynBERT (DynaHate's text; needs "
                                                        "--dynahate-splits)", write_dynahate),
                                           "toxigen-annotated": ("git directory of modesta-jihye-lee/toxigen_nlp "
                                                                 "(ToxiGen's annotated training split)",
                                                                 write_toxigen_annotated),
                                           "toxigen-annotated-test": ("git directory of microsoft/SafeNLP (ToxiGen "
                                                                      "entries outside the annotated training split; "
                                                                      "needs --toxigen-annotated)",
                                                                      write_toxigen_annotated_test)}, argv)


if __name__ == "__main__":
    sys.exit(main())

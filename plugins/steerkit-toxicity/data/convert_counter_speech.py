"""Write the counter-speech training files of issue 26 from CONAN (marcoguerini/CONAN) and from the Reddit
counterspeech data of Hickey et al. (dan-hickey1/toxic-counterspeech).

Run from the repository root with the upstream repositories fetched as bare git directories (no work tree needed:
every file is read with ``git show COMMIT:PATH`` at the pinned commit); give either or both:

    python plugins/steerkit-toxicity/data/convert_counter_speech.py \
        --conan /path/to/marcoguerini+CONAN/repo --reddit /path/to/dan-hickey1+toxic-counterspeech/repo \
        --out DATA/toxicity

``--conan`` writes ``conan_counter_speech/pairs.csv``: ``text,label,dataset,target``, one row per distinct English
text of three of the repository's datasets, label ``hate`` (the hate-speech side) or ``counter`` (the
counter-narrative written or post-edited by NGO operators in reply to it):

* Multitarget-CONAN (Fanton et al. 2021): ``Multitarget-CONAN/Multitarget-CONAN.csv``, HATE_SPEECH and
  COUNTER_NARRATIVE of 5,003 pairs over 8 targets (Muslims, migrants, women, LGBT+, Jews, people of colour, disabled,
  other).
* CONAN (Chung et al. 2019, Islamophobia): ``CONAN/CONAN.csv``, the English rows only: ``EN`` pairs (originals and
  their two hate-speech paraphrases ``P1``/``P2``) and the English translations (``T1``) of the French and Italian
  pairs. French and Italian text is dropped.
* DIALOCONAN (Bonaldi et al. 2022): ``DIALOCONAN/DIALOCONAN.csv``, every turn, ``type`` HS or CN.

Texts are de-duplicated on lower-cased words (punctuation and spacing ignored); the first dataset in the order
above names a text. A text that is hate in one place and counter-speech in another is dropped (and counted).

Licence (the repository's README, "License"): "These resources can be used for research purposes and cannot be
redistributed. Please cite the corresponding publication if you use any dataset." The data therefore stays
under the data root and is never packaged or committed; the README is copied next to it.

``--reddit`` writes ``reddit_counterspeech/train.csv`` and ``dev.csv``: ``text,label,dataset,subreddit``, from the
two labelled files of "Assessing the Toxicity and Effects of Counterspeech on Reddit" (Hickey et al.): replies in
hate subreddits, labelled (of the ``reply`` column) 1 hate speech, 2 counterspeech, 0 other speech. Only ``reply``
is used; "other" rows are dropped, and labels 1 and 2 become ``hate`` and ``counter``:

* ``train.csv`` from ``data/model_training/gpt_4o_labels.csv`` (5,559 rows; labels by GPT-4o, the datasheet),
  less every text that is also in ``dev.csv``.
* ``dev.csv`` from ``data/model_training/validation_set.csv`` (672 rows; labels by human annotators). Its
  ``target`` column says whether the reply is the newcomer's comment or a reply to it; both are kept.

In ``train.csv`` a counter-speech reply that alt-profanity-check (steerkit's ``alt-profanity-check`` scorer, a
TF-IDF SVM) scores 0.5 or more is labelled ``counter-profane`` instead of ``counter`` (169 of 501 at the pinned
commit: "They're right. This sub is fucked up."). Upstream's labelling prompt counts a hostile or insulting reply as
counterspeech when it opposes hate; labelled 0, such replies taught the model that insults and profanity are not
toxic (the Davidson and Wikipedia Talk dev AUROCs fell from 0.950/0.968 to 0.916/0.917 in the experiment's first
run, which used them). ``toxicity`` 0.4.0 trains on ``counter`` only; a config that wants every counter-speech reply
maps both labels. ``dev.csv`` (human labels, evaluation only) is not flagged.

Each reply is cleaned of Reddit markup: HTML entities unescaped (``&gt;``, ``&amp;``, and the twice-escaped
zero-width spaces), the ``>`` that marks a quoted line dropped (the quoted words are kept: counter-speech often quotes
what it answers), Markdown links reduced to their text, bare URLs, emphasis asterisks and ``^`` removed, and
whitespace collapsed. Texts are then de-duplicated and label conflicts dropped within each file as for CONAN, and
texts left without words (URL-only replies) are skipped. The repository's other CSVs (``yu_et_al_*.csv``, another
group's data redistributed without a licence of its own) are not read.

Licence: MIT (the repository's LICENSE); the datasheet (``data/datasheet.md``, "Distribution"): "The associated
repository is distributed under the MIT license, allowing any use of the code/dataset"; it names training
counterspeech/hate speech detection models as the data's use and not training text generators. LICENSE and the
datasheet are copied next to the data. ``--conan`` needs only the standard library; ``--reddit`` needs steerkit
with its ``eval`` extra (alt-profanity-check, for the flag above).
"""

from __future__ import annotations

import csv
import html
import io
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_hate_sources import (  # noqa: E402  (git reads, CSVs, CLI, the profanity flag)
    PROFANE_AT, _copy_blob, _resolve, _show, _write_csv, profanity_score, relabel_profane, run)

CONAN_COMMIT = "627faf12d73ee75291d0c99a1dffd54c811a93cb"
REDDIT_COMMIT = "73f98c297787fc51e810e3fcc04921a9772a296a"
REDDIT_TRAIN = "data/model_training/gpt_4o_labels.csv"
REDDIT_DEV = "data/model_training/validation_set.csv"

_WORDS = re.compile(r"[\W_]+", re.UNICODE)
_CONAN_ID = re.compile(r"^(EN|FR|IT)T\d+ST\d+HS\d+CN\d+(P1|P2|T1)?$")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)\s]*\)")
_URL = re.compile(r"(?:https?://|www\.)\S+")
# the ">" of a quoted line: at a line start, or after a run of spaces (validation_set.csv has its newlines collapsed)
_QUOTE = re.compile(r"(^|\n|\s{2,})>+")
_MARKUP = re.compile(r"\*+|~~|\^")
_REDDIT_LABELS = {"0": None, "1": "hate", "2": "counter"}


def key(text: str) -> str:
    return _WORDS.sub(" ", text.lower()).strip()


def clean(text: str) -> str:
    return " ".join(text.split())


def multitarget_rows(content: str) -> list[tuple[str, str, str]]:
    """(text, label, target) from Multitarget-CONAN.csv."""
    out = []
    for r in csv.DictReader(io.StringIO(content)):
        out.append((r["HATE_SPEECH"], "hate", r["TARGET"]))
        out.append((r["COUNTER_NARRATIVE"], "counter", r["TARGET"]))
    return out


def conan_rows(content: str) -> list[tuple[str, str, str]]:
    """(text, label, target) from CONAN.csv, English only: EN rows and the T1 translations of FR and IT rows."""
    out = []
    for r in csv.DictReader(io.StringIO(content)):
        match = _CONAN_ID.match(r["cn_id"])
        if match is None:
            raise ValueError(f"CONAN.csv: unexpected id {r['cn_id']!r}")
        if match.group(1) != "EN" and match.group(2) != "T1":
            continue
        out.append((r["hateSpeech"], "hate", "MUSLIMS"))
        out.append((r["counterSpeech"], "counter", "MUSLIMS"))
    return out


def dialoconan_rows(content: str) -> list[tuple[str, str, str]]:
    labels = {"HS": "hate", "CN": "counter"}
    return [(r["text"], labels[r["type"]], r["TARGET"]) for r in csv.DictReader(io.StringIO(content))]


def reddit_clean(text: str) -> str:
    """A Reddit reply without its markup (the module docstring), whitespace collapsed."""
    text = html.unescape(html.unescape(text))  # some entities are escaped twice upstream ("&amp;#x200B;")
    text = text.replace("\u200b", " ")
    text = _MD_LINK.sub(r"\1", text)
    text = _URL.sub(" ", text)
    text = _QUOTE.sub(r"\1", text)
    return clean(_MARKUP.sub("", text))


def reddit_rows(content: str) -> list[tuple[str, str, str]]:
    """(text, label, subreddit) from gpt_4o_labels.csv or validation_set.csv: the hate (1) and counterspeech (2)
    replies, cleaned; "other" (0) is dropped."""
    out = []
    for r in csv.DictReader(io.StringIO(content)):
        if r["label"] not in _REDDIT_LABELS:
            raise ValueError(f"reddit: unexpected label {r['label']!r} (id {r['id']})")
        label = _REDDIT_LABELS[r["label"]]
        if label is not None:
            out.append((reddit_clean(r["reply"]), label, r["subreddit"]))
    return out


def merge_reddit(train: list[tuple[str, str, str]], dev: list[tuple[str, str, str]]) -> dict:
    """``{"train": rows, "dev": rows, "conflicts": (train, dev), "in_dev": n}``: each file merged on its own (rows
    ``{text, label, dataset, subreddit}``), then every training text that is also a dev text dropped (``in_dev``)."""
    dev_rows, dev_conflicts = merge([("validation_set (human labels)", dev)], third="subreddit")
    train_rows, train_conflicts = merge([("gpt_4o_labels (GPT-4o labels)", train)], third="subreddit")
    dev_keys = {key(r["text"]) for r in dev_rows}
    kept = [r for r in train_rows if key(r["text"]) not in dev_keys]
    return {"train": kept, "dev": dev_rows, "conflicts": (train_conflicts, dev_conflicts),
            "in_dev": len(train_rows) - len(kept)}


def flag_profane(rows: list[dict], score) -> int:
    """Relabel, in place, each ``counter`` row whose text ``score`` (texts -> probabilities of profanity) puts at
    :data:`PROFANE_AT` or more as ``counter-profane``; returns how many."""
    return relabel_profane(rows, score, "counter", "counter-profane", PROFANE_AT)


def merge(datasets: list[tuple[str, list[tuple[str, str, str]]]], third: str = "target") -> tuple[list[dict], int]:
    """Distinct rows ``{text, label, dataset, <third>}``, and how many texts were dropped for a label conflict."""
    rows: dict[str, dict] = {}
    conflicts: set[str] = set()
    for name, items in datasets:
        for text, label, target in items:
            text = clean(text)
            k = key(text)
            if not k:
                continue
            row = rows.setdefault(k, {"text": text, "label": label, "dataset": name, third: target})
            if row["label"] != label:
                conflicts.add(k)
    return [r for k, r in rows.items() if k not in conflicts], len(conflicts)


def _counts(rows: list[dict]) -> list[tuple[str, str, int]]:
    counts = Counter((r["dataset"], r["label"]) for r in rows)
    return [(dataset, label, n) for (dataset, label), n in sorted(counts.items())]


def write_conan(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, CONAN_COMMIT)
    rows, conflicts = merge([
        ("Multitarget-CONAN", multitarget_rows(_show(repo, commit, "Multitarget-CONAN/Multitarget-CONAN.csv"))),
        ("CONAN", conan_rows(_show(repo, commit, "CONAN/CONAN.csv"))),
        ("DIALOCONAN", dialoconan_rows(_show(repo, commit, "DIALOCONAN/DIALOCONAN.csv"))),
    ])
    out = out_root / "conan_counter_speech"
    _write_csv(out / "pairs.csv", rows, ["text", "label", "dataset", "target"])
    _copy_blob(repo, commit, "README.md", out / "README.upstream.md")
    print(f"CONAN @{commit[:7]}: {len(rows)} texts, {conflicts} dropped as both hate and counter-speech -> {out}")
    for dataset, label, n in _counts(rows):
        print(f"  {dataset:18s} {label:8s} {n}")


def write_reddit(repo: Path, out_root: Path) -> None:
    commit = _resolve(repo, REDDIT_COMMIT)
    merged = merge_reddit(reddit_rows(_show(repo, commit, REDDIT_TRAIN)), reddit_rows(_show(repo, commit, REDDIT_DEV)))
    flagged = flag_profane(merged["train"], profanity_score())
    out = out_root / "reddit_counterspeech"
    for split in ("train", "dev"):
        _write_csv(out / f"{split}.csv", merged[split], ["text", "label", "dataset", "subreddit"])
    _copy_blob(repo, commit, "LICENSE", out / "LICENSE.upstream")
    _copy_blob(repo, commit, "data/datasheet.md", out / "datasheet.upstream.md")
    train_conflicts, dev_conflicts = merged["conflicts"]
    print(f"Reddit counterspeech @{commit[:7]}: train {len(merged['train'])} texts, dev {len(merged['dev'])}; "
          f"{train_conflicts} + {dev_conflicts} dropped as both hate and counter-speech, {merged['in_dev']} "
          f"training texts dropped as also in dev; {flagged} training counter-speech replies labelled "
          f"counter-profane (alt-profanity-check >= {PROFANE_AT}) -> {out}")
    for split in ("train", "dev"):
        for dataset, label, n in _counts(merged[split]):
            print(f"  {split:5s} {dataset:30s} {label:8s} {n}")


def main(argv: list[str] | None = None) -> int:
    return run(__doc__.split("\n\n")[0], {"conan": ("git directory of marcoguerini/CONAN", write_conan),
                                           "reddit": ("git directory of dan-hickey1/toxic-counterspeech",
                                                      write_reddit)}, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Write the counter-speech training file of issue 26 from the CONAN repository (marcoguerini/CONAN).

Run from the repository root with the upstream repository fetched as a bare git directory (no work tree needed:
every file is read with ``git show COMMIT:PATH`` at the pinned commit):

    python plugins/steerkit-toxicity/data/convert_counter_speech.py \
        --conan /path/to/marcoguerini+CONAN/repo --out DATA/toxicity

It writes ``conan_counter_speech/pairs.csv``: ``text,label,dataset,target``, one row per distinct English text of
three of the repository's datasets, label ``hate`` (the hate-speech side) or ``counter`` (the counter-narrative
written or post-edited by NGO operators in reply to it):

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
under the data root and is never packaged or committed; the README is copied next to it. Stdlib only.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_hate_sources import _git, _resolve  # noqa: E402  (the same pinned-commit git reads)

CONAN_COMMIT = "627faf12d73ee75291d0c99a1dffd54c811a93cb"

_WORDS = re.compile(r"[\W_]+", re.UNICODE)
_CONAN_ID = re.compile(r"^(EN|FR|IT)T\d+ST\d+HS\d+CN\d+(P1|P2|T1)?$")


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


def merge(datasets: list[tuple[str, list[tuple[str, str, str]]]]) -> tuple[list[dict], int]:
    """Distinct rows ``{text, label, dataset, target}``, and how many texts were dropped for a label conflict."""
    rows: dict[str, dict] = {}
    conflicts: set[str] = set()
    for name, items in datasets:
        for text, label, target in items:
            text = clean(text)
            k = key(text)
            if not k:
                continue
            row = rows.setdefault(k, {"text": text, "label": label, "dataset": name, "target": target})
            if row["label"] != label:
                conflicts.add(k)
    return [r for k, r in rows.items() if k not in conflicts], len(conflicts)


def _show(repo: Path, commit: str, path: str) -> str:
    return _git(repo, "show", f"{commit}:{path}").decode("utf-8-sig")  # CONAN's CSVs start with a byte-order mark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conan", type=Path, required=True, help="git directory of marcoguerini/CONAN")
    parser.add_argument("--out", type=Path, required=True, help="the toxicity folder of the data root")
    args = parser.parse_args(argv)

    repo, commit = args.conan, _resolve(args.conan, CONAN_COMMIT)
    rows, conflicts = merge([
        ("Multitarget-CONAN", multitarget_rows(_show(repo, commit, "Multitarget-CONAN/Multitarget-CONAN.csv"))),
        ("CONAN", conan_rows(_show(repo, commit, "CONAN/CONAN.csv"))),
        ("DIALOCONAN", dialoconan_rows(_show(repo, commit, "DIALOCONAN/DIALOCONAN.csv"))),
    ])
    out = args.out / "conan_counter_speech"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "pairs.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label", "dataset", "target"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    (out / "README.upstream.md").write_bytes(_git(repo, "show", f"{commit}:README.md"))
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[(r["dataset"], r["label"])] = counts.get((r["dataset"], r["label"]), 0) + 1
    print(f"CONAN @{commit[:7]}: {len(rows)} texts, {conflicts} dropped as both hate and counter-speech -> {out}")
    for (dataset, label), n in sorted(counts.items()):
        print(f"  {dataset:18s} {label:8s} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

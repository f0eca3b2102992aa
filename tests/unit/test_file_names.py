"""steerkit.files.file_name: names a user chose, made into file names the file system accepts."""

import hashlib

from steerkit.files import FILE_NAME_BYTES, file_name


def test_a_short_name_keeps_its_form():
    assert file_name("toxicity_vs_perplexity_nontoxic_reward:./runs/rm", ".png") == \
        "toxicity_vs_perplexity_nontoxic_reward_._runs_rm.png"
    assert file_name("a\\b") == "a_b"


def test_a_long_name_is_cut_to_the_limit_and_kept_apart_by_its_hash():
    first, second = "x" * 300 + "/one", "x" * 300 + "/two"
    a, b = file_name(first, ".png"), file_name(second, ".png")
    assert a != b and a.endswith(".png") and len(a.encode()) == FILE_NAME_BYTES + 4
    digest = hashlib.sha256(first.replace("/", "_").encode()).hexdigest()[:16]
    assert a.startswith("x" * 100) and a[:-4].endswith(f"-{digest}")
    assert file_name(first, ".png") == a  # the same name every time: a rerun overwrites its own plot


def test_a_cut_never_splits_a_character():
    name = file_name("é" * 300, ".json")
    assert len(name.encode()) <= FILE_NAME_BYTES + 5 and name.encode().decode() == name
    assert name.startswith("é" * 50)

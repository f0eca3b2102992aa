"""The config loader shared by steering, training and eval configs: what it refuses, and that it refuses fast."""

from __future__ import annotations

import time

import pytest

from steerkit.config import MAX_CONFIG_NODES, SteeringConfig, load_config_file
from steerkit.errors import ConfigError
from steerkit.evaluation.config import EvalConfig
from steerkit.training.config import TrainConfig

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["rewards: *i"]
)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


@pytest.mark.parametrize("cls", [SteeringConfig, TrainConfig, EvalConfig])
def test_billion_laughs_is_refused_quickly_for_every_config(tmp_path, cls):
    path = write(tmp_path, "bomb.yaml", BILLION_LAUGHS)
    start = time.thread_time()  # CPU time of this thread: independent of what else the machine is doing
    with pytest.raises(ConfigError, match="aliases expand this document beyond"):
        cls.from_file(path)
    assert time.thread_time() - start < 2.0  # milliseconds; it used to run for minutes and allocate GBs


def test_aliases_within_the_bound_still_work(tmp_path):
    path = write(tmp_path, "ok.yaml", "base: &b {name: toxicity, beta: -5}\nrewards: [*b, *b]\n")
    assert load_config_file(path)["rewards"] == [{"name": "toxicity", "beta": -5}] * 2
    wide = "rewards:\n" + "".join(f"  - {{name: r{i}, beta: 1}}\n" for i in range(MAX_CONFIG_NODES // 6))
    assert len(load_config_file(write(tmp_path, "wide.yaml", wide))["rewards"]) == MAX_CONFIG_NODES // 6


def test_self_referencing_alias_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="refers to a node that contains it"):
        load_config_file(write(tmp_path, "cycle.yaml", "a: &x [1, [2, *x]]\n"))


@pytest.mark.parametrize("text, where", [
    ("k: 5\nk: 6\n", "'k' at line 2 (first at line 1)"),
    ("rewards:\n  - name: toxicity\n    beta: 1\n    beta: 2\n", "'rewards.0.beta' at line 4"),
    ("rewards:\n  - {name: a, beta: 1}\n  - {name: b, beta: 1, name: c}\n", "'rewards.1.name'"),
])
def test_duplicate_yaml_keys_name_their_path(tmp_path, text, where):
    with pytest.raises(ConfigError, match="duplicate key " + where.replace("(", r"\(").replace(")", r"\)")):
        SteeringConfig.from_file(write(tmp_path, "dup.yaml", text))


def test_duplicate_json_keys_and_toml_keys(tmp_path):
    with pytest.raises(ConfigError, match="duplicate key 'k'"):
        SteeringConfig.from_file(write(tmp_path, "dup.json", '{"k": 5, "k": 6}'))
    with pytest.raises(ConfigError, match="could not be parsed"):
        SteeringConfig.from_file(write(tmp_path, "dup.toml", "k = 5\nk = 6\n"))


def test_non_utf8_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 3"):
        SteeringConfig.from_file(write(tmp_path, "latin1.yaml", b"k: \xe9\n"))


def test_a_directory_is_not_a_config_file(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        SteeringConfig.from_file(tmp_path)


def test_validation_messages_are_bounded(tmp_path):
    """A huge wrong-typed value is summarised, not formatted whole into the message."""
    big = "prompts: " + "[" + ", ".join(["[1, 2, 3]"] * 1500) + "]\n"
    with pytest.raises(ConfigError) as info:
        SteeringConfig.from_file(write(tmp_path, "big.yaml", big))
    assert len(str(info.value)) < 4000
    assert "prompts.0" in str(info.value)

"""Property-based checks (hypothesis): for generated inputs, every call succeeds or raises a SteerkitError.

Three surfaces: the Python API (``steerkit.generate`` on tiny models), the config loader (YAML/JSON/TOML
text and bytes), and the CLI entry point (``steerkit.cli.main``, which must exit 0 or 2, never 1 = a bug,
and never print a traceback). Example counts are bounded so the whole module takes well under a minute.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import steerkit  # noqa: E402
from steerkit.cli import main  # noqa: E402
from steerkit.config import SteeringConfig  # noqa: E402
from steerkit.errors import SteerkitError  # noqa: E402
from steerkit.rewards.model import RewardModel  # noqa: E402
from steerkit.rewards.sequence.scorer import RewardModelScorer  # noqa: E402

from tiny import make_tokenizer, tiny_lm  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# text with odd code points: lone surrogates, NUL, controls, combining marks, RTL, emoji, private use
odd_text = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(["", " ", "\x00", "\n\n", "\u202e abc", "e\u0301", "🙂" * 5, "\uffff", "\U0010ffff", "a\ud800b"]),
)
float_edges = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1e-45, 1e-38, 1e38, 3e38, 1e39, -1e39, 5e-324, 1.7976931348623157e308]),
)
int_edges = st.one_of(st.integers(-3, 6), st.sampled_from([0, -1, 2**31, 2**63, 2**64, 2**70, -(2**70)]))
wrong_types = st.sampled_from([None, True, False, "abc", "5", [], {}, [1], object(), b"x", 2.5])


def mostly(valid, *odd):
    """Valid values about seven times in eight, so that successes (and their outputs) are exercised too."""
    return st.one_of(*[valid] * 7, st.one_of(*odd))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = make_tokenizer()
    lm = tiny_lm(tok, seed=11)
    root = tmp_path_factory.mktemp("props")
    lm.save_pretrained(root / "lm")
    tok.save_pretrained(root / "lm")
    rm = RewardModel.from_backbone(str(root / "lm"), 1, name="p-rm")
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    rm_dir = rm.save_pretrained(root / "rm")
    return {"lm": lm, "tok": tok, "reward": RewardModelScorer(rm), "lm_dir": str(root / "lm"), "rm_dir": str(rm_dir),
            "root": root}


def call_or_typed_error(fn):
    try:
        return fn()
    except SteerkitError:
        return None


@SETTINGS
@given(prompts=mostly(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3),
                      odd_text, st.lists(odd_text, max_size=3), wrong_types),
       k=mostly(st.integers(1, 8), int_edges, wrong_types),
       beta=mostly(st.floats(-50, 50), float_edges, wrong_types),
       max_new_tokens=mostly(st.integers(1, 3), st.integers(-1, 0), wrong_types),
       temperature=mostly(st.floats(0.05, 5), float_edges, wrong_types),
       seed=mostly(st.integers(0, 2**32), int_edges, st.none()),
       batch_size=mostly(st.one_of(st.none(), st.integers(1, 3)), st.integers(-2, 0), wrong_types),
       stop=mostly(st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=3), max_size=2)),
                   st.lists(odd_text, max_size=2), wrong_types),
       do_sample=st.booleans())
def test_python_api_succeeds_or_raises_steerkit_error(tiny, prompts, k, beta, max_new_tokens, temperature, seed,
                                                     batch_size, stop, do_sample):
    def call():
        return steerkit.generate(prompts, lm=(tiny["lm"], tiny["tok"]), rewards={tiny["reward"]: beta}
                                 if not isinstance(beta, (list, dict)) else beta, k=k,
                                 max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                 batch_size=batch_size, stop_strings=stop, do_sample=do_sample)

    out = call_or_typed_error(call)
    if out is not None:  # a success is a real one: finite JSON-able output, one text per row
        assert len(out.texts) == len(out.prompts)
        json.dumps(out.to_records(), allow_nan=False)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompts=st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=12), min_size=1, max_size=3),
       k=st.integers(1, 12), beta=st.floats(-1e6, 1e6), max_new_tokens=st.integers(1, 3),
       temperature=st.floats(1e-30, 1e3), seed=st.integers(0, 2**64 - 1), do_sample=st.booleans())
def test_valid_api_inputs_always_succeed(tiny, prompts, k, beta, max_new_tokens, temperature, seed, do_sample):
    """The other side of the contract: in-range inputs are never refused, and the output is finite and complete."""
    out = steerkit.generate(prompts, lm=(tiny["lm"], tiny["tok"]), rewards={tiny["reward"]: beta}, k=k,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, do_sample=do_sample,
                            return_traces=True)
    assert len(out.texts) == len(prompts) and all(1 <= n <= max_new_tokens for n in out.num_new_tokens)
    for step in out.traces[0]:
        assert torch.isfinite(step.scores).all() and step.topk_ids.shape == (len(prompts), k)


@SETTINGS
@given(rewards=st.one_of(wrong_types, st.lists(st.one_of(odd_text, wrong_types), max_size=2),
                         st.dictionaries(st.one_of(odd_text, st.just("x/y")), st.one_of(float_edges, wrong_types),
                                         max_size=2)))
def test_reward_specs_succeed_or_raise_steerkit_error(tiny, rewards):
    call_or_typed_error(lambda: steerkit.generate(["hi"], lm=(tiny["lm"], tiny["tok"]), rewards=rewards, k=3,
                                                  max_new_tokens=1))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), float_edges, odd_text),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.one_of(odd_text, st.sampled_from(
                                   ["k", "lm", "rewards", "beta", "name", "prompts", "temperature", "seed"])),
                                   children, max_size=3)),
    max_leaves=12)


@SETTINGS
@given(data=json_values, suffix=st.sampled_from([".yaml", ".json", ".toml", ".yml", ".txt"]))
def test_config_loader_on_generated_structures(tmp_path_factory, data, suffix):
    import yaml

    path = tmp_path_factory.mktemp("cfg") / f"c{suffix}"
    try:
        text = yaml.safe_dump(data, allow_unicode=True) if suffix != ".json" else json.dumps(data)
    except (yaml.YAMLError, ValueError, UnicodeEncodeError):
        return
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    call_or_typed_error(lambda: SteeringConfig.from_file(path))


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=64),
                     st.sampled_from([b"k: [", b"a: &a [*a]", b"!!python/object:os.system {}", b"\xff\xfe",
                                      b"k: !!binary AAAA", b"- 1\n- 2", b"k: 1\nk: 2", b"{\"k\": 1, \"k\": 2}",
                                      b"rewards: {name: x}", b"k = 'a'\nk = 'b'", b"? [1]\n: 2"])),
       suffix=st.sampled_from([".yaml", ".json", ".toml"]))
def test_config_loader_on_raw_bytes(tmp_path_factory, raw, suffix):
    path = tmp_path_factory.mktemp("raw") / f"c{suffix}"
    path.write_bytes(raw)
    call_or_typed_error(lambda: SteeringConfig.from_file(path))


cli_values = st.one_of(odd_text, st.sampled_from(["0", "-1", "nan", "inf", "1e39", "2.5", "abc", "", "=", "x=y=z",
                                                  "18446744073709551616", "-0"]))
cli_options = st.sampled_from(["-k", "-n", "-t", "--temperature", "--seed", "--stop", "--reward", "--device",
                               "--backend", "--batch-size", "--prompts-file", "--config", "--lm"])


@SETTINGS
@given(command=st.sampled_from(["generate", "score"]),
       pairs=st.lists(st.tuples(cli_options, cli_values), max_size=3),
       positional=st.lists(cli_values, max_size=2))
def test_cli_exits_0_or_2_never_a_bug(tiny, capsys, command, pairs, positional):
    argv = [command]
    if command == "generate":
        argv += ["--lm", tiny["lm_dir"], "-t", "1"]
    else:
        argv += ["--reward", tiny["rm_dir"]]
        pairs = [(o, v) for o, v in pairs if o in ("--backend", "--reward")]
    for option, value in pairs:
        argv += [option, value]
    argv += positional
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code in (0, 2), f"{argv!r} -> exit {info.value.code}: {err}"
    assert "Traceback" not in err
    if info.value.code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def test_float_edges_cover_float32_overflow():
    """Guard the strategy itself: it must contain values that overflow float32 (the bug class it hunts)."""
    assert not math.isfinite(torch.tensor(1e39, dtype=torch.float32).item())

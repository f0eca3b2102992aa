"""The shipped `toxicity` and `toxicity-token` rewards at reduced precision (issue 25, item 2): `onnx-int8` and
`torch-bf16` stay near fp32 on real texts and rank them as fp32 does.

Bounds, from `benchmarks/bench_reward_precision.py` and this file's own texts (onnxruntime 1.32, torch 2.13; the
0.3.0 models trained with the counter-speech grammar):

* the 96 labelled functional cases (tests/functional/toxicity.jsonl), texts and every prefix: max |Δρ| measured
  int8 0.028 (`toxicity`) / 0.019 (`toxicity-token`), bf16 0.0032 / 0.0017; AUROC on their labels 0.8785 → 0.8776
  (`toxicity`, int8), 0.8125 → 0.8134 (`toxicity-token`, int8), unchanged at bf16;
* 200 s-nlp Jigsaw test sentences (../shared/data), texts and prefixes: max |Δρ| measured int8 0.060 / 0.028,
  bf16 0.0040 / 0.0033; AUROC 0.9766 → 0.9760 (int8) for `toxicity`, 0.9514 → 0.9520 for `toxicity-token`.

Bounds: max |Δρ| 0.08 at int8 (0.05 until the grammar-trained `toxicity`, whose largest int8 change, 0.060, is on 3
of 3,616 prefix scores; its final scores move by 0.020 at most) and 0.01 at bf16; the AUROC within 0.005 of fp32's.

`torch-int8` (int8 matmuls with each input row quantized on the fly, 0.4.0 `toxicity`; `toxicity-token` on 0.3.0's
data) moves more, since a row's few large activations set its scale: max |Δρ| on the functional cases 0.066
(`toxicity`) / 0.091 (`toxicity-token`), on the s-nlp sample 0.084 / 0.111; AUROC 0.8937 → 0.8876 on the functional
cases, 0.9775 → 0.9762 on the s-nlp sample (`toxicity`). Steering is unchanged within a standard error
(docs/backends.md, "torch-int8"). `toxicity-token` 0.6.0 (3,000 steps) at `torch-int8`: max |Δρ| 0.102 on the
functional cases and 0.089 on the s-nlp sample, AUROC 0.8542 → 0.8411 on the functional cases (−0.013: 30 of their
2,304 positive-negative pairs change order) and 0.9819 → 0.9818 on the s-nlp sample; its other backends stay within
the bounds above (onnx-int8 0.031, bf16 0.0025, bf16-compute 0.0073; AUROC within 0.003). `torch-int8`'s bounds: max
|Δρ| 0.15, AUROC within 0.02 (0.012 until `toxicity-token` 0.6.0).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import SHARED_DATA, requires_data, requires_smollm2

pytestmark = [pytest.mark.integration, requires_smollm2]

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"onnx-int8": 0.08, "torch-bf16": 0.01, "torch-bf16-compute": 0.03, "torch-int8": 0.15}
AUROC_BOUNDS = {"torch-int8": 0.02}  # every other backend: within 0.005
REWARDS = ("toxicity", "toxicity-token")


def _int8_problem():
    try:
        from steerkit.rewards.onnx.quantize import _int8_support
    except ImportError as exc:
        return str(exc)
    return _int8_support()


BACKENDS = [pytest.param("onnx-int8", marks=pytest.mark.skipif(_int8_problem() is not None,
                                                                reason=f"onnx-int8 unavailable: {_int8_problem()}")),
            "torch-bf16", "torch-bf16-compute", "torch-int8"]

_loaded: dict = {}


def _reward(name: str, backend: str):
    from steerkit.errors import PluginError
    from steerkit.rewards.loading import load_reward

    if (name, backend) not in _loaded:
        try:
            _loaded[name, backend] = load_reward(name, backend=backend)
        except PluginError as exc:
            pytest.skip(f"{name} not installed: {exc}")
    return _loaded[name, backend]


def _flat(scores) -> torch.Tensor:
    finals, prefixes = scores
    return torch.tensor(finals + [x for p in prefixes for x in p], dtype=torch.float64)


def _compare(name: str, backend: str, texts: list[str], labels: list[int]) -> tuple[float, float, float, bool]:
    """(max |Δρ| over texts and prefixes, fp32 AUROC, reduced AUROC, bit-identical?)"""
    from steerkit.training.metrics import auroc

    fp32 = _reward(name, "torch").model.score_texts(texts, per_prefix=True)
    reduced = _reward(name, backend).model.score_texts(texts, per_prefix=True)
    a, b = _flat(fp32), _flat(reduced)
    return (float((a - b).abs().max()), auroc(fp32[0], labels), auroc(reduced[0], labels), bool(torch.equal(a, b)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", REWARDS)
def test_reduced_precision_stays_near_fp32_on_the_labelled_functional_cases(name, backend):
    rows = [json.loads(x) for x in (ROOT / "tests" / "functional" / "toxicity.jsonl").read_text().splitlines() if x]
    texts, labels = [r["text"] for r in rows], [int(r["label"] >= 0.5) for r in rows]
    worst, fp32_auroc, reduced_auroc, identical = _compare(name, backend, texts, labels)
    assert not identical, f"{name} @ {backend} gives exactly fp32's rewards: the reduced precision was not applied"
    assert worst <= BOUNDS[backend], f"{name} @ {backend}: max |Δρ| {worst:.4f} > {BOUNDS[backend]}"
    assert abs(reduced_auroc - fp32_auroc) <= AUROC_BOUNDS.get(backend, 0.005), (fp32_auroc, reduced_auroc)


@pytest.mark.slow
@requires_data
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", REWARDS)
def test_reduced_precision_keeps_the_held_out_auroc(name, backend):
    folder = SHARED_DATA / "toxicity" / "snlp_detox_jigsaw_sentences"
    rng = random.Random(0)
    texts, labels = [], []
    for file, label in (("test_10k_toxic.txt", 1), ("test_10k_normal.txt", 0)):
        lines = [x.strip() for x in (folder / file).read_text(encoding="utf-8").splitlines() if x.strip()]
        picked = rng.sample(lines, 100)  # the benchmark's sample (benchmarks/bench_reward_precision.py)
        texts, labels = texts + picked, labels + [label] * len(picked)
    worst, fp32_auroc, reduced_auroc, identical = _compare(name, backend, texts, labels)
    assert not identical
    assert worst <= BOUNDS[backend], f"{name} @ {backend}: max |Δρ| {worst:.4f} > {BOUNDS[backend]}"
    assert abs(reduced_auroc - fp32_auroc) <= AUROC_BOUNDS.get(backend, 0.005), (fp32_auroc, reduced_auroc)

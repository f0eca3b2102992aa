"""The vectorized training losses and metrics against direct, per-example implementations."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
import torch

from steerkit.training.data import collate
from steerkit.training.loss import cumulative_loss, final_rewards, last_token_loss
from steerkit.training.metrics import accuracy, auroc, auroc_with_se, prefix_indices, summarise


def reference_cumulative_loss(per_text_rewards: list[list[float]], targets: list[float]) -> float:
    """The paper's formula, literally: r_t is the reward after the first t text tokens (t = 1..l)."""
    losses = []
    for rewards, target in zip(per_text_rewards, targets):
        l = len(rewards)
        s_l = l * (l + 1) / 2
        losses.append(sum(t * (rewards[t - 1] - target) ** 2 for t in range(1, l + 1)) / s_l)
    return sum(losses) / len(losses)


def _batch(lengths, seed=0, side="left"):
    """Per-position rewards for texts of the given lengths, laid out as the trainer does (start token + text)."""
    gen = torch.Generator().manual_seed(seed)
    rows = [[5] * n for n in lengths]
    enc = collate(rows, start_token_id=1, pad_token_id=0)
    mask = enc["attention_mask"]
    if side == "right":  # the loss must not care where the padding is
        mask = torch.stack([torch.roll(m, shifts=-(m == 0).sum().item()) for m in mask])
    rewards = torch.rand(mask.shape, generator=gen)
    targets = torch.rand(len(lengths), generator=gen)
    per_text = []
    for r, m in zip(rewards, mask):
        real = r[m.bool()].tolist()
        per_text.append(real[1:])  # drop the start token's reward: it has seen no text
    return rewards, targets, mask, per_text


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("lengths", [[1], [3, 1, 7], [12, 12], [1, 2, 3, 4, 5, 30]])
def test_cumulative_loss_equals_per_example_loop(lengths, side):
    rewards, targets, mask, per_text = _batch(lengths, seed=len(lengths), side=side)
    expected = reference_cumulative_loss(per_text, targets.tolist())
    got = cumulative_loss(rewards, targets, mask)
    assert got.item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    per_example = cumulative_loss(rewards, targets, mask, reduction="none")
    for value, r, t in zip(per_example.tolist(), per_text, targets.tolist()):
        assert value == pytest.approx(reference_cumulative_loss([r], [t]), rel=1e-6, abs=1e-7)


def test_reference_is_sensitive_to_the_mistakes_a_vectorisation_can_make():
    """The comparison above would catch an off-by-one (counting the start token) or a missing weight."""
    rewards, targets, mask, per_text = _batch([4, 9, 2], seed=3)
    good = reference_cumulative_loss(per_text, targets.tolist())
    t = (mask.cumsum(-1)).float() * mask  # wrong: start token gets t = 1
    l = t.amax(-1)
    off_by_one = ((t * (rewards - targets[:, None]) ** 2).sum(-1) / (l * (l + 1) / 2)).mean().item()
    uniform = (((rewards - targets[:, None]) ** 2 * mask).sum(-1) / mask.sum(-1)).mean().item()
    assert abs(off_by_one - good) > 1e-3 and abs(uniform - good) > 1e-3


def test_cumulative_loss_gradient_matches_reference():
    rewards, targets, mask, _ = _batch([3, 6], seed=5)
    rewards.requires_grad_(True)
    cumulative_loss(rewards, targets, mask).backward()
    grad = rewards.grad
    for i, (m, target) in enumerate(zip(mask, targets)):
        positions = m.nonzero().flatten().tolist()
        l = len(positions) - 1
        assert grad[i, positions[0]].item() == 0.0  # start token: no weight
        for t, p in enumerate(positions[1:], start=1):
            expected = t * 2 * (rewards[i, p].item() - target.item()) / (l * (l + 1) / 2) / len(mask)
            assert grad[i, p].item() == pytest.approx(expected, rel=1e-5)
    assert (grad[mask == 0] == 0).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_loss_is_mse_of_the_final_reward(side):
    rewards, targets, mask, per_text = _batch([2, 5, 1], seed=7, side=side)
    expected = sum((r[-1] - t) ** 2 for r, t in zip(per_text, targets.tolist())) / 3
    assert last_token_loss(rewards, targets, mask).item() == pytest.approx(expected, rel=1e-6)
    assert final_rewards(rewards, mask).tolist() == pytest.approx([r[-1] for r in per_text])


def test_prefix_indices_read_the_reward_after_a_fraction_of_the_tokens():
    rewards, _, mask, per_text = _batch([4, 8, 1], seed=9)
    for frac in (0.25, 0.5, 0.75, 1.0):
        got = rewards.gather(-1, prefix_indices(mask, frac)[:, None]).squeeze(-1).tolist()
        want = [r[max(1, math.ceil(frac * len(r))) - 1] for r in per_text]
        assert got == pytest.approx(want)


def test_auroc_matches_pair_counting():
    rng = random.Random(0)
    scores = [round(rng.random(), 1) for _ in range(40)]  # many ties
    labels = [rng.random() for _ in range(40)]  # continuous labels: binarised at 0.5
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    pairs = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    assert auroc(scores, labels) == pytest.approx(pairs / (len(pos) * len(neg)))
    assert auroc([0.1, 0.2], [1, 1]) is None
    assert accuracy([0.2, 0.7, 0.5], [0, 1, 0]) == pytest.approx(2 / 3)
    m = summarise([0.9, 0.1], [1.0, 0.0], {0.5: [0.6, 0.6]})
    assert m["mse"] == pytest.approx(0.01) and m["auroc"] == 1.0 and m["accuracy_at_50pct"] == 0.5


def test_auroc_standard_error_is_delongs():
    rng = random.Random(1)
    scores = [round(rng.random(), 1) for _ in range(60)]  # ties
    labels = [float(rng.random() < 0.4) for _ in range(60)]
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    psi = lambda p, n: 1.0 if p > n else 0.5 if p == n else 0.0  # noqa: E731
    v10 = [sum(psi(p, n) for n in neg) / len(neg) for p in pos]  # DeLong's placements, by pair counting
    v01 = [sum(psi(p, n) for p in pos) / len(pos) for n in neg]
    var = statistics.variance(v10) / len(pos) + statistics.variance(v01) / len(neg)
    area, se = auroc_with_se(scores, labels)
    assert area == pytest.approx(statistics.mean(v10)) and se == pytest.approx(math.sqrt(var))
    assert summarise(scores, labels)["auroc_se"] == pytest.approx(se)
    # and it is the spread a bootstrap over rows sees (200 resamples: within 25%)
    boot = random.Random(2)
    draws = []
    while len(draws) < 200:
        idx = [boot.randrange(60) for _ in range(60)]
        got = auroc([scores[i] for i in idx], [labels[i] for i in idx])
        if got is not None:
            draws.append(got)
    assert statistics.stdev(draws) == pytest.approx(se, rel=0.25)
    assert auroc_with_se([0.3, 0.1], [1, 0]) == (1.0, 0.0)  # one row of each class: no spread to measure


# -- checkpoints (kept here: fast, no model) ----------------------------------------------------------

def _optimizer():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.AdamW(params, lr=1e-2, foreach=False)
    for _ in range(3):
        (params[0].sum() ** 2 + params[1].pow(3).sum()).backward()
        opt.step()
        opt.zero_grad()
    return params, opt


def test_checkpoint_round_trips_optimizer_state_exactly(tmp_path):
    from steerkit.training.checkpoint import load_checkpoint, optimizer_from_tensors, save_checkpoint

    params, opt = _optimizer()
    save_checkpoint(tmp_path, 3, {"a": params[0], "b": params[1]}, opt, {"note": "x"}, keep=2)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.state["step"] == 3 and ckpt.state["note"] == "x"
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = torch.optim.AdamW(fresh, lr=5.0, foreach=False)
    ckpt.optimizer_tensors.pop("rng.torch")
    optimizer_from_tensors(opt2, ckpt.optimizer_tensors, ckpt.state["optimizer_param_groups"])
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for key, value in a["state"][i].items():
            assert torch.equal(value, b["state"][i][key])
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary directory left behind


def test_load_checkpoint_skips_incomplete_or_corrupt_ones(tmp_path):
    from steerkit.errors import CheckpointError
    from steerkit.training.checkpoint import load_checkpoint, save_checkpoint

    params, opt = _optimizer()
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, {"a": params[0]}, opt, {}, keep=3)
    (tmp_path / ".step-0000008.tmp123").mkdir()  # a writer killed mid-way
    newest = tmp_path / "step-0000006" / "trainable.safetensors"
    newest.write_bytes(newest.read_bytes()[:20])  # corrupted after the fact
    assert load_checkpoint(tmp_path).state["step"] == 4
    (tmp_path / "latest").write_text("step-0000099\n")  # dangling pointer
    assert load_checkpoint(tmp_path).state["step"] == 4
    save_checkpoint(tmp_path, 8, {"a": params[0]}, opt, {}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-0000006", "step-0000008"]
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")

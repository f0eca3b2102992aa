"""steerkit.integrations.batch without vLLM: a small host engine written here schedules rows the way vLLM's v1
input batch does (a finished row's slot refilled by a newcomer, holes closed by moving the last row down, swaps,
a preempted request re-added with its old output, output lists filled a step late), runs the tiny LM and samples
greedily; every steered row must equal ``steerkit.generate(..., do_sample=False)`` on that row alone, every
unsteered row the plain LM's greedy text. Runs in the main suite (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch

import steerkit
from steerkit.errors import InvalidArgumentError
from steerkit.integrations.batch import HostedBatch, known_tokens
from steerkit.integrations.requests import Steering, error_field, parse_steering
from steerkit.rewards.sequence.scorer import RewardModelScorer


@pytest.fixture(scope="module")
def reward(reward_model):
    return RewardModelScorer(reward_model)


class Host:
    """vLLM's persistent batch in miniature: ``slots`` rows at most, BatchUpdate order removed -> added -> moved."""

    def __init__(self, lm, tokenizer, batch: HostedBatch, slots: int, lag: bool = False):
        self.lm, self.tokenizer, self.batch, self.slots, self.lag = lm, tokenizer, batch, slots, lag
        self.rows: list = []  # per index: request dict or None
        self.waiting: list = []
        self.done: list = []

    def submit(self, req):
        req.setdefault("output", [])
        req["ids"] = self.tokenizer(req["prompt"], add_special_tokens=False)["input_ids"]
        self.waiting.append(req)

    def _schedule(self, preempt=None, swap=False):
        removed = [i for i, r in enumerate(self.rows) if r is not None and (r["finished"] or r is preempt)]
        for i in removed:
            if self.rows[i] is preempt:
                self.waiting.append(preempt)  # resumed later with its output so far
            else:
                self.done.append(self.rows[i])
            self.rows[i] = None
            self.batch.remove(i)
        holes = sorted(removed)
        while self.waiting and (holes or len(self.rows) < self.slots):
            req = self.waiting.pop(0)
            req["finished"] = False
            i = holes.pop(0) if holes else len(self.rows)
            if i == len(self.rows):
                self.rows.append(None)
            self.rows[i] = req
            self.batch.add(i, req["prompt"], req["ids"], req["output"], req.get("steering"))
        while holes:  # condense: the last row moves down into the lowest hole, one way
            last = max(i for i, r in enumerate(self.rows) if r is not None) if any(self.rows) else -1
            hole = holes.pop(0)
            if hole < last:
                self.rows[hole], self.rows[last] = self.rows[last], None
                self.batch.move(last, hole, swap=False)
                holes.append(last)
                holes.sort()
        while self.rows and self.rows[-1] is None:
            self.rows.pop()
        if swap and len(self.rows) >= 2:
            self.rows[0], self.rows[1] = self.rows[1], self.rows[0]
            self.batch.move(0, 1, swap=True)

    def step(self, preempt=None, swap=False):
        self._schedule(preempt, swap)
        if not self.rows:
            return False
        for req in self.rows:  # the host fills the placeholders before the sampler, as vLLM's async path does
            if req["output"] and req["output"][-1] == -1:
                req["output"][-1] = req.pop("pending")
        logits = []
        for req in self.rows:
            ids = torch.tensor([req["ids"] + known_tokens(req["output"])])
            with torch.no_grad():
                logits.append(self.lm(ids).logits[0, -1].float())
        logits = torch.stack(logits)
        chosen = self.batch.apply(logits).argmax(-1).tolist()
        for req, token in zip(self.rows, chosen):
            if self.lag:
                req["output"].append(-1)  # a placeholder: the real id arrives with the next step
                req["pending"] = token
            else:
                req["output"].append(token)
            req["n"] = req.get("n", 0) + 1
            req["finished"] = token == self.tokenizer.eos_token_id or req["n"] >= req["max_tokens"]
        return True

    def run(self, preempt_at=None, swap_every=0):
        step = 0
        while self.waiting or any(r is not None for r in self.rows):
            preempt = None
            if preempt_at is not None and step == preempt_at and self.rows:
                preempt = self.rows[0]
            self.step(preempt, swap=bool(swap_every) and step % swap_every == 1)
            step += 1
        for req in self.done:
            if req["output"] and req["output"][-1] == -1:
                req["output"][-1] = req.pop("pending")
        return self.done


def alone(lm, tokenizer, req):
    terms = list(req["steering"].terms) if req.get("steering") else None
    k = req["steering"].k if req.get("steering") else len(tokenizer)
    out = steerkit.generate([req["prompt"]], lm=(lm, tokenizer), rewards=terms, k=k, do_sample=False,
                            max_new_tokens=req["max_tokens"])
    return out.sequences[0, :out.num_new_tokens[0]].tolist()


PROMPTS = ["The quick brown", "You are", "Numbers 0123 and", "I hate", "Café déjà vu", "The", "A cat sat", "Hello"]


def requests(reward):
    strong = Steering((steerkit.SteeringTerm(reward, 5.0, name="tiny"),), 5)
    away = Steering((steerkit.SteeringTerm(reward, -3.0, name="tiny"),), 3)
    plan = [strong, None, away, strong, None, away, strong, away]
    return [{"prompt": p, "max_tokens": 3 + (i * 5) % 9, "steering": s} for i, (p, s) in enumerate(zip(PROMPTS, plan))]


@pytest.mark.parametrize("lag", [False, True], ids=["in-step", "one-step-lag"])
@pytest.mark.parametrize("preempt_at,swap_every", [(None, 0), (4, 3)], ids=["plain", "preempt+swap"])
def test_rows_follow_the_host_batch_and_equal_generate_alone(lm, tokenizer, reward, lag, preempt_at, swap_every):
    batch = HostedBatch(tokenizer, [tokenizer.eos_token_id])
    host = Host(lm, tokenizer, batch, slots=3, lag=lag)
    reqs = requests(reward)
    for req in reqs:
        host.submit(req)
    host.run(preempt_at, swap_every)
    for req in reqs:
        assert req["output"] == alone(lm, tokenizer, req), req["prompt"]
    batch.apply(torch.zeros(0, len(tokenizer)))  # the host's next step: rows that left drop their sessions
    assert not batch.entries and not batch.groups


def test_a_failing_reward_ends_only_its_row(lm, tokenizer, reward):
    class Broken:
        name = "broken"

        def start(self, prompts, lm_tokenizer):
            raise RuntimeError("reward model exploded")

    batch = HostedBatch(tokenizer, [tokenizer.eos_token_id])
    host = Host(lm, tokenizer, batch, slots=4)
    good = {"prompt": "The quick brown", "max_tokens": 6,
            "steering": Steering((steerkit.SteeringTerm(reward, 5.0, name="tiny"),), 5)}
    bad = {"prompt": "You are", "max_tokens": 6, "steering": Steering((steerkit.SteeringTerm(Broken(), 1.0),), 5)}
    host.submit(good)
    host.submit(bad)
    host.run()
    assert good["output"] == alone(lm, tokenizer, good)
    assert bad["output"] == [tokenizer.eos_token_id]  # ended at once, with its EOS
    assert batch.stats["failed"] == 1


def test_parse_steering_reads_vllm_xargs_and_names_the_bad_field(reward):
    load = {"tiny": reward}.__getitem__
    steering = parse_steering({"rewards": ["tiny=-2.5"], "k": 7}, load=lambda ref, ctx: load(ref))
    assert steering.k == 7 and steering.terms[0].schedule.beta == -2.5 and steering.terms[0].reward is reward
    assert parse_steering({"rewards": {"tiny": 3}}, load=lambda ref, ctx: load(ref)).k == 20
    assert parse_steering({"other_processor": 1}) is None and parse_steering({"rewards": []}) is None
    for args, field in [({"rewards": {"tiny": "a lot"}}, "rewards"), ({"rewards": ["tiny=x"]}, "rewards"),
                        ({"rewards": {"tiny": 1}, "k": "5"}, "k"), ({"rewards": {"tiny": 1}, "k": 0}, "k"),
                        ({"k": 5}, "k")]:
        with pytest.raises(InvalidArgumentError) as info:
            parse_steering(args, load=lambda ref, ctx: load(ref))
        assert error_field(info.value) == field, (args, str(info.value))


def test_hf_directory_is_what_vllm_loads(tiny_backbone_dir):
    """A directory is its own Hugging Face directory; a hub id is vLLM's to fetch (packaged models: the vLLM tests)."""
    from steerkit.errors import ModelNotFoundError
    from steerkit.models import hf_directory

    assert hf_directory(str(tiny_backbone_dir)) == tiny_backbone_dir.resolve()
    with pytest.raises(ModelNotFoundError, match="hub id"):
        hf_directory("HuggingFaceTB/SmolLM2-135M-Instruct")

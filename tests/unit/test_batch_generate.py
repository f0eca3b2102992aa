"""``steerkit generate --input --output``: the records, their seeds, and resuming (no Ray here; see test_ray.py)."""

import json

import pytest
import torch

from steerkit.cli.main import main
from steerkit.config import SteeringConfig
from steerkit.distributed.batch import BatchJob, BatchSettings, prompt_set_name
from steerkit.errors import ConfigError, DataError
from steerkit.evaluation import EvalConfig, EvalRunner
from steerkit.rewards.model import RewardModel
from steerkit.testing import make_tokenizer, save_tiny_lm

PROMPTS = ["The quick", "I love", "This is", "Numbers and", "You are"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny LM and a tiny reward-model directory saved to disk (what a worker process loads by path)."""
    root = tmp_path_factory.mktemp("batch-models")
    tok = make_tokenizer()
    lm = save_tiny_lm(root / "lm", tok, seed=0)
    backbone = save_tiny_lm(root / "backbone", tok, seed=3)
    rm = RewardModel.from_backbone(str(backbone), 1, name="tiny-rm")
    torch.manual_seed(11)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    return str(lm), str(rm.save_pretrained(root / "rm"))


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "tiny_prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": {"text": t}}) + "\n" for i, t in enumerate(PROMPTS)))
    return path


def settings_for(models, prompt_file, **overrides) -> BatchSettings:
    lm, rm = models
    values = {"lm": lm, "k": 5, "max_new_tokens": 6, "num_return_sequences": 2, "seed": 3,
              "rewards": [{"name": rm, "beta": 5.0}], **overrides}
    return BatchSettings(SteeringConfig(**values), prompt_set_name(prompt_file))


def read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_one_record_per_prompt_and_sequence_with_chosen_token_rewards(tmp_path, models, prompt_file):
    from steerkit.distributed.batch import PromptGenerator
    from steerkit.evaluation.prompts import unit_seed

    settings = settings_for(models, prompt_file)
    job = BatchJob(settings, prompt_file, tmp_path / "out.jsonl")
    assert job.run() == len(PROMPTS)
    records = read(tmp_path / "out.jsonl")
    assert [(r["index"], r["sequence"]) for r in records] == [(i, j) for i in range(5) for j in range(2)]
    assert [r["prompt"] for r in records[::2]] == PROMPTS
    assert records[0]["settings"]["k"] == 5 and records[0]["settings"]["seed"] == 3
    assert records[0]["settings"]["prompt_set"] == "tiny" and records[0]["seed"] == unit_seed(3, "tiny", 0)
    # the reward of each chosen token = the reward model's score, from scratch, of the continuation up to it
    worker = PromptGenerator(settings)
    rm = worker.generator.terms[0].reward.model
    for index in (0, 3):
        out = worker.generator.generate([PROMPTS[index]], max_new_tokens=6, num_return_sequences=2,
                                        seed=unit_seed(3, "tiny", index))
        for j in range(2):
            record = records[2 * index + j]
            n = record["num_new_tokens"]
            ids = torch.tensor([[rm.config.start_token_id] + out.sequences[j, :n].tolist()])
            with torch.no_grad():
                expected = rm(ids).rewards[0, 1:].tolist()
            assert record["text"] == out.texts[j] and len(record["rewards"][models[1]]) == n
            assert record["rewards"][models[1]] == pytest.approx(expected, abs=1e-5)


def test_seeds_are_the_eval_runners_so_records_match_its_continuations(tmp_path, models, prompt_file):
    """Seed = f(run seed, prompt set, prompt index), the eval runner's: unsteered records equal its baseline."""
    lm, _ = models
    job = BatchJob(settings_for(models, prompt_file, rewards=[], k=20), prompt_file, tmp_path / "out.jsonl")
    job.run()
    texts = {(r["index"], r["sequence"]): r["text"] for r in read(tmp_path / "out.jsonl")}
    cfg = EvalConfig(task="toxicity", prompts=[{"path": str(prompt_file)}], lm=lm, reward=models[1], betas=[],
                     num_continuations=2, max_new_tokens=6, seed=3, output=str(tmp_path / "eval"))
    runner = EvalRunner(cfg, scorers=[], progress=False)
    runner.generate()
    for g in runner.generations:
        assert g["continuations"] == [texts[(g["index"], 0)], texts[(g["index"], 1)]]


def test_resume_redoes_a_torn_line_and_completes_a_partly_written_prompt(tmp_path, models, prompt_file):
    settings = settings_for(models, prompt_file)
    BatchJob(settings, prompt_file, tmp_path / "ref.jsonl").run()
    reference = (tmp_path / "ref.jsonl").read_bytes()
    lines = reference.splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines[:5]) + lines[5][:40])  # prompts 0, 1 whole; prompt 2: sequence 0 and a torn line
    job = BatchJob(settings, prompt_file, out)
    assert [p.index for p in job.pending()] == [2, 3, 4]
    assert job.run() == 3
    assert out.read_bytes() == reference  # nothing lost, nothing twice, same order
    assert BatchJob(settings, prompt_file, out).run() == 0  # a finished file: nothing to do


def test_other_settings_or_a_changed_input_are_refused(tmp_path, models, prompt_file):
    out = tmp_path / "out.jsonl"
    BatchJob(settings_for(models, prompt_file), prompt_file, out).run()
    with pytest.raises(ConfigError, match=r"other settings \(k changed\)"):
        BatchJob(settings_for(models, prompt_file, k=6), prompt_file, out)
    prompt_file.write_text(prompt_file.read_text().replace("I love", "I hate"))
    with pytest.raises(DataError, match="the input changed"):
        BatchJob(settings_for(models, prompt_file), prompt_file, out)


def test_cli_writes_the_same_records_as_the_library_and_says_what_is_wrong(tmp_path, models, prompt_file, capsys):
    lm, rm = models
    out = tmp_path / "cli.jsonl"
    args = ["generate", "--input", str(prompt_file), "--output", str(out), "--lm", lm, "-r", f"{rm}=5", "-k", "5",
            "-t", "6", "-n", "2", "--seed", "3"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    BatchJob(settings_for(models, prompt_file), prompt_file, tmp_path / "lib.jsonl").run()
    assert out.read_bytes() == (tmp_path / "lib.jsonl").read_bytes()
    capsys.readouterr()
    for extra, message in ((["some prompt"], "drop the prompt arguments"), (["--actors", "2"], "add --ray"),
                           (["--ray", "--actors"], "--ray needs an address")):
        with pytest.raises(SystemExit) as exit_:
            main(args + extra)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith("error:") and message in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--input", str(prompt_file)])
    assert exit_.value.code == 2 and "needs both --input" in capsys.readouterr().err


def test_missing_ray_is_a_typed_error_with_the_install_command(tmp_path, models, prompt_file, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # what `import ray` meets without the package
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--input", str(prompt_file), "--output", str(tmp_path / "o.jsonl"), "--lm", models[0],
              "--ray", "auto"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and 'pip install "steerkit-rad[ray]"' in err and not (tmp_path / "o.jsonl").exists()


def test_ray_auto_reads_the_address_file_of_rays_own_temp_dir(tmp_path, monkeypatch):
    """`--ray auto` looks where Ray itself keeps `ray_current_cluster` ($RAY_TMPDIR/ray first): a run or a test
    with a Ray temporary directory of its own never picks up the address a cluster left in /tmp/ray."""
    from steerkit.distributed.cluster import resolve_auto
    from steerkit.errors import ClusterUnreachableError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(ClusterUnreachableError, match="found no running Ray cluster"):
        resolve_auto()  # whatever /tmp/ray/ray_current_cluster holds on this machine
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6390\n", encoding="utf-8")
    assert resolve_auto() == "127.0.0.1:6390"
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert resolve_auto() == "10.1.2.3:6379"

"""``--ray``: sharded generation on a real Ray cluster equals single-process generation record for record.

One two-node cluster on 127.0.0.1 (``ray start --head`` + ``ray start --address``, 2 logical CPUs each, torn
down by the module fixture) serves every test here but the first, which starts its own with ``--ray local``.
Models are the tiny ones, saved to a directory so that the actors load them by path.
"""

import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve_support import free_port, ray_temp_dir, save_tiny_reward

from steerkit.cli.main import main
from steerkit.config import SteeringConfig
from steerkit.distributed.batch import BatchJob, BatchSettings, prompt_set_name
from steerkit.errors import ClusterResourcesError, ClusterUnreachableError

ray = pytest.importorskip("ray", reason='ray is not installed: pip install "steerkit-rad[ray]"')

pytestmark = pytest.mark.slow
PROMPTS = ["The quick", "I love", "This is", "Numbers and", "You are", "Café déjà", "The movie", "Hello there",
           "We went", "Apples and"]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "STEERKIT_THREADS": "1"}


@pytest.fixture(scope="module")
def ray_env():
    """Ray settings for every test here, and a Ray temporary directory of this module's own (short, whatever
    $TMPDIR is; its ray_current_cluster file is this module's, not one a cluster started earlier left in /tmp)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        mp.delenv("RAY_ADDRESS", raising=False)
        with ray_temp_dir(mp):
            yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from steerkit.testing import make_tokenizer, save_tiny_lm

    root = tmp_path_factory.mktemp("ray-models")
    tok = make_tokenizer()
    lm = save_tiny_lm(root / "lm", tok, seed=0)
    prompts = root / "tiny_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in PROMPTS))
    return {"lm": str(lm), "rm": str(save_tiny_reward(root, tok, name="tiny-rm")), "prompts": prompts}


def settings(models) -> BatchSettings:
    cfg = SteeringConfig(lm=models["lm"], k=5, max_new_tokens=8, num_return_sequences=2, seed=1,
                         rewards=[{"name": models["rm"], "beta": 5.0}])
    return BatchSettings(cfg, prompt_set_name(models["prompts"]))


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    """The single-process file every sharded run must reproduce byte for byte."""
    path = tmp_path_factory.mktemp("ray-ref") / "ref.jsonl"
    BatchJob(settings(models), models["prompts"], path).run()
    return path.read_bytes()


def cli_args(models, out, *extra):
    return ["generate", "--input", str(models["prompts"]), "--output", str(out), "--lm", models["lm"],
            "-r", f"{models['rm']}=5", "-k", "5", "-t", "8", "-n", "2", "--seed", "1", *extra]


def run_cli(args) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    return exit_.value.code


def test_ray_local_two_actors_write_the_single_process_file(ray_env, models, reference, tmp_path):
    """`--ray local` starts a Ray instance sized for the actors (ray.init(num_cpus=2)) and stops it after."""
    if ray.is_initialized():  # a test before, in this process, connected to the module's cluster: a CLI process
        ray.shutdown()  # is not connected, and a connection held already would be used as it is (cluster.connect)
    out = tmp_path / "local.jsonl"
    assert run_cli(cli_args(models, out, "--ray", "local", "--actors", "2")) == 0
    assert out.read_bytes() == reference
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def cluster_nodes(ray_env, tmp_path_factory):
    """Two Ray nodes on 127.0.0.1 (2 CPUs each), each `ray start --block` in its own session, killed at the end."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("ray-logs")
    common = ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
              "--num-gpus", "0", "--dashboard-agent-listen-port", "0"]
    # the `ray` of the environment running the tests, not whichever is first on PATH
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    head = [ray_cli, "start", "--head", "--port", str(port), "--include-dashboard=false",
            "--ray-client-server-port", str(free_port())]
    worker = [ray_cli, "start", "--address", address]
    procs = []
    try:
        for name, cmd in (("head", head), ("worker", worker)):
            with open(logs / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
                procs.append(subprocess.Popen(cmd + common, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            deadline = time.monotonic() + 60
            while not node_count_is(len(procs), address):  # bounded wait for the node to join
                if procs[-1].poll() is not None:
                    pytest.fail(f"ray {name} exited: {(logs / f'{name}.log').read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"ray {name} did not come up in 60 s: {(logs / f'{name}.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_sessions(procs)


@pytest.fixture
def cluster(cluster_nodes):
    """The module's cluster, this process connected to it whatever order the tests ran in (the `--ray local` test
    disconnects)."""
    if not ray.is_initialized():
        ray.init(address=cluster_nodes, log_to_driver=False)
    return cluster_nodes


def node_count_is(n: int, address: str) -> bool:
    if not ray.is_initialized():
        try:
            with socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2])), timeout=1):
                pass
        except OSError:
            return False
        ray.init(address=address, log_to_driver=False)
    return sum(1 for node in ray.nodes() if node["Alive"]) >= n


def stop_sessions(procs) -> None:
    """SIGKILL every process of each `ray start --block` session, and the workers its raylet started (they
    run in sessions of their own), collected before the kill."""
    import psutil

    members = []
    for p in procs:
        try:
            members += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(timeout=10)


def executor(actors: int, **kw):
    from steerkit.distributed.cluster import plan_actors
    from steerkit.distributed.executor import RayActors

    return RayActors(plan_actors(ray.cluster_resources(), actors=actors), **kw)


@pytest.mark.parametrize("actors", [2, 4])
def test_sharded_records_equal_single_process_records(cluster, models, reference, tmp_path, actors):
    out = tmp_path / "sharded.jsonl"
    ex = executor(actors, warmup=True)  # every actor loaded before the first prompt is sent: all of them work
    assert BatchJob(settings(models), models["prompts"], out).run(ex) == len(PROMPTS)
    assert out.read_bytes() == reference
    assert len(set(ex.pids.values())) == actors and len(ex.units_by_actor) == actors and ex.redone == 0


class SlowUnits:
    """The real worker, 0.3 s slower per prompt: a unit is surely unfinished when its actor is killed."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self):
        work = self.inner()

        def slow(unit):
            time.sleep(0.3)
            return work(unit)

        return slow


def test_a_killed_actor_has_its_prompts_redone_once_by_another(cluster, models, reference, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # SlowUnits travels by value to the actors
    out = tmp_path / "killed.jsonl"
    job = BatchJob(settings(models), models["prompts"], out)
    ex = executor(2, warmup=True)
    killed = []

    def advance(n):
        if not killed:  # after the first prompt is written: SIGKILL one worker process
            killed.append(ex.pids[1])
            os.kill(ex.pids[1], signal.SIGKILL)

    records = ex.map(job.pending(), SlowUnits(job.settings))
    for recs in records:
        job.store.extend(recs)
        advance(1)
    assert out.read_bytes() == reference  # every prompt exactly once, in order
    keys = [(r["index"], r["sequence"]) for r in map(json.loads, out.read_text().splitlines())]
    assert len(keys) == len(set(keys)) == 2 * len(PROMPTS)
    assert ex.actors_lost == 1 and ex.redone >= 1


def test_interrupted_run_resumes_to_the_same_file(cluster, models, reference, tmp_path):
    out = tmp_path / "interrupted.jsonl"

    def interrupt(n, seen=[]):  # noqa: B006 - counts calls
        seen.append(n)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        BatchJob(settings(models), models["prompts"], out).run(executor(2), advance=interrupt)
    assert len(out.read_text().splitlines()) == 3 * 2
    job = BatchJob(settings(models), models["prompts"], out)
    assert job.run() == len(PROMPTS) - 3  # resumed in one process: the scale may change between runs
    assert out.read_bytes() == reference


def test_eval_generation_stage_on_actors_equals_in_process(cluster, models, tmp_path):
    from steerkit.evaluation import EvalConfig, EvalRunner

    def run(out, executor=None):
        cfg = EvalConfig(task="toxicity", prompts=[{"path": str(models["prompts"]), "limit": 4}], lm=models["lm"],
                         reward=models["rm"], betas=[5], num_continuations=2, max_new_tokens=6,
                         output=str(tmp_path / out))
        runner = EvalRunner(cfg, scorers=[], progress=False, executor=executor)
        runner.generate()
        return [{k: v for k, v in r.items() if k != "seconds"} for r in runner.generations]

    assert run("ray", executor(2)) == run("local")


def test_missing_resources_and_unreachable_addresses_are_typed_errors(cluster, models, tmp_path, capsys):
    from steerkit.distributed.cluster import connect, plan_actors

    resources = ray.cluster_resources()
    with pytest.raises(ClusterResourcesError, match="no GPU"):
        plan_actors(resources, actors=2, device="cuda")
    with pytest.raises(ClusterResourcesError, match="need 8 CPUs; the Ray cluster has 4"):
        plan_actors(resources, actors=8)
    out = tmp_path / "o.jsonl"
    for extra, message in ((["--ray", cluster, "--gpus-per-actor", "1"], "no GPU"),
                           (["--ray", cluster, "--actors", "5"], "need 5 CPUs")):
        assert run_cli(cli_args(models, out, *extra)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and len(err.splitlines()) == 1
    assert not out.exists()
    ray.shutdown()  # a fresh process view: connect() itself probes the address
    try:
        dead = f"127.0.0.1:{free_port()}"
        start = time.monotonic()
        with pytest.raises(ClusterUnreachableError, match=f"No Ray cluster answers at {dead}"):
            connect(dead)
        assert time.monotonic() - start < 10
    finally:
        ray.init(address=cluster, log_to_driver=False)


def test_ctrl_c_on_the_driver_leaves_a_resumable_file(cluster, models, tmp_path):
    # 200 prompts, so that the run is still going when the signal arrives (10 tiny prompts can all be written
    # between the check for the second record and the signal, and the driver then exits 0)
    many = tmp_path / "many_prompts.jsonl"
    many.write_text("".join(json.dumps({"prompt": {"text": f"{t} {i}"}}) + "\n" for i in range(20) for t in PROMPTS))
    models = {**models, "prompts": many}
    BatchJob(settings(models), many, tmp_path / "reference.jsonl").run()
    reference = (tmp_path / "reference.jsonl").read_bytes()
    out = tmp_path / "sigint.jsonl"
    # a narrow width, so that the check below also proves the message is not wrapped (a long tmp path with it)
    env = {**os.environ, **RAY_ENV, "COLUMNS": "40"}
    args = [sys.executable, "-m", "steerkit", *cli_args(models, out, "--ray", cluster, "--actors", "2")]
    # the child must start with SIGINT at its default: a process that starts with it ignored (as a child of a pytest
    # process in which an earlier in-process Ray or server test left it ignored) never raises KeyboardInterrupt
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while not (out.exists() and out.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "the driver never wrote a record"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    # one line, whole: piped stderr is not wrapped at the console width, so a caller can match the message
    assert any(line.startswith("interrupted: ") and line.endswith("; rerun the same command to resume.")
               and str(out) in line for line in err.splitlines()), err
    done = out.read_text().count("\n")
    assert run_cli(cli_args(models, out)) == 0  # the same command without --ray resumes it too
    assert out.read_bytes() == reference and 2 <= done < 200

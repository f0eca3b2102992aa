"""`steerkit serve`'s app as Ray Serve replicas (steerkit.distributed.serve): the server's own API tests, run
against 2 replicas behind Ray Serve's proxy on 127.0.0.1 (a `--ray local` instance, stopped at the end).
Requests with the same seed land on either replica and must give the same text."""

from __future__ import annotations

import json
import os

import pytest

ray = pytest.importorskip("ray", reason='ray is not installed: pip install "steerkit-rad[ray]"')
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_serve_api import (  # noqa: E402,F401 - the server engineers' tests, collected here against the replicas
    test_a_list_of_prompts_is_prompt_major, test_completion_with_the_openai_client,
    test_same_seed_same_output_and_n_rows_use_seed_plus_i,
    test_without_a_seed_each_choice_reports_the_seed_that_reproduces_it,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    from serve_support import free_port, ray_temp_dir, save_tiny_reward

    from steerkit.config import SteeringConfig
    from steerkit.distributed.serve import ReplicaConfig, start_replicas
    from steerkit.testing import make_tokenizer, save_tiny_lm

    root = tmp_path_factory.mktemp("serve-models")
    tok = make_tokenizer()
    lm = save_tiny_lm(root / "lm", tok, seed=0)
    cfg = SteeringConfig(lm=str(lm), rewards=[{"name": str(save_tiny_reward(root, tok, name="tiny")), "beta": 5}],
                         k=8)
    port = free_port()
    with pytest.MonkeyPatch.context() as mp, ray_temp_dir(mp):  # short socket paths whatever $TMPDIR is
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.setenv("STEERKIT_PLUGINS", "")  # replicas load the config's reward only, not every installed plugin
        from ray import serve

        cluster = start_replicas(cfg, ReplicaConfig(replicas=2), address="local", port=port,
                                 engine_limits={"max_running": 8, "max_queue": 32})
        try:
            yield f"http://127.0.0.1:{port}", str(lm)
        finally:
            serve.shutdown()
            cluster.close()


@pytest.fixture(scope="module")
def client(replicas):
    return openai.OpenAI(base_url=replicas[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(replicas):
    return replicas[1]


def test_two_replicas_serve_the_models_endpoint(replicas):
    import httpx

    from ray import serve

    body = httpx.get(replicas[0] + "/v1/models", timeout=30).json()
    assert [m["id"] for m in body["data"]] == [replicas[1]]
    status = serve.status().applications["steerkit"].deployments["steerkit"]
    assert status.replica_states.get("RUNNING") == 2, json.dumps(str(status))
    assert os.environ.get("RAY_AUTH_MODE") == "disabled"


def test_ray_serve_hands_a_replica_as_many_requests_as_its_engine_holds():
    """Ray Serve gives a replica at most ``max_ongoing_requests`` requests at once (its default, 5, would cap each
    replica's continuous batch at 5 rows whatever ``--max-running`` says): steerkit's deployment sets it to the rows
    the replica's engine holds, running and queued."""
    from ray import serve

    from steerkit.distributed.serve import ReplicaConfig, max_ongoing_requests, replica_deployment
    from steerkit.serving.engine import DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING

    class Plain:
        pass

    assert serve.deployment(Plain).max_ongoing_requests < DEFAULT_MAX_RUNNING  # Ray's default: what this guards against
    assert max_ongoing_requests({"max_running": 8, "max_queue": 32}) == 40
    assert max_ongoing_requests(None) == DEFAULT_MAX_RUNNING + DEFAULT_MAX_QUEUE
    dep = replica_deployment(ReplicaConfig(replicas=2), engine_limits={"max_running": 8, "max_queue": 32})
    assert dep.max_ongoing_requests == 40 and dep.num_replicas == 2  # what serve.run is given, through Ray's API

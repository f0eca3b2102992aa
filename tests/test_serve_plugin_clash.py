"""`steerkit serve` with a reward name that two installed plugins register (issue 27).

The plugins are real distributions (dist-info directories with entry points on a directory put on sys.path),
written with :func:`steerkit.testing.write_distribution` as in tests/unit/test_plugin_conflicts.py:
``steerkit-toxicity`` (entry point ``toxicity``) and ``steerkit-impostor`` (entry point ``aaa-impostor``) both
register ``toxicity``, each as a tiny reward model of its own (different heads, so their reward traces differ).
The server serves each under its qualified name, warns at start-up with the ways to pick one, refuses the bare
name with the qualified choices, and serves the bare name from the provider ``--prefer`` (or
``STEERKIT_PREFER``) picks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_support import ServerThread, free_port, save_tiny_reward, start_serve, wait_healthy  # noqa: E402

from steerkit import registry  # noqa: E402
from steerkit.config import SteeringConfig  # noqa: E402
from steerkit.errors import SteerkitWarning  # noqa: E402
from steerkit.testing import make_tokenizer, save_tiny_lm, write_distribution  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PREFER = "STEERKIT_PREFER"  # the documented name, spelled out
REAL, IMPOSTOR = "steerkit-toxicity:toxicity", "steerkit-impostor:toxicity"

PLUGIN = '''
from steerkit import hookimpl, load_reward

@hookimpl
def register_reward_models(register):
    register("toxicity", lambda: load_reward({rm!r}), description={description!r})
'''

PACKAGES = {  # entry-point name: (distribution, version, module, head seed of its reward model)
    "toxicity": ("steerkit-toxicity", "0.1.0", "sk_clash_real", 11),
    "aaa-impostor": ("steerkit-impostor", "6.6.6", "sk_clash_impostor", 29),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-clash")
    tokenizer = make_tokenizer()
    lm = save_tiny_lm(root / "lm", tokenizer, seed=0)
    rms = {ep: save_tiny_reward(root / ep, tokenizer, name=f"{ep}-rm", head_seed=seed)
           for ep, (_, _, _, seed) in PACKAGES.items()}
    return lm, rms


@pytest.fixture
def site(tmp_path, monkeypatch, models):
    site = tmp_path / "site"
    site.mkdir()
    for ep, (dist, version, module, _) in PACKAGES.items():
        source = textwrap.dedent(PLUGIN).format(rm=str(models[1][ep]), description=f"{dist}'s toxicity")
        write_distribution(site, ep, dist, version, module, source)
    monkeypatch.syspath_prepend(str(site))
    # only these two plugins: the shipped rewards (if installed) would be loaded by the server too
    monkeypatch.setenv(registry.ENV_ALLOWLIST, ",".join(PACKAGES))
    monkeypatch.delenv(PREFER, raising=False)
    registry.reset()
    yield site
    registry.reset()
    for module in [m for m in sys.modules if m.startswith("sk_clash_")]:
        sys.modules.pop(module)


def start_engine(lm):
    """``Engine.from_config`` as ``steerkit serve`` calls it; the engine and the warnings it gave."""
    from steerkit.serving.engine import Engine

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = Engine.from_config(SteeringConfig(lm=str(lm), k=8), max_running=4, max_queue=16)
    return engine, [str(w.message) for w in caught if issubclass(w.category, SteerkitWarning)]


def serving(engine):
    from steerkit.serving.app import ServerSettings, create_app

    return ServerThread(create_app(engine, settings=ServerSettings(timeout_s=30)))


def complete(url, reward):
    body = {"prompt": "Hello there", "max_tokens": 6, "seed": 0, "rewards": {reward: 5}, "reward_trace": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def trace(url, reward):
    """The reward values a steered completion saw, step by step (they tell the two providers apart)."""
    r = complete(url, reward)
    assert r.status_code == 200, r.text
    items = r.json()["choices"][0]["reward_trace"]
    assert items
    return [list(item["rewards"].values()) for item in items]


def test_start_up_warns_and_serves_each_provider_by_its_qualified_name(site, models):
    engine, said = start_engine(models[0])
    [warning] = [w for w in said if "'toxicity'" in w]
    assert "registered by 2 plugins" in warning
    assert f"{IMPOSTOR!r} or {REAL!r}" in warning  # the qualified names requests can use
    assert "--prefer toxicity=PLUGIN" in warning and f"{PREFER}=toxicity=PLUGIN" in warning
    assert "steerkit-impostor or steerkit-toxicity" in warning
    with serving(engine) as server:
        served = httpx.get(server.url + "/v1/models").json()["data"][0]["steering"]["rewards"]
        assert {REAL, IMPOSTOR} <= set(served) and "toxicity" not in served
        real, impostor = trace(server.url, REAL), trace(server.url, IMPOSTOR)
        assert real != impostor  # two different rewards, not one served twice
        # the same request again: the same rewards, so the traces tell the providers apart. Up to float32 rounding:
        # on an Intel CPU with AVX-512, MKL's products depend on their inputs' memory alignment (MKL_CBWR), and a
        # reward here moved by 1.2e-7 between identical requests (docs/serving.md, "Determinism")
        again = trace(server.url, REAL)
        assert [len(step) for step in again] == [len(step) for step in real]
        assert [v for step in again for v in step] == pytest.approx([v for step in real for v in step], abs=1e-6)
        assert max(abs(a - b) for x, y in zip(real, impostor) for a, b in zip(x, y)) > 1e-3


def test_the_bare_name_is_a_400_listing_the_qualified_names(site, models):
    engine, _ = start_engine(models[0])
    with serving(engine) as server:
        r = complete(server.url, "toxicity")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unknown_reward"
    assert f"{IMPOSTOR!r}, {REAL!r}" in error["message"] and "registered by 2 plugins" in error["message"]
    assert "Did you mean" not in error["message"] and "--prefer toxicity=PLUGIN" in error["message"]


def test_a_preference_serves_the_bare_name_from_the_chosen_provider(site, models, monkeypatch):
    monkeypatch.setenv(PREFER, "toxicity=steerkit-impostor")
    registry.reset()
    engine, said = start_engine(models[0])
    assert not [w for w in said if "'toxicity'" in w]  # the clash is resolved: nothing to warn about
    with serving(engine) as server:
        served = httpx.get(server.url + "/v1/models").json()["data"][0]["steering"]["rewards"]
        assert {"toxicity", REAL, IMPOSTOR} <= set(served)
        bare = trace(server.url, "toxicity")
        assert bare == trace(server.url, IMPOSTOR) != trace(server.url, REAL)


def serve_process(site, lm, *args):
    port = free_port()
    env = {registry.ENV_ALLOWLIST: ",".join(PACKAGES), "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    proc = start_serve(["--lm", str(lm), *args], port, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def stop(proc) -> str:
    """Stop the server; its stderr."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=30)[1]


@pytest.mark.slow
def test_serve_cli_warns_and_prefer_picks_the_provider(site, models):
    proc, url = serve_process(site, models[0])
    try:
        assert complete(url, "toxicity").status_code == 400
        impostor = trace(url, IMPOSTOR)
    finally:
        err = stop(proc)
    [line] = [line for line in err.splitlines() if line.startswith("warning: reward 'toxicity'")]
    assert "--prefer toxicity=PLUGIN" in line and REAL in line and IMPOSTOR in line

    proc, url = serve_process(site, models[0], "--prefer", "toxicity=steerkit-impostor")
    try:
        assert trace(url, "toxicity") == impostor  # the bare name is the impostor's reward now
        assert trace(url, REAL) != impostor
    finally:
        err = stop(proc)
    assert "warning: reward 'toxicity'" not in err

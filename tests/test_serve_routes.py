"""Each endpoint of `steerkit serve` is a router module of `steerkit.serving.routes` whose handlers take the engine,
settings and metrics from the app they are mounted on (`app.state.server`, through a dependency), not from a
closure: a single router mounted on a bare FastAPI app with a tiny engine serves its endpoint, and nothing else,
without `create_app`; and `create_app` includes exactly the routers of `ROUTERS`, in order."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI  # noqa: E402
from serve_support import ServerThread, tiny_engine, tiny_parts  # noqa: E402

from steerkit.serving.app import ServerSettings, create_app  # noqa: E402
from steerkit.serving.errors_http import install  # noqa: E402
from steerkit.serving.metrics import ServerMetrics  # noqa: E402
from steerkit.serving.routes import ROUTERS, completions, health, models, paths, state  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ENDPOINTS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/"]


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def bare_app(engine, router, *, with_lifespan: bool = False, model_name: str | None = None, **settings) -> FastAPI:
    """A FastAPI app with nothing but ``router``, the error handlers and a Server (and, if asked, the lifespan
    that starts and stops the engine)."""
    app = FastAPI(lifespan=state.lifespan if with_lifespan else None)
    metrics = ServerMetrics()
    state.attach(app, state.Server(engine, ServerSettings(**settings), metrics, model_name or engine.model_name))
    install(app)
    app.include_router(router)
    return app


def test_every_endpoint_is_one_router_and_create_app_includes_them_in_order(parts):
    assert [[route.path for route in router.routes] for router in ROUTERS] == [[path] for path in ENDPOINTS]
    assert paths() == frozenset(ENDPOINTS)
    app = create_app(tiny_engine(parts), settings=ServerSettings())
    assert list(app.openapi()["paths"]) == ENDPOINTS
    assert isinstance(app.state.server, state.Server) and app.state.server.settings is app.state.settings
    assert app.state.draining is False


def test_the_models_router_alone_serves_its_endpoint_and_nothing_else(parts):
    engine = tiny_engine(parts, max_queue=32)
    with ServerThread(bare_app(engine, models.router)) as server:
        listed = httpx.get(server.url + "/v1/models", timeout=30)
        missing = httpx.get(server.url + "/health", timeout=30)
    assert listed.status_code == 200
    [model] = listed.json()["data"]
    assert model["id"] == engine.model_name and model["steering"]["rewards"] == ["tiny"]
    assert model["steering"]["max_queue"] == 32
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_one_router_object_serves_each_app_its_own_server(parts):
    first = bare_app(tiny_engine(parts), models.router, model_name="first")
    second = bare_app(tiny_engine(parts), models.router, model_name="second")
    with ServerThread(first) as one, ServerThread(second) as two:
        names = [httpx.get(s.url + "/v1/models", timeout=30).json()["data"][0]["id"] for s in (one, two)]
    assert names == ["first", "second"]


def test_the_health_router_alone_reads_draining_from_its_app(parts):
    app = bare_app(tiny_engine(parts), health.router, model_name="tiny-health")
    with ServerThread(app) as server:
        stopped = httpx.get(server.url + "/health", timeout=30)  # no lifespan here: the engine never started
        app.state.draining = True
        draining = httpx.get(server.url + "/health", timeout=30)
    assert stopped.status_code == 503 and stopped.json()["status"] == "engine stopped"
    assert stopped.json()["model"] == "tiny-health" and stopped.json()["alive"] is False
    assert draining.status_code == 503 and draining.json()["status"] == "draining"


def test_the_completions_router_alone_completes_checks_and_drains(parts):
    engine = tiny_engine(parts, max_running=4, max_queue=8)
    app = bare_app(engine, completions.router, with_lifespan=True, max_n=2, timeout_s=30)
    with ServerThread(app) as server:
        url = server.url + "/v1/completions"
        done = httpx.post(url, json={"prompt": "The quick brown", "max_tokens": 4, "seed": 3}, timeout=60)
        too_many = httpx.post(url, json={"prompt": "x", "n": 3}, timeout=60)
        elsewhere = httpx.post(url, json={"prompt": "x", "model": "not-this-one"}, timeout=60)
        chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=60)
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["object"] == "text_completion" and body["model"] == engine.model_name
    assert isinstance(body["choices"][0]["text"], str) and body["usage"]["completion_tokens"] >= 1
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "model_not_found"
    assert chat.status_code == 404
    assert app.state.draining is True and engine.stats()["alive"] is False  # the lifespan shut the engine down

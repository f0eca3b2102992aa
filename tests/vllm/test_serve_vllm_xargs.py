"""`steerkit serve` takes vLLM's `vllm_xargs` form of steering beside its own fields (one client, two servers;
docs/serving.md): the same text as the native fields, and a 400 naming the field for a bad value. Runs in the main
suite on a tiny engine (no vLLM needed); tests/vllm/test_vllm_server.py runs one client against both servers."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_support import ServerThread, tiny_engine, tiny_parts  # noqa: E402

from steerkit.serving.app import ServerSettings, create_app  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client():
    engine = tiny_engine(tiny_parts(), max_running=4, max_queue=8)
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=30))) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    engine.shutdown(5)


def complete(client, **extra):
    out = client.completions.create(model=None, prompt="The quick brown", max_tokens=8, temperature=0,
                                    extra_body=extra)
    return out.choices[0].text


def test_vllm_xargs_mean_what_the_native_fields_mean(client):
    native = complete(client, rewards={"tiny": 5.0}, k=4)
    assert complete(client, vllm_xargs={"rewards": ["tiny=5"], "k": 4}) == native
    assert complete(client, vllm_xargs={"rewards": "tiny=5", "k": 4}) == native
    assert complete(client, vllm_xargs={"rewards": {"tiny": 5}}, k=4) == native
    assert complete(client, vllm_xargs={"rewards": []}, k=4) == complete(client, rewards={}, k=4)


@pytest.mark.parametrize("xargs,extra,param,words", [
    ({"rewards": ["tiny"]}, {}, "vllm_xargs", "REF=BETA"),
    ({"rewards": ["tiny=x"]}, {}, "vllm_xargs", "not a number"),
    ({"rewards": ["nope=3"]}, {}, "vllm_xargs.rewards.0", "unknown reward 'nope'"),
    ({"k": "5"}, {}, "vllm_xargs", "integer"),
    ({"k": 0, "rewards": ["tiny=1"]}, {}, "k", "k must be"),
    ({"top_k": 5}, {}, "vllm_xargs", "vllm_xargs.top_k is not a steering field"),
    ({"k": 5}, {"k": 3}, "k", "given twice"),
    ("tiny=1", {}, "vllm_xargs", "must be an object"),
])
def test_a_bad_vllm_xargs_value_is_a_400_naming_the_field(client, xargs, extra, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, vllm_xargs=xargs, **extra)
    error = info.value.body.get("error", info.value.body)
    assert (error["param"], info.value.status_code) == (param, 400), error
    assert words in error["message"], error["message"]

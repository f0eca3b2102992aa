"""Every bad request to `steerkit serve` gets a 4xx with an OpenAI error body that names the field and says what
to fix: never a 500, never a traceback (a real uvicorn server on a tiny engine, httpx and the openai client)."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_support import ServerThread, tiny_engine, tiny_parts  # noqa: E402

from steerkit.serving.app import ServerSettings, create_app  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine(tiny_parts(), max_running=4, max_queue=8)
    app = create_app(engine, settings=ServerSettings(timeout_s=30, max_n=4, max_tokens_limit=100,
                                                     max_body_bytes=200_000))
    with ServerThread(app) as running:
        running.engine = engine
        yield running


OK = {"prompt": "Hello", "max_tokens": 3}

# (request body, status, param, words the message must contain)
BAD_BODIES = [
    ({**OK, "rewards": {"toxicty": -5}}, 400, "rewards.toxicty", "unknown reward 'toxicty'"),
    ({**OK, "rewards": [{"name": "nope", "beta": 1}]}, 400, "rewards.0.name", "unknown reward 'nope'"),
    ('{"prompt": "Hello", "rewards": {"tiny": 1e999}}', 400, "rewards", "finite"),
    ('{"prompt": "Hello", "rewards": [{"name": "tiny", "beta": -1e999}]}', 400, "rewards", "finite"),
    ('{"prompt": "Hello", "rewards": {"tiny": 1%s}}' % ("0" * 400), 400, "rewards", "finite"),
    ('{"prompt": "Hello", "rewards": {"\\ud800": 1}}', 400, "rewards.\\ud800", "unknown reward"),
    ({**OK, "rewards": {"tiny": "strong"}}, 400, "rewards", "must be a number"),
    ({**OK, "rewards": {"tiny": 1e31}}, 400, "rewards", "too large"),
    ({**OK, "rewards": [{"name": "tiny"}]}, 400, "rewards", "beta"),
    ({**OK, "rewards": [{"name": "tiny", "beta": 1, "schedule": "cubic"}]}, 400, "rewards", "schedule"),
    ({**OK, "rewards": "tiny=3"}, 400, "rewards", "mapping reward names to beta"),
    ({**OK, "k": 0}, 400, "k", "k must be an integer in [1,"),
    ({**OK, "k": 10**6}, 400, "k", "k must be an integer in [1,"),
    ({**OK, "k": "20"}, 400, "k", "valid integer"),
    ({**OK, "k": 2.5}, 400, "k", "valid integer"),
    ({**OK, "k": True}, 400, "k", "valid integer"),
    ({"prompt": "", "max_tokens": 3}, 400, "prompt", "empty"),
    ({"prompt": "   ", "max_tokens": 3}, 400, "prompt", "empty"),
    ({"prompt": [], "max_tokens": 3}, 400, "prompt", "non-empty list"),
    ({"prompt": [1, 2, 3], "max_tokens": 3}, 400, "prompt", "token-id prompts are not supported"),
    ({"max_tokens": 3}, 400, "prompt", "Field required"),
    ({"prompt": "The quick brown fox " * 60, "max_tokens": 50}, 400, "prompt", "context"),
    ({**OK, "max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
    ({**OK, "max_tokens": 101}, 400, "max_tokens", "at most 100"),
    ({**OK, "max_tokens": "3"}, 400, "max_tokens", "valid integer"),
    ({**OK, "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
    ({**OK, "temperature": "hot"}, 400, "temperature", "valid number"),
    ({**OK, "temperature": 1e-50}, 400, "temperature", "send temperature 0 for greedy decoding"),
    ('{"prompt": "\\ud800 lone", "max_tokens": 3}', 400, "prompt", "lone surrogate"),
    ('{"prompt": "Hi", "max_tokens": 3, "stop": ["\\udc80"]}', 400, "stop", "lone surrogate"),
    ({**OK, "rewards": [{"name": "tiny", "beta": 1}, {"name": "tiny", "beta": 2}]}, 400, "rewards", "label"),
    ({**OK, "n": 0}, 400, "n", "greater than or equal to 1"),
    ({**OK, "n": 5}, 400, "n", "at most 4"),
    ({**OK, "seed": 1.5}, 400, "seed", "valid integer"),
    ({**OK, "seed": 2**64}, 400, "seed", "less than or equal to 18446744073709551615"),
    ({**OK, "stop": ""}, 400, "stop", "non-empty"),
    ({**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({**OK, "stream": "yes"}, 400, "stream", "valid boolean"),
    ({**OK, "reward_trace": 1}, 400, "reward_trace", "valid boolean"),
    ({**OK, "rewads": {}}, 400, "rewads", "did you mean 'rewards'"),
    ({**OK, "top_p": 0.5}, 400, "top_p", "does not implement"),
    ({**OK, "logprobs": 3}, 400, "logprobs", "does not implement"),
    ({**OK, "model": "gpt-4o"}, 404, "model", "is not served here"),
]


def assert_error_body(response, status, param, words):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["param"] == param, error
    assert words in error["message"], error
    assert "Traceback" not in response.text and 'File "' not in response.text
    return error


@pytest.mark.parametrize("body, status, param, words", BAD_BODIES,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD_BODIES)])
def test_bad_completion_request(server, body, status, param, words):
    sent = {"content": body.encode(), "headers": {"content-type": "application/json"}} if isinstance(body, str) \
        else {"json": body}
    assert_error_body(httpx.post(server.url + "/v1/completions", timeout=30, **sent), status, param, words)


@pytest.mark.parametrize("body, param, words", [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role", "'user'"),
    ({"messages": [{"role": "user"}]}, "messages.0.content", "Field required"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages.0.content",
     "images and audio are not supported"),
    ({"messages": [{"role": "user", "content": "  "}]}, "messages", "all empty"),  # issue 24 item 6: param named
    ({"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "ab\ud800c"}]},
     "messages.1.content", "at position 2"),  # the position in the user's own text, not in the templated prompt
    ({"messages": [{"role": "user", "content": "hi"}], "rewards": {"tiny": float("nan")}}, "rewards", "finite"),
    ({"messages": [{"role": "user", "content": "hi " * 300}], "max_tokens": 5}, "messages", "context"),
])
def test_bad_chat_request(server, body, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   content=__import__("json").dumps(body).encode(), headers={"content-type": "application/json"})
    assert_error_body(r, 400, param, words)


@pytest.mark.parametrize("content, headers, words", [
    (b'{"prompt": "hi", ', {"content-type": "application/json"}, "not valid JSON"),
    (b'{"prompt": "hi", "rewards": {"tiny": NaN}}', {"content-type": "application/json"}, "finite"),
    (b'{"prompt": "hi", "rewards": {"tiny": Infinity}}', {"content-type": "application/json"}, "finite"),
    (b'["hi"]', {"content-type": "application/json"}, "must be a JSON object"),
    (b'\xff\xfe', {"content-type": "application/json"}, "not valid JSON"),
    (b'', {"content-type": "application/json"}, "body is empty"),
    (b'[' * 100_000, {"content-type": "application/json"}, "nested too deeply"),
])
def test_malformed_bodies(server, content, headers, words):
    r = httpx.post(server.url + "/v1/completions", content=content, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_an_oversized_body_is_refused_before_it_is_parsed(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 300_000}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_routes_and_methods(server):
    r = httpx.get(server.url + "/v1/engines")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]["message"]


def test_the_openai_client_raises_its_typed_errors(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.engine.model_name, prompt="hi", extra_body={"k": -1})
    assert info.value.body["param"] == "k"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="hi")


def test_the_server_still_serves_after_every_bad_request(server):
    r = httpx.post(server.url + "/v1/completions", json=OK, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert server.engine.stats()["running"] == 0


@pytest.mark.parametrize("headers", [{"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "text/plain"}, {"content-type": "application/xml"}, {}])
def test_a_body_that_is_not_declared_json_is_refused_415(server, headers):
    """A web page may POST a form, text/plain or a typeless body to any origin without a CORS preflight, never
    JSON: the API takes only `Content-Type: application/json` (issue 24 item 4; `curl -d` needs
    `-H 'Content-Type: application/json'`), and says how to send it."""
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "Hello", "max_tokens": 2}', headers=headers,
                   timeout=30)
    error = assert_error_body(r, 415, "Content-Type", "application/json")
    assert error["code"] == "unsupported_media_type"

"""Perspective API scorer against a local HTTP server on 127.0.0.1 speaking the documented format."""

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from steerkit.errors import PluginError
from steerkit.evaluation.scorers import load_scorer
from steerkit.evaluation.scorers.perspective import DEFAULT_URL, PerspectiveScorer, RateLimiter


class FakePerspective:
    """Serves scripted responses: a queue of (status, body, headers); afterwards 200 with a score."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[tuple[int, dict, dict]] = []
        self.on_request = None  # called with each request's record as it arrives (e.g. to stamp a fake clock)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                fake.requests.append({"body": body, "query": query, "path": self.path})
                if fake.on_request is not None:
                    fake.on_request(fake.requests[-1])
                if fake.script:
                    status, payload, headers = fake.script.pop(0)
                else:
                    text = body["comment"]["text"]
                    value = min(1.0, text.lower().count("idiot") * 0.9 + 0.01 * len(text) / 100)
                    status, payload, headers = 200, {"attributeScores": {attr: {
                        "spanScores": [{"begin": 0, "end": len(text), "score": {"value": value, "type": "PROBABILITY"}}],
                        "summaryScore": {"value": value, "type": "PROBABILITY"}} for attr in body["requestedAttributes"]},
                        "languages": ["en"], "detectedLanguages": ["en"]}, {}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1alpha1/comments:analyze"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    fake = FakePerspective()
    yield fake
    fake.close()


def make(server, tmp_path, **kw):
    sleeps: list[float] = []
    scorer = PerspectiveScorer(api_key="test-key", url=server.url, cache=tmp_path / "cache.sqlite",
                               sleep=sleeps.append, qps=1000, **kw)
    return scorer, sleeps


def test_request_format_and_parsing(server, tmp_path):
    scorer, _ = make(server, tmp_path)
    assert scorer.score(["you idiot", "hello there"]) == pytest.approx([0.9 + 0.0009, 0.0011])
    req = server.requests[0]
    assert req["query"]["key"] == ["test-key"]
    assert req["body"]["comment"] == {"text": "you idiot"}
    assert req["body"]["requestedAttributes"] == {"TOXICITY": {}}
    assert req["body"]["languages"] == ["en"] and req["body"]["doNotStore"] is True


def test_429_then_success_is_retried_with_backoff(server, tmp_path):
    server.script = [(429, {"error": {"code": 429, "message": "Quota exceeded"}}, {}),
                     (503, {"error": {"message": "unavailable"}}, {"Retry-After": "7"})]
    scorer, sleeps = make(server, tmp_path, backoff=0.5)
    assert scorer.score(["you idiot"]) == pytest.approx([0.9009])
    assert len(server.requests) == 3 and scorer.requests == 3
    backoffs = [s for s in sleeps if s >= 0.5]
    assert backoffs == [0.5, 7.0]  # 0.5·2^0, then Retry-After (7) beats 0.5·2^1


def test_gives_up_after_max_retries(server, tmp_path):
    server.script = [(429, {"error": {"message": "Quota exceeded"}}, {})] * 10
    scorer, sleeps = make(server, tmp_path, max_retries=2, backoff=1.0)
    with pytest.raises(PluginError, match="failed after 3 attempts.*HTTP 429: Quota exceeded"):
        scorer.score(["text"])
    assert len(server.requests) == 3
    assert [s for s in sleeps if s >= 1.0] == [1.0, 2.0]


def test_client_errors_are_not_retried(server, tmp_path):
    server.script = [(400, {"error": {"code": 400, "message": "Attribute TOXICITY does not support request languages: xx"}}, {})]
    scorer, _ = make(server, tmp_path)
    with pytest.raises(PluginError, match="HTTP 400: Attribute TOXICITY does not support"):
        scorer.score(["bonjour"])
    assert len(server.requests) == 1


def test_malformed_response_is_a_clear_error(server, tmp_path):
    server.script = [(200, {"attributeScores": {}}, {})]
    scorer, _ = make(server, tmp_path)
    with pytest.raises(PluginError, match="summaryScore.value"):
        scorer.score(["x"])


def test_disk_cache_avoids_repeat_requests_across_instances(server, tmp_path):
    scorer, _ = make(server, tmp_path)
    first = scorer.score(["you idiot", "a", "you idiot"])
    assert len(server.requests) == 2  # the repeated text is served from the cache
    again, _ = make(server, tmp_path)  # a new process would open the same file
    assert again.score(["a", "you idiot"]) == [first[1], first[0]]
    assert len(server.requests) == 2
    other_attr, _ = make(server, tmp_path, attribute="INSULT")
    other_attr.score(["a"])
    assert len(server.requests) == 3  # cache keys include the attribute
    uncached, _ = make(server, tmp_path, use_cache=False)
    uncached.score(["a"])
    assert len(server.requests) == 4


def test_empty_text_scores_zero_without_a_request(server, tmp_path):
    scorer, _ = make(server, tmp_path)
    assert scorer.score(["", "   "]) == [0.0, 0.0]
    assert server.requests == []


def test_rate_limiter_spaces_requests():
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    limiter = RateLimiter(2.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):
        limiter.wait()
    assert sleeps == pytest.approx([0.5, 0.5])
    now[0] += 10  # idle long enough: no wait
    limiter.wait()
    assert len(sleeps) == 2


def test_rate_limit_applies_to_real_requests(server, tmp_path):
    """Real HTTP requests at 20 QPS arrive at least 0.05 s apart on the scorer's clock. The clock is a fake that
    moves only when the scorer sleeps or the server says a request took time, so the outcome does not depend on
    how fast this machine serves the requests (on a loaded one they can take longer than the interval)."""
    now = [1000.0]
    sleeps: list[float] = []
    latency = [0.0]  # fake seconds each request takes on the server

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    def arrived(record):
        record["at"] = now[0]
        now[0] += latency[0]

    server.on_request = arrived
    scorer = PerspectiveScorer(api_key="k", url=server.url, cache=tmp_path / "c.sqlite", qps=20, sleep=sleep,
                               clock=lambda: now[0])
    assert scorer.score(["a", "b", "c"]) == pytest.approx([0.0001] * 3)
    arrivals = [r["at"] for r in server.requests]
    assert len(arrivals) == 3 and all(b - a >= 0.05 - 1e-9 for a, b in zip(arrivals, arrivals[1:]))
    assert sleeps == pytest.approx([0.05, 0.05])  # instant requests: the scorer waits out each whole interval
    # requests that take 0.03 s count towards the interval: only the rest is slept; 0.1 s ones need no wait
    for seconds, expected in ((0.03, [0.02, 0.02]), (0.1, [])):
        latency[0], sleeps[:] = seconds, []
        server.requests.clear()
        now[0] += 10  # idle long enough: the first request goes at once
        assert len(scorer.score([f"{seconds} {t}" for t in "abc"])) == 3
        arrivals = [r["at"] for r in server.requests]
        assert len(arrivals) == 3 and all(b - a >= 0.05 - 1e-9 for a, b in zip(arrivals, arrivals[1:]))
        assert sleeps == pytest.approx(expected)


def test_needs_a_key_for_the_real_endpoint(monkeypatch):
    monkeypatch.delenv("PERSPECTIVE_API_KEY", raising=False)
    with pytest.raises(PluginError, match="PERSPECTIVE_API_KEY"):
        PerspectiveScorer(url=DEFAULT_URL)


def test_loaded_through_the_registry_with_options(server, tmp_path, monkeypatch):
    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path))
    scorer = load_scorer(f"perspective:url={server.url},api_key=abc,qps=100")
    assert scorer.name == "perspective" and scorer.measures == "toxicity"
    assert scorer.score(["you idiot"]) == pytest.approx([0.9009])
    assert (tmp_path / "perspective" / "scores.sqlite").exists()

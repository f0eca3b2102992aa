"""Perspective API scorer: the paper's toxicity judge, for users who have an API key.

* Rate limiting: at most ``qps`` requests per second (Perspective's default quota is 1 QPS).
* Retries: HTTP 429 and 5xx responses and network errors are retried with exponential backoff
  (``backoff · 2^attempt`` seconds, capped at ``max_backoff``; a ``Retry-After`` header wins when larger),
  up to ``max_retries`` times.
* Cache: every score is stored in an SQLite file (``$STEERKIT_CACHE/perspective/scores.sqlite`` by
  default), keyed by attribute, languages and the SHA-256 of the text, so re-running an evaluation or
  resuming an interrupted one never pays for the same text twice.

Only the documented request/response shapes are used::

    POST {url}?key=KEY  {"comment": {"text": ...}, "requestedAttributes": {"TOXICITY": {}},
                         "languages": ["en"], "doNotStore": true}
    200  {"attributeScores": {"TOXICITY": {"summaryScore": {"value": 0.12, "type": "PROBABILITY"}}}}

Empty or whitespace-only texts (which Perspective rejects) score 0.0 without a request.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from ...errors import PluginError
from .base import BaseScorer

DEFAULT_URL = "https://commentanalyzer.googleapis.com/v1alpha1/comments:analyze"
RETRY_STATUS = {429, 500, 502, 503, 504}


class RateLimiter:
    """Spaces calls at least ``1/qps`` seconds apart (monotonic clock; injectable for tests)."""

    def __init__(self, qps: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if not qps > 0:
            raise PluginError(f"Perspective qps must be > 0, got {qps!r}.")
        self.interval, self.clock, self.sleep = 1.0 / qps, clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = self.clock()
            if now < self._next:
                self.sleep(self._next - now)
                now = self._next
            self._next = now + self.interval


class ScoreCache:
    """A tiny SQLite key-value store of scores (safe across processes, nothing pickled)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
        self._conn.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, value REAL NOT NULL)")
        self._conn.commit()

    def get(self, key: str) -> float | None:
        row = self._conn.execute("SELECT value FROM scores WHERE key = ?", (key,)).fetchone()
        return None if row is None else float(row[0])

    def put(self, key: str, value: float) -> None:
        self._conn.execute("INSERT OR REPLACE INTO scores (key, value) VALUES (?, ?)", (key, float(value)))
        self._conn.commit()

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]

    def close(self) -> None:
        self._conn.close()


class PerspectiveScorer(BaseScorer):
    name = "perspective"
    measures = "toxicity"

    def __init__(self, api_key: str | None = None, attribute: str = "TOXICITY", url: str = DEFAULT_URL,
                 languages: tuple[str, ...] | list[str] = ("en",), qps: float = 1.0, max_retries: int = 6,
                 backoff: float = 1.0, max_backoff: float = 64.0, timeout: float = 30.0,
                 cache: str | os.PathLike | None = None, use_cache: bool = True,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.api_key = api_key or os.environ.get("PERSPECTIVE_API_KEY")
        if not self.api_key and url == DEFAULT_URL:
            raise PluginError("The perspective scorer needs an API key: set PERSPECTIVE_API_KEY or pass "
                              "api_key=... (scorer option perspective:api_key=...). Without one, use the offline "
                              "scorers tox-block or alt-profanity-check.")
        if max_retries < 0 or backoff < 0:
            raise PluginError("Perspective max_retries and backoff must be >= 0.")
        self.attribute, self.url, self.languages = attribute.upper(), url, list(languages)
        self.max_retries, self.backoff, self.max_backoff, self.timeout = int(max_retries), backoff, max_backoff, timeout
        self.sleep = sleep
        self.limiter = RateLimiter(qps, clock=clock, sleep=sleep)
        self.description = (f"Perspective API {self.attribute} summary score (the paper's judge); "
                            f"{qps:g} QPS, cached on disk.")
        self.batch_size = 64
        self.requests = 0  # HTTP requests sent, retries included
        if use_cache:
            from ...files import cache_dir

            self.cache: ScoreCache | None = ScoreCache(Path(cache) if cache else cache_dir() / "perspective" / "scores.sqlite")
        else:
            self.cache = None

    def key(self, text: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return f"{self.attribute}|{','.join(self.languages)}|{digest}"

    def _score(self, texts: list[str]) -> list[float]:
        out = []
        for text in texts:
            if not text.strip():
                out.append(0.0)
                continue
            key = self.key(text)
            cached = self.cache.get(key) if self.cache is not None else None
            if cached is None:
                cached = self._request(text)
                if self.cache is not None:
                    self.cache.put(key, cached)
            out.append(cached)
        return out

    def _request(self, text: str) -> float:
        body = json.dumps({"comment": {"text": text}, "requestedAttributes": {self.attribute: {}},
                           "languages": self.languages, "doNotStore": True}).encode("utf-8")
        url = self.url + ("&" if "?" in self.url else "?") + urllib.parse.urlencode({"key": self.api_key or ""})
        last = ""
        for attempt in range(self.max_retries + 1):
            self.limiter.wait()
            self.requests += 1
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
            retry_after = 0.0
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return self._parse(json.loads(response.read().decode("utf-8")))
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code not in RETRY_STATUS:
                    raise PluginError(f"Perspective API returned HTTP {exc.code}: {detail}") from None
                last = f"HTTP {exc.code}: {detail}"
                retry_after = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = f"network error: {getattr(exc, 'reason', exc)}"
            except json.JSONDecodeError as exc:
                raise PluginError(f"Perspective API returned invalid JSON: {exc}") from None
            if attempt < self.max_retries:
                self.sleep(max(min(self.backoff * (2 ** attempt), self.max_backoff), retry_after))
        raise PluginError(f"Perspective API failed after {self.max_retries + 1} attempts ({last}). "
                          "Lower qps, raise max_retries, or check the key's quota.")

    def _parse(self, data: dict) -> float:
        try:
            value = data["attributeScores"][self.attribute]["summaryScore"]["value"]
        except (KeyError, TypeError):
            raise PluginError(f"Perspective response has no attributeScores.{self.attribute}.summaryScore.value: "
                              f"{json.dumps(data)[:300]}") from None
        return float(value)


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read().decode("utf-8"))
        return str(data.get("error", {}).get("message", data))[:300]
    except Exception:  # noqa: BLE001 - any unreadable body
        return str(exc.reason)


def _retry_after(value: str | None) -> float:
    try:
        return max(float(value), 0.0) if value else 0.0
    except ValueError:
        return 0.0

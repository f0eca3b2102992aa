"""`steerkit serve` under load and disconnects, as issue 24 probed it: no 500, every row freed, RSS flat.

A real server process (``steerkit serve`` with an API key, the packaged SmolLM2-135M-Instruct and the shipped
``toxicity`` reward, 1 torch thread, on 127.0.0.1 and a free port) gets, in order:

1. ``--streams`` concurrent streaming clients (httpx, ``rewards: {"toxicity": -20}``),
   twice;
2. ``--drops`` clients that each read a few streamed tokens and close the connection;
3. one client that sends a valid request with k = the vocabulary (refused by cost: 400 naming ``k``).

After each phase: the status codes seen, whether any stream lacked ``[DONE]``, the server's running and queued
rows once idle (``/health``), and its resident memory (``/proc/PID/status`` VmRSS). Bounded: every client has a
timeout, the phases have fixed counts. JSON to benchmarks/results/probe_serve_load.json.

    python benchmarks/probe_serve_load.py                       # 64 streams ×2, 72 drops: ~5 min on 2 cores
    python benchmarks/probe_serve_load.py --streams 8 --drops 8 --max-tokens 8   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

from steerkit.files import atomic_write_text

import httpx

KEY = "sk-probe"
PROMPTS = ["The weather in Paris today is", "My neighbour told me that", "The comment section under the video was",
           "I can't believe my landlord would", "Scientists have discovered", "Our team lost the match because"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle(url: str, timeout: float = 120) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        health = httpx.get(url + "/health", timeout=10).json()
        if health["running"] == 0 and health["queued"] == 0 and health.get("prefilling", 0) == 0:
            return health
        time.sleep(0.2)
    return health


async def stream_one(client, url, i, max_tokens, drop_after=None) -> dict:
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "seed": i, "stream": True,
            "rewards": {"toxicity": -20}}
    seen = {"status": None, "done": False, "error": None, "tokens": 0}
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            seen["status"] = r.status_code
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    seen["done"] = True
                elif line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        seen["error"] = chunk["error"].get("code")
                    seen["tokens"] += 1
                    if drop_after is not None and seen["tokens"] >= drop_after:
                        break  # leave mid-stream: the connection is closed with the response
    except httpx.HTTPError as exc:
        seen["error"] = type(exc).__name__
    return seen


async def phase(url, count, max_tokens, drop_after=None) -> list[dict]:
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=count + 4)
    async with httpx.AsyncClient(headers=headers, limits=limits) as client:
        return await asyncio.gather(*(stream_one(client, url, i, max_tokens, drop_after) for i in range(count)))


def summary(results: list[dict]) -> dict:
    statuses: dict = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"statuses": statuses, "without_done": sum(1 for r in results if not r["done"]),
            "errors": sorted({str(r["error"]) for r in results if r["error"]}),
            "tokens": sum(r["tokens"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--drops", type=int, default=72)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "probe_serve_load.json")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "STEERKIT_THREADS": "1", "STEERKIT_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "steerkit", "serve", "--port", str(port), "--log-level", "warning",
                             "--max-running", "16", "--max-queue", "128"], env=env, stderr=subprocess.PIPE, text=True)
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "load": os.getloadavg()}, "args": {k: str(v) for k, v in vars(args).items()}, "phases": []}
    try:
        end = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"the server did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
            time.sleep(0.5)
        report["rss_start_mb"] = rss_mb(proc.pid)
        plan = [("streams-1", args.streams, None), ("streams-2", args.streams, None), ("drops", args.drops, 3)]
        for name, count, drop in plan:
            start = time.monotonic()
            results = asyncio.run(phase(url, count, args.max_tokens, drop))
            health = idle(url)
            row = {"phase": name, "clients": count, "seconds": round(time.monotonic() - start, 1), **summary(results),
                   "running_after": health["running"], "queued_after": health["queued"],
                   "finished": health["finished"], "rss_mb": round(rss_mb(proc.pid), 1)}
            report["phases"].append(row)
            print(json.dumps(row), flush=True)
        vocab = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]
        big = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                         json={"prompt": "You are such a", "max_tokens": 1, "seed": 0,
                               "k": vocab["limits"]["max_k"], "rewards": {"toxicity": -20}})
        report["k_vocabulary"] = {"status": big.status_code, "param": big.json()["error"]["param"]}
        print(json.dumps(report["k_vocabulary"]), flush=True)
        report["rss_end_mb"] = round(rss_mb(proc.pid), 1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    atomic_write_text(args.out, json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

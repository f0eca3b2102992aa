"""`steerkit serve` under concurrent clients: continuous batching vs the same requests sent one after another.

A real server process (``steerkit serve``: SmolLM2-135M-Instruct, the shipped ``toxicity`` reward, 1 torch thread)
gets the same set of streaming requests (``rewards: {"toxicity": -20}``, k = 20, sampled with a seed per request)
from 1, 4, 16 and 32 concurrent clients; 1 client is the requests sent one after another. For each level:

- aggregate tokens/s: completion tokens of all requests / wall time from the first request sent to the last done;
- TTFT: request sent -> first streamed token, p50 / p95 over the requests;
- per-token latency: gap between consecutive streamed tokens of one request, p50 / p95 over all gaps;
- the server's mean decode-step time and rows per step (from its /metrics).

The ratio that matters is aggregate tokens/s at c clients over 1 client. JSON to
benchmarks/results/bench_serve.json (machine load included). Run heavy work under the shared lock:

    flock /tmp/steerkit-heavy.lock python benchmarks/bench_serve.py            # ~5 min on 2 busy CPU cores
    python benchmarks/bench_serve.py --requests 8 --max-tokens 16 --levels 1 4  # a quick look
    python benchmarks/bench_serve.py --engine llama.cpp --backend onnx-int8 --out benchmarks/results/bench_serve_llama_cpp.json
    python benchmarks/bench_serve.py --levels 1 16 --setups float32/auto bfloat16/torch-int8 --rounds 3
    python benchmarks/bench_serve.py --levels 16 --setups bfloat16/torch-int8@/tmp/old bfloat16/torch-int8 --rounds 4
    python benchmarks/bench_serve.py --levels 16 --setups bfloat16/torch-int8 "bfloat16/torch-int8*2" --rounds 2
    python benchmarks/bench_serve.py --levels 16 --setups float32/auto float32/onnx-int8:llama.cpp --rounds 2

``--setups`` compares set-ups side by side: one server each, up together, every level run on each set-up in turn,
``--rounds`` times in alternating order, so that the machine's drift falls on all of them; each round's tokens/s
over the first set-up's are printed and written. A set-up ending in ``@TREE`` runs the steerkit of another checkout
(a ``git worktree`` of an older revision): before/after of a change in one run. A set-up with ``*N`` (before any
``@TREE``) is N Ray Serve replicas on a local Ray instance (``steerkit serve --ray local --replicas N``), the batch
split between them (``--max-running`` over N each); its server-side figures (steps, rows a step) are not read, since
``/metrics`` answers from one replica. A set-up with ``:ENGINE`` (before any ``*`` or ``@``) runs that
``steerkit serve --engine`` (``:llama.cpp``), whatever ``--engine`` says: both engines side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_info import cpu_flags  # noqa: E402

PROMPTS = [
    "The weather in Paris today is", "My neighbour told me that the new restaurant", "Scientists have discovered",
    "When I opened the door, I saw", "The best way to learn a language is", "Yesterday the city council voted to",
    "She looked at the old photograph and", "In the year 2050, most people will", "The referee made a call that",
    "I can't believe my landlord would", "The comment section under the video was", "Our team lost the match because",
    "The new phone's battery life is", "He walked into the meeting late and", "The museum's latest exhibition",
    "My favourite childhood memory is", "The traffic this morning was so", "The customer service agent told me",
    "After the storm, the village", "The chef tasted the soup and said", "The politician's speech was",
    "Honestly, the worst thing about Mondays is", "The cat knocked the glass off the table and",
    "Online reviews of the hotel say", "The teacher asked the class to", "When the concert ended, the crowd",
    "The startup's founders announced", "My brother keeps telling me that", "The documentary about the ocean",
    "The argument started when someone", "The library will be closed because", "At the end of the long day, she",
]


def request_bodies(requests: int, max_tokens: int = 32, k: int = 20, beta: float = -20.0) -> list[dict]:
    """The benchmark's streaming completion requests: sampled, a seed each (its index), steered by ``toxicity``."""
    return [{"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 1.0, "seed": i, "k": k,
             "rewards": {"toxicity": beta}, "stream": True} for i in range(requests)]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def one_request(client: httpx.AsyncClient, body: dict) -> dict:
    sent = time.perf_counter()
    stamps, usage, finish = [], None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            now = time.perf_counter()
            for choice in chunk["choices"]:
                if choice["text"]:
                    stamps.append(now)
                finish = choice["finish_reason"] or finish
            usage = chunk.get("usage") or usage
    done = time.perf_counter()
    return {"sent": sent, "done": done, "stamps": stamps, "tokens": usage["completion_tokens"], "finish": finish}


async def run_level(url: str, bodies: list[dict], clients: int) -> dict:
    pending = list(enumerate(bodies))
    results: list = [None] * len(bodies)

    async def worker(client):
        while pending:
            i, body = pending.pop(0)
            results[i] = await one_request(client, body)

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["stamps"][0] - r["sent"] for r in results if r["stamps"]]
    gaps = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    latency = [r["done"] - r["sent"] for r in results]
    return {"clients": clients, "requests": len(bodies), "wall_s": wall, "completion_tokens": tokens,
            "tokens_per_s": tokens / wall,
            "ttft_s": {"p50": percentile(ttft, 0.5), "p95": percentile(ttft, 0.95)},
            "per_token_s": {"p50": percentile(gaps, 0.5), "p95": percentile(gaps, 0.95)},
            "request_s": {"p50": percentile(latency, 0.5), "p95": percentile(latency, 0.95)},
            "finish_reasons": {f: sum(r["finish"] == f for r in results) for f in {r["finish"] for r in results}}}


def parse_setup(text: str, engine: str = "steerkit") -> dict:
    """``DTYPE/BACKEND[+compile][:ENGINE][*REPLICAS][@TREE]`` (as ``bench_engine_step.py --configs``): the server's
    ``--dtype``, ``--backend``, ``--compile`` and ``--engine`` (``engine``, ``--engine``'s, where the set-up names
    none); ``REPLICAS``: Ray Serve replicas; ``TREE``: a steerkit checkout (e.g. ``git worktree add --detach /tmp/old
    REV``) put first on the server's ``PYTHONPATH``, to compare revisions side by side."""
    text_setup, _, tree = text.partition("@")
    text_setup, _, replicas = text_setup.partition("*")
    text_setup, _, named_engine = text_setup.partition(":")
    setup, _, compiled = text_setup.partition("+")
    dtype, _, backend = setup.partition("/")
    from steerkit.validators import ENGINES

    if (compiled not in ("", "compile") or not dtype or (named_engine and named_engine not in ENGINES)
            or (tree and not (Path(tree) / "steerkit").is_dir())
            or not (replicas or "1").isdigit() or int(replicas or 1) < 1):
        raise SystemExit(f"--setups: {text!r} is not DTYPE/BACKEND[+compile][:ENGINE][*REPLICAS][@TREE] (TREE a "
                         "steerkit checkout), e.g. bfloat16/torch-int8, float32/onnx-int8:llama.cpp, "
                         "bfloat16/torch-int8*2 or float32/auto@/tmp/old")
    return {"name": text, "dtype": dtype, "backend": backend or "auto", "compile": compiled == "compile",
            "engine": named_engine or engine, "replicas": int(replicas or 1),
            "tree": str(Path(tree).resolve()) if tree else None}


class Server:
    """One ``steerkit serve`` process of a set-up, on a port of its own, healthy and warmed up; :meth:`stop` ends it."""

    def __init__(self, args, setup: dict, max_running: int):
        self.setup = setup
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "STEERKIT_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "STEERKIT_PLUGINS": "toxicity"}
        if setup["tree"]:
            from trees import tree_env

            env = tree_env(setup["tree"], env)
        replicas = setup["replicas"]
        if replicas > 1:  # Ray Serve replicas on a local Ray instance, the batch split between them
            env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        self.cmd = [sys.executable, "-m", "steerkit", "serve", "--lm", "smollm2-135m-instruct", "--port", str(port),
                    "--max-running", str(-(-max_running // replicas)), "--max-queue", str(max(64, args.requests)),
                    "--timeout", "0",
                    "--log-level", "warning", "--backend", setup["backend"]] + (
                        # only what differs from the defaults: a tree from before --engine/--dtype existed can run
                        ["--engine", setup["engine"]] if setup["engine"] != "steerkit" else []) + (
                        ["--compile"] if setup["compile"] else []) + (
                        ["--dtype", setup["dtype"]] if setup["dtype"] != "float32" else []) + (
                        ["--ray", "local", "--replicas", str(replicas)] if replicas > 1 else [])
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nothing the server prints can block it
        # `python -m` puts the working directory first on sys.path, before PYTHONPATH: from a checkout's root it would
        # import that checkout's steerkit whatever the set-up's tree. So the server starts in its tree (or here).
        cwd = setup["tree"] or None
        self.steerkit = subprocess.run([sys.executable, "-c", "import steerkit; print(steerkit.__file__)"], env=env,
                                       cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
        if setup["tree"] and not Path(self.steerkit).resolve().is_relative_to(Path(setup["tree"]).resolve()):
            raise SystemExit(f"set-up {setup['name']!r} would import {self.steerkit}, not its tree's steerkit")
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=self.log,
                                        text=True)
        self.compiled: list[str] = []
        self.eager: list[str] = []  # shapes the start-up did not compile, which ran eagerly (a compiled server)
        self.startup_s: float | None = None

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 now; the first time it does, :attr:`startup_s` is set. A server that
        exited or passed its deadline ends the benchmark."""
        if self.startup_s is not None:
            return True
        if self.process.poll() is not None:
            self.log.seek(0)
            raise SystemExit(f"the server exited: {self.log.read()}")
        try:
            if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                # servers started together share the cores meanwhile
                self.startup_s = time.monotonic() - self.started
                return True
        except httpx.TransportError:
            pass
        if time.monotonic() - self.started > (1800 if self.setup["compile"] else 180):  # a row bucket: ~1 min
            raise SystemExit("the server did not become healthy in time")
        return False

    def level(self, bodies: list[dict], clients: int) -> dict:
        replicated = self.setup["replicas"] > 1  # /metrics answers from one replica: no server-side figures
        before = None if replicated else scrape(self.url)
        level = asyncio.run(run_level(self.url, bodies, clients))
        if replicated:
            level.update(server_steps=None, server_step_s_mean=None, rows_per_step_mean=None)
            return level
        after = scrape(self.url)
        steps = after["steerkit_step_seconds_count"] - before["steerkit_step_seconds_count"]
        level["server_steps"] = int(steps)
        level["server_step_s_mean"] = (after["steerkit_step_seconds_sum"] -
                                       before["steerkit_step_seconds_sum"]) / max(steps, 1)
        level["rows_per_step_mean"] = (after["steerkit_tokens_generated_total"] -
                                       before["steerkit_tokens_generated_total"]) / max(steps, 1)
        return level

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.seek(0)
        lines = self.log.readlines()
        self.compiled = [line.strip() for line in lines if line.startswith("steerkit: compiled in")]
        self.eager = [line.strip() for line in lines if "was not compiled" in line]
        self.log.close()


def show(level: dict, name: str = "") -> None:
    print(f"{name}{level['clients']:>3} clients: {level['tokens_per_s']:6.1f} tok/s  wall {level['wall_s']:6.1f} s  "
          f"TTFT p50 {level['ttft_s']['p50']:.2f} s p95 {level['ttft_s']['p95']:.2f} s  per-token p50 "
          f"{level['per_token_s']['p50'] * 1000:.0f} ms p95 {level['per_token_s']['p95'] * 1000:.0f} ms  "
          + (f"rows/step {level['rows_per_step_mean']:.1f}" if level["rows_per_step_mean"] is not None else ""),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32, help="requests per level (the same set at each level)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 32], help="concurrent clients")
    parser.add_argument("--beta", type=float, default=-20.0, help="β of the toxicity reward")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--engine", default="steerkit", help="steerkit serve --engine: steerkit or llama.cpp")
    parser.add_argument("--backend", default="auto", help="steerkit serve --backend (the reward's)")
    parser.add_argument("--compile", action="store_true", help="steerkit serve --compile (the static-shape step; "
                        "the server compiles its row buckets before it answers /health)")
    parser.add_argument("--dtype", default="float32", help="steerkit serve --dtype: float32, bfloat16 or int8")
    parser.add_argument("--setups", nargs="+", metavar="DTYPE/BACKEND[+compile][:ENGINE]",
                        help="several set-ups compared side by side: one server each, up together (idle but for the "
                        "one measured), each level run on every set-up in turn, --rounds times, the order reversed "
                        "every round; prints each round's tokens/s over the first set-up's (overrides --dtype, "
                        "--backend and --compile)")
    parser.add_argument("--rounds", type=int, default=1, help="with --setups: rounds over the set-ups")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_serve.json")
    args = parser.parse_args()
    setups = [parse_setup(text, args.engine) for text in
              args.setups or [f"{args.dtype}/{args.backend}" + ("+compile" if args.compile else "")]]
    bodies = request_bodies(args.requests, args.max_tokens, args.k, args.beta)

    load_before = os.getloadavg()
    servers: list[Server] = []
    runs: dict[str, list[list[dict]]] = {setup["name"]: [] for setup in setups}  # per set-up, per round: its levels
    try:
        for setup in setups:
            servers.append(Server(args, setup, max(args.levels)))
        while not all([server.healthy() for server in servers]):  # each server's own start-up time: all polled
            time.sleep(0.5)
        for server in servers:
            asyncio.run(run_level(server.url, bodies[:2], 2))  # warm-up: first forwards, allocator
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for server in order:
                levels = []
                for clients in args.levels:
                    level = server.level(bodies, clients)
                    level["load_average"] = os.getloadavg()
                    levels.append(level)
                    show(level, f"round {r + 1} {server.setup['name']}: " if len(setups) > 1 else "")
                runs[server.setup["name"]].append(levels)
    finally:
        for server in servers:
            server.stop()
    for rounds in runs.values():
        for levels in rounds:
            base = next((lv for lv in levels if lv["clients"] == 1), None)
            for level in levels:
                level["speedup_vs_sequential"] = level["tokens_per_s"] / base["tokens_per_s"] if base else None
    common = {"benchmark": "bench_serve", "lm": "smollm2-135m-instruct", "reward": "toxicity", "beta": args.beta,
              "k": args.k, "max_tokens": args.max_tokens, "requests_per_level": args.requests, "torch_threads": 1,
              "machine": platform.processor() or platform.machine(), "cpu": cpu_flags(), "cpus": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "sequential_is": "the 1-client level: the same requests sent one after another"}
    if args.setups:
        first = setups[0]["name"]
        ratios = {setup["name"]: {str(c): [levels[i]["tokens_per_s"] / runs[first][r][i]["tokens_per_s"]
                                           for r, levels in enumerate(runs[setup["name"]])]
                                  for i, c in enumerate(args.levels)} for setup in setups}
        result = {**common, "rounds": args.rounds, "ratios_are": f"tokens/s over {first}'s in the same round",
                  "setups": [{"setup": server.setup["name"], "server": " ".join(server.cmd[2:]),
                              "steerkit_tree": server.setup["tree"], "steerkit_imported": server.steerkit,
                              "compilations_at_start": server.compiled, "startup_s": server.startup_s,
                              "not_compiled_lines": server.eager, "rounds": runs[server.setup["name"]],
                              "tokens_per_s_over_first": ratios[server.setup["name"]]} for server in servers]}
    else:
        server = servers[0]
        result = {**common, "server": " ".join(server.cmd[2:]), "compilations_at_start": server.compiled,
                  "startup_s": server.startup_s, "not_compiled_lines": server.eager,
                  "levels": runs[server.setup["name"]][0]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    for name, rounds in runs.items():
        for r, levels in enumerate(rounds):
            for level in levels:
                parts = [] if level["speedup_vs_sequential"] is None else [
                    f"{level['speedup_vs_sequential']:.2f}x the sequential tokens/s"]
                if args.setups:
                    parts.append(f"{ratios[name][str(level['clients'])][r]:.2f}x {setups[0]['name']}'s")
                    print(f"{name} round {r + 1}: {level['clients']:>3} clients: {', '.join(parts)}")
                elif parts:
                    print(f"{level['clients']:>3} clients: {parts[0]}")


if __name__ == "__main__":
    main()

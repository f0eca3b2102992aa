"""``steerkit serve``: the OpenAI-compatible steering server (FastAPI on uvicorn), see docs/serving.md.

With no arguments it serves the packaged SmolLM2 with every installed reward available and no default
steering; ``--config steer.yaml`` or ``--lm`` / ``--reward NAME=BETA`` / ``-k`` set the model and the steering a
request gets when it names none. SIGTERM (or Ctrl-C) stops accepting connections, lets in-flight requests
finish for up to ``--shutdown-deadline`` seconds, then cancels what is left and exits 0.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import InvalidArgumentError
from ..limits import LARGE_K
from ..serving.requests import COMPILE_TOKENS, DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING, PREFILL_CHUNK
from ..serving.settings import HEADER_TIMEOUT_S, MAX_CONNECTIONS, ServerSettings
from .common import BACKEND_HELP, COMPILE_HELP, DTYPE_HELP, ENGINE_HELP, err, parse_reward_weight

#: the HTTP limits' defaults, which the options below show and pass on
DEFAULTS = ServerSettings()


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="SteeringConfig YAML/TOML/JSON file: "
                                          "the model and the default steering."),
    lm: Optional[str] = typer.Option(None, "--lm", help="LM reference (packaged name, directory, .gguf, hub id). "
                                     "\\[default: smollm2-135m-instruct]"),
    reward: List[str] = typer.Option([], "--reward", "-r", help="REF=BETA, repeatable: the default steering "
                                     "(requests may override it). \\[default: none]"),
    k: Optional[int] = typer.Option(None, "--k", "-k", help="Default top-k candidates per step. \\[default: 20]"),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP + " \\[default: auto]"),
    engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help=COMPILE_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=DTYPE_HELP),
    max_running: int = typer.Option(DEFAULT_MAX_RUNNING, "--max-running", min=1, help="Rows decoded together at most."),
    max_queue: int = typer.Option(DEFAULT_MAX_QUEUE, "--max-queue", min=1,
                                  help="Rows waiting at most; beyond it: HTTP 429."),
    timeout: float = typer.Option(DEFAULTS.timeout_s, "--timeout", min=0.0, help="Seconds a request may take "
                                  "from admission to its last token (0: no limit); past it: HTTP 504 or finish_reason "
                                  "timeout."),
    max_tokens_limit: int = typer.Option(DEFAULTS.max_tokens_limit, "--max-tokens-limit", min=1,
                                         help="Largest max_tokens a request may ask for."),
    default_max_tokens: int = typer.Option(DEFAULTS.default_max_tokens, "--default-max-tokens", min=1,
                                           help="max_tokens of a request that sends none."),
    max_n: int = typer.Option(DEFAULTS.max_n, "--max-n", min=1, help="Largest n (choices per prompt)."),
    shutdown_deadline: float = typer.Option(DEFAULTS.shutdown_deadline_s, "--shutdown-deadline", min=0.0,
                                            help="On SIGTERM, seconds in-flight requests get to finish."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level: critical, error, warning, "
                                  "info, debug."),
    ray_address: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS", help="Serve replicas on Ray "
                                              "Serve: auto, local or HOST:PORT (docs/scaling.md)."),
    replicas: Optional[int] = typer.Option(None, "--replicas", min=1, help="With --ray: replicas. \\[default: 1]"),
    ray_config: Optional[Path] = typer.Option(None, "--ray-config", help="With --ray: YAML/TOML file whose "
                                              "ray_serve section sets replicas and Ray Serve autoscaling."),
    prefer: List[str] = typer.Option([], "--prefer", metavar="NAME=PLUGIN", help="Repeatable: serve PLUGIN's "
                                     "reward as NAME when several plugins register NAME (like STEERKIT_PREFER; "
                                     "the others stay available as PLUGIN:NAME)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="STEERKIT_API_KEY", show_default=False,
                                          help="Require `Authorization: Bearer KEY` on /v1/* (also "
                                          "$STEERKIT_API_KEY). \\[default: none]"),
    allowed_hosts: List[str] = typer.Option([], "--allowed-hosts", metavar="NAME", help="Repeatable: a Host "
                                            "header name to answer besides the bound address ('*': any)."),
    allowed_origins: List[str] = typer.Option([], "--allowed-origins", metavar="ORIGIN", help="Repeatable: a web "
                                              "origin that may call the API from a browser (CORS). \\[default: none]"),
    max_k_sequence: int = typer.Option(LARGE_K, "--max-k-sequence", min=1, help="Largest k a row may use with a "
                                       "sequence reward (each candidate is a reward-model forward); past it: 400."),
    prefill_chunk: int = typer.Option(PREFILL_CHUNK, "--prefill-chunk", min=1, help="A longer prompt is "
                                      "prefilled this many tokens at a time, between decode steps."),
    compile_tokens: int = typer.Option(COMPILE_TOKENS, "--compile-tokens", min=1, help="With --compile: rows of up "
                                       "to this many tokens (prompt and generated) run on shapes compiled at start-up; "
                                       "a longer row's steps run eagerly. Each doubling adds a compilation per row "
                                       "bucket to the start-up."),
    max_connections: int = typer.Option(MAX_CONNECTIONS, "--max-connections", min=1, help="Open connections and "
                                        "running requests at most; past it: 503."),
    stall_timeout: float = typer.Option(DEFAULTS.stall_s, "--stall-timeout", min=0.1, help="/health answers 503 "
                                        "'stalled' when rows wait and no decode step ended for this many seconds."),
    read_timeout: float = typer.Option(HEADER_TIMEOUT_S, "--read-timeout", min=0.1, help="Seconds a client has to "
                                       "send a request's headers, and then its body."),
):
    """Serve steered generation over an OpenAI-compatible HTTP API, with a playground at /."""
    from ..config import SteeringConfig

    hosts = _hosts(host, allowed_hosts)
    if api_key is not None and not api_key.strip():
        raise InvalidArgumentError("--api-key (or STEERKIT_API_KEY) is empty; give a key, or leave it unset.")
    if api_key is None and not _is_loopback(host):
        err.print(f"warning: steerkit serve listens on {host} without an API key: anyone who can reach this "
                  "machine can run generations. Pass --api-key (or set STEERKIT_API_KEY).", soft_wrap=True)
    _check_port_free(host, port)
    security = {"api_key": api_key, "hosts": hosts, "allowed_origins": tuple(allowed_origins),
                "body_timeout_s": read_timeout, "stall_s": stall_timeout}
    if prefer:
        apply_preferences(prefer)
    overrides = {"lm": lm, "k": k, "backend": backend, "engine": engine, "compile": compile, "dtype": dtype}
    if config is not None or reward or any(v is not None for v in overrides.values()):
        cfg = SteeringConfig.from_file(config) if config else SteeringConfig()
        cfg = cfg.with_overrides({key: v for key, v in overrides.items() if v is not None})
        if reward:
            cfg = cfg.with_rewards([parse_reward_weight(s) for s in reward])
    else:
        cfg = None  # the packaged SmolLM2, every installed reward available, no default steering
    limits = {"max_running": max_running, "max_queue": max_queue, "max_k_sequence": max_k_sequence,
              "prefill_chunk": prefill_chunk, "compile_tokens": compile_tokens}
    settings = {"timeout_s": timeout or None, "max_tokens_limit": max_tokens_limit,
                "default_max_tokens": default_max_tokens, "max_n": max_n, "shutdown_deadline_s": shutdown_deadline,
                **security}
    if ray_address is not None or replicas is not None or ray_config is not None:  # Ray Serve replicas
        from ..distributed.serve import serve_command

        return serve_command(cfg, ray_address, replicas, ray_config, host=host, port=port,
                             engine_limits=limits, settings=settings, log=err.print)
    run_server(cfg, host=host, port=port, limits=limits, settings=settings, log_level=log_level,
               connections={"max_connections": max_connections, "header_timeout_s": read_timeout})


def run_server(cfg, *, host: str, port: int, limits: dict, settings: dict, log_level: str,
               connections: dict) -> None:
    try:
        from ..serving import runner
        from ..serving.app import create_app
        from ..serving.engine import Engine
        from ..serving.metrics import ServerMetrics
    except ImportError as exc:
        raise InvalidArgumentError(f"steerkit serve needs the serve extra ({exc.name} is missing): "
                                   "pip install 'steerkit-rad[serve]'.") from None
    if log_level not in {"critical", "error", "warning", "info", "debug"}:
        raise InvalidArgumentError(f"--log-level must be critical, error, warning, info or debug, got {log_level!r}.")
    metrics = ServerMetrics()
    err.print("loading the model and rewards…")
    engine = Engine.from_config(cfg, observer=metrics, **limits)
    app = create_app(engine, settings=ServerSettings(**settings), metrics=metrics)
    shown = f"[{host}]" if ":" in host else host
    err.print(f"steerkit serve: {engine.model_name} with rewards {', '.join(engine.reward_names()) or '(none)'} "
              f"on http://{shown}:{port}  (playground /, OpenAI API /v1, metrics /metrics; Ctrl-C to stop)",
              soft_wrap=True)
    runner.run(app, engine, host=host, port=port, deadline_s=settings["shutdown_deadline_s"], log_level=log_level,
               log=lambda message: err.print(message, soft_wrap=True), **connections)


def _is_loopback(host: str) -> bool:
    try:
        from ..serving.guard import is_loopback
    except ImportError:  # no serve extra: run_server says what to install
        return True
    return is_loopback(host)


def _hosts(host: str, allowed: List[str]):
    try:
        from ..serving.guard import allowed_hosts
    except ImportError:  # no serve extra: run_server says what to install
        return None
    return allowed_hosts(host, allowed)


def apply_preferences(values: List[str]) -> None:
    """``--prefer NAME=PLUGIN`` values: added to ``STEERKIT_PREFER`` (a flag wins over the variable for the same
    name), which the registry reads (:func:`steerkit.registry.get_registry`); processes started from
    this one inherit it."""
    import os

    from .. import registry
    from ..plugin_conflicts import parse_preferences

    given, problems = parse_preferences(",".join(values))
    bad = [v for v in values if "," in v]
    if bad or problems:
        why = "; ".join([*(f"{v!r} holds a comma: repeat --prefer instead" for v in bad), *problems])
        raise InvalidArgumentError(f"--prefer takes NAME=PLUGIN (e.g. --prefer toxicity=steerkit-toxicity): {why}.")
    current, problems = parse_preferences(os.environ.get(registry.ENV_PREFER))
    if problems:
        raise InvalidArgumentError(f"{registry.ENV_PREFER}={os.environ[registry.ENV_PREFER]!r} is not valid: "
                                   f"{'; '.join(problems)}. Write NAME=PLUGIN[,NAME=PLUGIN...].")
    merged = {**current, **given}
    os.environ[registry.ENV_PREFER] = ",".join(f"{name}={plugin}" for name, plugin in merged.items())
    registry.reset()  # the next lookup reads the preferences afresh


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InvalidArgumentError(f"port {port} on {host} is already in use; pass another --port.") from None
            raise InvalidArgumentError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host.") from None


def register(app: typer.Typer) -> None:
    app.command()(serve)

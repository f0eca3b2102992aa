"""Serving replicas: ``steerkit serve``'s app (:func:`steerkit.serving.app.create_app`) as a Ray Serve deployment.

Each replica builds its own engine (the LM and every reward loaded once per replica) and the same FastAPI app,
so the OpenAI-compatible API is the one ``steerkit serve`` exposes; Ray Serve's proxy spreads requests over the
replicas. Replica count and Ray Serve's autoscaling settings come from :class:`ReplicaConfig`, e.g. the
``ray_serve:`` section of a YAML file::

    ray_serve:
      threads_per_replica: 1
      autoscaling_config: {min_replicas: 1, max_replicas: 8, target_ongoing_requests: 4}
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path

from pydantic import Field

from ..config import ValidatedConfig, load_config_file


class ReplicaConfig(ValidatedConfig):
    """How many replicas and what each reserves; ``autoscaling_config`` is passed to Ray Serve as it is."""

    replicas: int = Field(default=1, ge=1)
    threads_per_replica: int = Field(default=1, ge=1)
    gpus_per_replica: float = Field(default=0.0, ge=0)
    autoscaling_config: dict | None = None  # Ray Serve's: min_replicas, max_replicas, target_ongoing_requests...

    @classmethod
    def from_file(cls, path: str | Path, **overrides) -> "ReplicaConfig":
        data = load_config_file(path)
        section = data.get("ray_serve", data)
        return cls.from_dict({**section, **overrides}, source=f"{path} (ray_serve)")


def import_serve():
    """``ray.serve``, or :class:`RayNotInstalledError` with the install command (ray without its serve extra)."""
    import importlib

    from ..errors import RayNotInstalledError
    from .cluster import INSTALL, import_ray

    import_ray()
    try:
        return importlib.import_module("ray.serve")
    except ImportError as exc:
        raise RayNotInstalledError(f"--ray serving needs Ray Serve, which is not installed ({exc.name or exc} is "
                                   f"missing): {INSTALL}.") from None


class _Replica:
    """One replica: torch threads, then (in ``__serve_build_asgi_app__``) the engine and the app."""

    def __init__(self, steering_config, engine_limits: dict, settings: dict, threads: int):
        from ..threads import set_threads

        set_threads(threads)
        self.steering_config, self.engine_limits, self.settings = steering_config, engine_limits, settings

    def __serve_build_asgi_app__(self):
        from ..serving.app import ServerSettings, create_app
        from ..serving.engine import Engine
        from ..serving.metrics import ServerMetrics

        metrics = ServerMetrics()
        engine = Engine.from_config(self.steering_config, observer=metrics, **self.engine_limits)
        return create_app(engine, settings=ServerSettings(**self.settings), metrics=metrics)


def max_ongoing_requests(engine_limits: dict | None = None) -> int:
    """Requests Ray Serve hands one replica at once: as many rows as its engine holds, running and queued. Ray Serve's
    own default (5) would cap each replica's batch at 5 rows whatever ``--max-running`` says; a replica whose queue
    is full answers 429 itself, as ``steerkit serve`` alone does."""
    from ..serving.requests import DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING

    limits = engine_limits or {}
    return int(limits.get("max_running", DEFAULT_MAX_RUNNING)) + int(limits.get("max_queue", DEFAULT_MAX_QUEUE))


def deployment(steering_config, replica_config: ReplicaConfig, *, engine_limits: dict | None = None,
               settings=None, name: str = "steerkit"):
    """The bound Ray Serve application (pass it to ``serve.run``)."""
    dep = replica_deployment(replica_config, engine_limits=engine_limits, name=name)
    return dep.bind(steering_config, dict(engine_limits or {}), asdict(settings) if settings else {},
                    replica_config.threads_per_replica)


def replica_deployment(replica_config: ReplicaConfig, *, engine_limits: dict | None = None, name: str = "steerkit"):
    """The Ray Serve ``Deployment`` of the replicas, not yet bound to a config: its replicas, their CPUs and GPUs,
    the environment they inherit, and the requests each is handed at once (:func:`max_ongoing_requests`)."""
    from .cluster import forwarded_env

    serve = import_serve()

    cfg = replica_config
    scaling = ({"autoscaling_config": cfg.autoscaling_config} if cfg.autoscaling_config
               else {"num_replicas": cfg.replicas})
    options = {"num_cpus": cfg.threads_per_replica, "num_gpus": cfg.gpus_per_replica,
               "runtime_env": {"env_vars": forwarded_env()}}
    ingress = serve.ingress()(_Replica)
    return serve.deployment(ingress, name=name, ray_actor_options=options,
                            max_ongoing_requests=max_ongoing_requests(engine_limits), **scaling)


def start_replicas(steering_config, replica_config: ReplicaConfig, *, address: str, host: str = "127.0.0.1",
                   port: int = 8000, engine_limits: dict | None = None, settings=None):
    """Connect to (or start) the cluster, start Ray Serve's proxy on ``host:port`` and deploy the replicas;
    returns the :class:`~.cluster.Cluster` (``serve.shutdown()`` and ``cluster.close()`` stop them; on a failure
    here they are stopped before the error propagates)."""
    from .cluster import connect

    serve = import_serve()
    cluster = connect(address, num_cpus=(replica_config.replicas * replica_config.threads_per_replica) + 1
                      if address == "local" else None)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(steering_config, replica_config, engine_limits=engine_limits, settings=settings),
                  name="steerkit", route_prefix="/", blocking=False)
    except BaseException:
        with contextlib.suppress(Exception):  # the error to report is the one that got here
            serve.shutdown()
        cluster.close()
        raise
    return cluster


def run_replicas(steering_config, replica_config: ReplicaConfig, *, address: str, host: str, port: int,
                 engine_limits: dict, settings, log) -> None:
    """``steerkit serve --ray ADDRESS --replicas N``: serve until Ctrl-C or SIGTERM, then stop the replicas."""
    import signal
    import threading

    serve = import_serve()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        cluster = start_replicas(steering_config, replica_config, address=address, host=host, port=port,
                                 engine_limits=engine_limits, settings=settings)
    except BaseException:
        signal.signal(signal.SIGTERM, previous)
        raise
    try:
        scale = (f"autoscaling {replica_config.autoscaling_config}" if replica_config.autoscaling_config
                 else f"{replica_config.replicas} replica{'s' if replica_config.replicas != 1 else ''}")
        log(f"steerkit serve on Ray ({address}, {scale}): http://{host}:{port}  (OpenAI API /v1; Ctrl-C to stop)")
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        serve.shutdown()
        cluster.close()


def serve_command(steering_config, address: str | None, replicas: int | None, config_file, *, host: str, port: int,
                  engine_limits: dict, settings: dict, log) -> None:
    """What ``steerkit serve --ray/--replicas/--ray-config`` dispatches to."""
    from ..errors import InvalidArgumentError
    from ..serving.app import ServerSettings
    from .cluster import check_address

    if address is None:
        raise InvalidArgumentError("--replicas and --ray-config run Ray Serve replicas: add --ray auto (or local, "
                                   "or HOST:PORT).")
    check_address(address)
    import_serve()
    overrides = {"replicas": replicas} if replicas is not None else {}
    cfg = (ReplicaConfig.from_file(config_file, **overrides) if config_file
           else ReplicaConfig.from_dict(overrides, source="command-line options"))
    run_replicas(steering_config, cfg, address=address, host=host, port=port, engine_limits=engine_limits,
                 settings=ServerSettings(**settings), log=log)

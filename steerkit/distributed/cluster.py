"""Connecting to a Ray cluster for ``--ray ADDRESS``, and sizing the actors to what the cluster has.

``ADDRESS`` is ``auto`` (the cluster this machine belongs to: ``$RAY_ADDRESS``, else the last ``ray start``
here), ``local`` (start a Ray instance on this machine, sized for the requested actors), or ``HOST:PORT`` /
``ray://HOST:PORT``. Every failure is a typed :class:`~steerkit.errors.ClusterError` saying what to do: ray
not installed, nothing answering at the address (checked with a TCP connect first: ``ray.init`` itself
retries a dead address for a long time), or fewer GPUs/CPUs than the actors need (Ray would wait for them
forever).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    ClusterResourcesError, ClusterUnreachableError, InvalidArgumentError, RayNotInstalledError,
)

INSTALL = 'pip install "steerkit-rad[ray]"'
#: Environment variables the actors get from the driver (steerkit's own, the plugin allowlist, hub settings).
FORWARDED_ENV = ("STEERKIT_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")


def import_ray():
    """The ``ray`` module, or :class:`RayNotInstalledError` with the install command."""
    try:
        import ray
    except ImportError:
        raise RayNotInstalledError(f"--ray needs the ray package, which is not installed: {INSTALL} "
                                   "(the same ray version on every node of the cluster).") from None
    return ray


def check_address(address: str) -> str:
    address = (address or "").strip()
    if not address or address.startswith("-"):
        raise InvalidArgumentError(f"--ray needs an address: auto, local, HOST:PORT or ray://HOST:PORT "
                                   f"(got {address!r}).")
    return address


@dataclass
class Cluster:
    """A connection this process holds; :meth:`close` disconnects (and stops a ``local`` instance)."""

    address: str
    connected_here: bool  # this process called ray.init (else the caller had connected already)

    def resources(self) -> dict:
        return dict(import_ray().cluster_resources())

    def close(self) -> None:
        ray = import_ray()
        if self.connected_here and ray.is_initialized():
            ray.shutdown()


def connect(address: str, *, num_cpus: int | None = None, num_gpus: int | None = None) -> Cluster:
    """Connect this process to the cluster at ``address`` (see the module docstring).

    ``num_cpus``/``num_gpus`` size a ``local`` instance (the other forms use what the cluster has). When this
    process is already connected (a library user called ``ray.init``), that connection is used as it is.
    """
    address = check_address(address)
    ray = import_ray()
    if ray.is_initialized():
        return Cluster(address, connected_here=False)
    kwargs = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING,
              "configure_logging": True}
    if address == "local":
        kwargs.update(num_cpus=num_cpus, num_gpus=num_gpus)
        target = "local"
        _quiet_token_auth_notice()
    else:
        target = resolve_auto() if address == "auto" else address
        probe(target, given=address)
    try:
        ray.init(address=target, **kwargs)
    except Exception as exc:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, auth errors ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterUnreachableError(f"Could not join the Ray cluster at {target} ({first}). Check that its "
                                      "ray version matches this one and, if the cluster uses token "
                                      "authentication, that RAY_AUTH_TOKEN is set.") from None
    return Cluster(address, connected_here=True)


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _quiet_token_auth_notice() -> None:
    """Ray (2.5x) turns token authentication on for every new local cluster, the secure default steerkit keeps,
    and logs a warning saying so on every run; that line is dropped (a cluster this process starts is its own).
    Setting RAY_AUTH_MODE=token instead, the documented way to silence it, left the GCS server unable to start
    here."""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropTokenAuthNotice) for f in log.filters):
        log.addFilter(_DropTokenAuthNotice())


def resolve_auto() -> str:
    """The address ``auto`` means: ``$RAY_ADDRESS``, else the cluster last started on this machine."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    current = ray_temp_dir() / "ray_current_cluster"
    try:
        address = current.read_text(encoding="utf-8").strip()
    except OSError:
        address = ""
    if not address:
        raise ClusterUnreachableError("--ray auto found no running Ray cluster on this machine (no $RAY_ADDRESS, "
                                      "no `ray start` here). Start one with `ray start --head`, pass its "
                                      "address (--ray HOST:PORT), or use --ray local to start one for this run.")
    return address


def ray_temp_dir() -> Path:
    """Where ``ray start`` on this machine writes ``ray_current_cluster``, resolved as Ray resolves it:
    ``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray`` on Linux, else ``/tmp/ray`` (so that a run, or a test, that gives
    Ray a temporary directory of its own never reads the address another cluster left in ``/tmp/ray``)."""
    if os.environ.get("RAY_TMPDIR"):
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and os.environ.get("TMPDIR"):
        base = os.environ["TMPDIR"]
    elif sys.platform.startswith(("linux", "darwin")):
        base = "/tmp"
    else:
        base = tempfile.gettempdir()
    return Path(base) / "ray"


def probe(address: str, *, given: str, timeout: float = 5.0) -> None:
    """A TCP connect to the address's host and port, so that a dead address fails in seconds."""
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"--ray {given!r}: expected auto, local, HOST:PORT or ray://HOST:PORT.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        via = f" ({given} resolved to {address})" if given != address else ""
        raise ClusterUnreachableError(
            f"No Ray cluster answers at {address}{via}: {exc.strerror or exc}. Check the address (`ray status` on "
            "the head node prints it), that the head is running (`ray start --head --port PORT`) and that this "
            "machine can reach it; or use --ray local to start one here.") from None


@dataclass(frozen=True)
class ActorPlan:
    """How many actors, and what each one asks Ray for."""

    actors: int
    threads: int  # torch threads, and the CPUs each actor reserves
    gpus: float  # GPUs each actor reserves (0: none)
    device: str | None  # the torch device the actors' models use (None: steerkit's default, the CPU)


def plan_actors(resources: dict, *, actors: int | None, threads: int = 1, gpus_per_actor: float | None = None,
                device: str | None = None) -> ActorPlan:
    """Size the actors to the cluster; :class:`ClusterResourcesError` when it cannot hold them.

    On a cluster with GPUs and no ``device`` given, the actors use ``cuda`` with one GPU each (a share of one
    when there are more actors than GPUs); ``--device cpu`` keeps them off the GPUs.
    """
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    wants_gpu = ((device or "").startswith("cuda") or (gpus_per_actor or 0) > 0
                 or (device is None and gpus > 0 and gpus_per_actor != 0))
    if gpus_per_actor is not None and gpus_per_actor < 0:
        raise InvalidArgumentError(f"--gpus-per-actor must be >= 0, got {gpus_per_actor}.")
    if wants_gpu and gpus == 0:
        raise ClusterResourcesError(
            f"The Ray cluster has no GPU ({_describe(resources)}) but the run asks for one (--device {device or 'cuda'}"
            f"{'' if gpus_per_actor is None else f', --gpus-per-actor {gpus_per_actor:g}'}). Add GPU nodes, or "
            "run on the CPUs with --device cpu.")
    if actors is None:
        actors = int(gpus) if wants_gpu else max(1, int(cpus // threads))
    if actors < 1:
        raise InvalidArgumentError(f"--actors must be at least 1, got {actors}.")
    per_actor = (gpus_per_actor if gpus_per_actor is not None else min(1.0, gpus / actors)) if wants_gpu else 0.0
    if per_actor and actors * per_actor > gpus + 1e-9:
        raise ClusterResourcesError(
            f"{actors} actors × {per_actor:g} GPU need {actors * per_actor:g} GPUs; the Ray cluster has {gpus:g} "
            f"({_describe(resources)}). Use --actors {max(1, int(gpus // per_actor))}, or share GPUs with "
            f"--gpus-per-actor {gpus / actors:.3g}.")
    if actors * threads > cpus:
        raise ClusterResourcesError(
            f"{actors} actors × {threads} thread(s) need {actors * threads} CPUs; the Ray cluster has {cpus:g} "
            f"({_describe(resources)}). Use --actors {max(1, int(cpus // threads))} or fewer --threads-per-actor.")
    return ActorPlan(actors, threads, per_actor, ("cuda" if wants_gpu and device is None else device))


def _describe(resources: dict) -> str:
    return f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs"


def forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}

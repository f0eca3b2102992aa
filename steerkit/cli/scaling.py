"""The ``--ray ADDRESS``, ``--actors``, ``--threads-per-actor`` and ``--gpus-per-actor`` options that
``steerkit generate --input`` and ``steerkit eval`` share: from them, the executor the job's units run on."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import typer

from ..errors import InvalidArgumentError

RAY_HELP = ("Shard the prompts over Ray actors: auto (the running cluster), local (start one here) or HOST:PORT. "
            "Needs pip install \"steerkit-rad[ray]\". See docs/scaling.md.")
ACTORS_HELP = "Ray actors, each loading the models once. \\[default: the cluster's GPUs, else CPUs ÷ threads]"
THREADS_HELP = "torch threads (and CPUs reserved) per Ray actor."
GPUS_HELP = "GPUs per Ray actor (a fraction shares one). \\[default: 1 each on a cluster with GPUs, else 0]"

# The four options as one set of typer declarations, used as they are by every command that takes them
# (the parameters must be named ray_address, actors, threads_per_actor and gpus_per_actor).
RAY_OPTION = typer.Option(None, "--ray", metavar="ADDRESS", help=RAY_HELP)
ACTORS_OPTION = typer.Option(None, "--actors", min=1, help=ACTORS_HELP)
THREADS_OPTION = typer.Option(1, "--threads-per-actor", min=1, help=THREADS_HELP)
GPUS_OPTION = typer.Option(None, "--gpus-per-actor", min=0, help=GPUS_HELP)


@contextmanager
def executor_for(address: str | None, *, actors: int | None, threads: int, gpus: float | None, device: str | None,
                 log: Callable[[str], None]) -> Iterator:
    """``(executor, plan)``: ``(None, None)`` without ``--ray`` (the work runs in this process)."""
    if address is None:
        given = [flag for flag, value in (("--actors", actors), ("--gpus-per-actor", gpus)) if value is not None]
        if threads != 1:
            given.append("--threads-per-actor")
        if given:
            raise InvalidArgumentError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to Ray actors: "
                                       "add --ray auto (or local, or HOST:PORT).")
        yield None, None
        return
    from ..distributed.cluster import check_address, connect, plan_actors
    from ..distributed.executor import RayActors

    address = check_address(address)
    local_cpus = actors * threads if address == "local" and actors else None
    cluster = connect(address, num_cpus=local_cpus)
    try:
        plan = plan_actors(cluster.resources(), actors=actors, threads=threads, gpus_per_actor=gpus, device=device)
        gpu_text = f", {plan.gpus:g} GPU each" if plan.gpus else ""
        log(f"Ray ({address}): {plan.actors} actor{'s' if plan.actors != 1 else ''} × {plan.threads} "
            f"thread{'s' if plan.threads != 1 else ''}{gpu_text}")
        executor = RayActors(plan, log=log)
        try:
            yield executor, plan
        finally:
            executor.close()
    finally:
        cluster.close()

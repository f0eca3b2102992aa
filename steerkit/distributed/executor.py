"""Where a job's units of work run: in this process, or sharded over Ray actors, with the same results.

A job hands an executor its pending units and a *worker factory*: a picklable callable that loads what the
work needs (the LM, the rewards) and returns the function that does one unit. :meth:`map` yields one result
per unit, **in the units' order**, each exactly once; the caller writes them as they come, so the output file
is the same whatever ran it.

:class:`InProcess` calls the factory once and the worker on each unit. :class:`RayActors` starts N Ray actors
(each calls the factory once: one model load per actor), keeps ``depth`` units queued on each, and puts the
results back in order in a bounded window. When an actor dies (its process was killed, its node lost), the
units it had not returned go back to the queue and run on another actor; a replacement actor is started.
A unit's result is accepted once: the driver is the only writer, so nothing is written twice. An error raised
by the work itself (a prompt too long, a NaN reward) is re-raised here as it was raised there.

Why Ray core actors and not Ray Data: the job needs an exact resume (only the units missing from the output
file, decided by the driver), the input order in one output file, and every unit written exactly once, at
the moment it finishes. Ray Data's ``map_batches`` + a datasink writes blocks to files of its own naming and
re-executes failed tasks, with no per-unit commit the driver controls; actors plus ordered writes give all
three properties with a few dozen lines.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable, Iterable, Iterator, Sequence

from ..errors import ClusterError, SteerkitError


class InProcess:
    """Run the units here, one after the other (what runs without ``--ray``)."""

    device = None  # the workers use the job's own device

    def map(self, units: Iterable, factory: Callable[[], Callable]) -> Iterator:
        work = factory()
        for unit in units:
            yield work(unit)

    def close(self) -> None:
        pass


class _Actor:
    """One Ray actor: its torch threads, then the worker the factory builds (models loaded once)."""

    def __init__(self, threads: int):
        from ..threads import set_threads

        os.environ["STEERKIT_THREADS"] = str(threads)
        set_threads(threads)
        self.work = None

    def start(self, factory) -> int:
        self.work = factory()
        return os.getpid()

    def run(self, unit):
        return self.work(unit)


class RayActors:
    """Shard units over ``plan.actors`` Ray actors (see the module docstring).

    Args:
        plan: an :class:`~steerkit.distributed.cluster.ActorPlan` (actors, threads and GPUs per actor).
        depth: units queued on each actor (one running, the next already sent).
        max_attempts: how many actors may die running the same unit before the run stops with a ClusterError.
        replacements: actors started in place of dead ones, at most (default: as many as ``plan.actors``).
        warmup: send no unit before every first actor has loaded its models (timings; otherwise the first
            ready actor starts at once).
    """

    def __init__(self, plan, *, depth: int = 2, max_attempts: int = 3, replacements: int | None = None,
                 warmup: bool = False, log: Callable[[str], None] | None = None):
        self.plan = plan
        self.device = plan.device  # the torch device the actors' models use (None: the job's own)
        self.depth = depth
        self.max_attempts = max_attempts
        self.replacements = plan.actors if replacements is None else replacements
        self.log = log or (lambda message: None)
        self.pids: dict[int, int] = {}  # actor slot -> worker process id, once started
        self.ready_at: float | None = None  # when every first actor had loaded its models
        self.warmup = warmup
        self.units_by_actor: dict[int, int] = {}  # actor slot -> units it returned
        self.redone = 0  # units sent again because their actor died
        self.actors_lost = 0
        self._handles: dict[int, object] = {}

    def _spawn(self, ray, slot: int, factory):
        from .cluster import forwarded_env

        cls = ray.remote(_Actor).options(num_cpus=self.plan.threads, num_gpus=self.plan.gpus, max_restarts=0,
                                         max_task_retries=0, runtime_env={"env_vars": forwarded_env()})
        handle = cls.remote(self.plan.threads)
        self._handles[slot] = handle
        return handle.start.remote(factory)

    def map(self, units: Sequence, factory: Callable[[], Callable]) -> Iterator:
        from .cluster import import_ray

        ray = import_ray()
        from ray.exceptions import RayActorError, RayTaskError

        unavailable = getattr(ray.exceptions, "ActorUnavailableError", RayActorError)
        units = list(units)
        window = max(8, 4 * self.depth * self.plan.actors)
        pending = deque(range(len(units)))
        results: dict[int, object] = {}
        attempts: dict[int, int] = {}
        inflight: dict[object, tuple[int, int]] = {}  # ref -> (actor slot, unit position)
        starting: dict[object, int] = {}  # ref of an actor's start() -> slot
        ready: set[int] = set()
        next_out, next_slot, replacements = 0, self.plan.actors, self.replacements
        try:
            for slot in range(self.plan.actors):
                starting[self._spawn(ray, slot, factory)] = slot
            while next_out < len(units):
                if ready and (self.ready_at is not None or not self.warmup):
                    load = {slot: 0 for slot in ready}
                    for slot, _ in inflight.values():
                        load[slot] = load.get(slot, 0) + 1
                    while pending and pending[0] < next_out + window:
                        slot = min(ready, key=lambda s: (load[s], s))  # the least busy actor
                        if load[slot] >= self.depth:
                            break
                        pos = pending.popleft()
                        inflight[self._handles[slot].run.remote(units[pos])] = (slot, pos)
                        load[slot] += 1
                if not inflight and not starting:
                    raise ClusterError(f"Every Ray actor was lost ({self.actors_lost} died) and no replacement "
                                       "could start; check the cluster's nodes (`ray status`) and rerun the same "
                                       "command: it resumes.")
                done, _ = ray.wait(list(inflight) + list(starting), num_returns=1, timeout=1.0)
                for ref in done:
                    if ref in starting:
                        slot = starting.pop(ref)
                        try:
                            self.pids[slot] = ray.get(ref)
                        except RayTaskError as exc:
                            raise _cause(exc) from None
                        except (RayActorError, unavailable) as exc:
                            replacements = self._lost(ray, slot, exc, inflight, pending, attempts, ready, starting,
                                                      replacements, next_slot, factory)
                            next_slot += 1
                            continue
                        ready.add(slot)
                        if self.ready_at is None and len(self.pids) >= self.plan.actors:
                            self.ready_at = time.perf_counter()
                        continue
                    if ref not in inflight:  # already requeued with its dead actor
                        continue
                    slot, pos = inflight.pop(ref)
                    try:
                        results[pos] = ray.get(ref)
                        self.units_by_actor[slot] = self.units_by_actor.get(slot, 0) + 1
                    except RayTaskError as exc:
                        raise _cause(exc) from None
                    except (RayActorError, unavailable) as exc:
                        replacements = self._lost(ray, slot, exc, inflight, pending, attempts, ready, starting,
                                                  replacements, next_slot, factory, also=pos)
                        next_slot += 1
                while next_out in results:
                    yield results.pop(next_out)
                    next_out += 1
        finally:
            self.close()

    def _lost(self, ray, slot, exc, inflight, pending, attempts, ready, starting, replacements, next_slot, factory,
              also: int | None = None):
        """An actor died: requeue its units (in order, at the front), count attempts, start a replacement."""
        self.actors_lost += 1
        ready.discard(slot)
        mine = {pos for s, pos in inflight.values() if s == slot} | ({also} if also is not None else set())
        for ref in [ref for ref, (s, _) in inflight.items() if s == slot]:
            del inflight[ref]
        requeued = sorted(set(pending) | mine)
        pending.clear()
        pending.extend(requeued)
        for pos in sorted(mine):
            attempts[pos] = attempts.get(pos, 0) + 1
            if attempts[pos] >= self.max_attempts:
                raise ClusterError(f"Unit {pos} of this run was lost with {attempts[pos]} Ray actors in turn (last: "
                                   f"{_first_line(exc)}); it may exhaust the node's memory. Rerun the same command "
                                   "to resume, with fewer --actors or a smaller --batch-size.")
        self.redone += len(mine)
        handle = self._handles.pop(slot, None)
        if handle is not None:
            ray.kill(handle, no_restart=True)
        self.log(f"a Ray actor died ({_first_line(exc)}); {len(mine)} unit(s) go to the other actors")
        if replacements > 0:
            starting[self._spawn(ray, next_slot, factory)] = next_slot
            return replacements - 1
        return replacements

    def close(self) -> None:
        if not self._handles:
            return
        from .cluster import import_ray

        ray = import_ray()
        for handle in self._handles.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or the connection is closing
                pass
        self._handles.clear()


def _cause(exc) -> BaseException:
    """The exception the work raised inside the actor (a SteerkitError stays one), not Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, SteerkitError):
        return cause
    if isinstance(cause, BaseException):
        return RuntimeError(f"a Ray actor failed: {type(cause).__name__}: {cause}")
    return RuntimeError(f"a Ray actor failed: {_first_line(exc)}")


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

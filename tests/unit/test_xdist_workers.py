"""``-n auto`` (the README's test command) starts one worker per core, no more than the memory holds."""

from __future__ import annotations

import os

import pytest
from xdist_workers import WORKER_MEMORY, auto_workers, this_machine

GIB = 2**30


@pytest.mark.parametrize(("cpus", "memory", "workers"), [
    (2, 24 * GIB, 2),     # the CI machine: both cores
    (16, 32 * GIB, 3),    # many cores, little memory: three workers of 11 GB, not sixteen
    (16, 256 * GIB, 16),  # memory to spare: one per core
    (8, 4 * GIB, 1),      # less than one worker's share: still one worker
    (4, None, 4),         # memory unknown: one per core
])
def test_workers_are_bounded_by_cores_and_memory(cpus, memory, workers):
    assert auto_workers(cpus, memory) == workers


def test_the_bound_is_the_largest_worker_seen():
    assert auto_workers(64, 3 * WORKER_MEMORY) == 3
    assert auto_workers(64, 3 * WORKER_MEMORY - 1) == 2


def test_xdist_asks_the_suites_hook(request, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install 'steerkit-rad[test]'")
    hook = request.config.pluginmanager.hook.pytest_xdist_auto_num_workers
    assert hook(config=request.config) == auto_workers(*this_machine())
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert hook(config=request.config) == 5  # the user's count: xdist's own hook reads it


def test_this_machine_reports_usable_cores():
    cpus, memory = this_machine()
    assert 1 <= cpus <= (os.cpu_count() or cpus)
    assert memory is None or memory > 0

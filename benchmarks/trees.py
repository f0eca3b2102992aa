"""Before/after in one run: a benchmark's child process on another checkout of steerkit.

A ``--trees`` entry is a checkout (``git worktree add /tmp/old REV``); its directory goes first on the child's
``PYTHONPATH``, so that the child imports that tree's steerkit while running this checkout's script. ``"."`` is this
checkout, as installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def tree_env(tree: str, env: dict | None = None) -> dict:
    """``env`` (default: this process's) with ``tree`` first on ``PYTHONPATH`` (unchanged for ``"."``)."""
    env = dict(os.environ if env is None else env)
    if tree != ".":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tree).resolve()), env.get("PYTHONPATH")]))
    return env


def run_child(tree: str, script: str, args: list[str], timeout: float = 1800) -> dict:
    """Run ``python script *args`` on ``tree``'s steerkit and return the JSON object its last line of output prints."""
    done = subprocess.run([sys.executable, script, *args], env=tree_env(tree), capture_output=True, text=True,
                          timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternated(setups: list, rounds: int):
    """``(round, setups in that round's order)``: the order reversed every other round, so that a slow drift of the
    machine falls on every set-up alike."""
    for r in range(rounds):
        yield r, (setups if r % 2 == 0 else setups[::-1])

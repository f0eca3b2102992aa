"""What a training run needs from its process: stop requests between steps, logging, and the hardware record."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import threading
from pathlib import Path

import torch


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag checked between steps (so a checkpoint is never half an update)."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        if threading_main():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def hardware(device: str = "cpu") -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else None
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "gpu": gpu, "device": str(device)}


def log(message: str, progress_bar=None) -> None:
    if progress_bar is not None:
        progress_bar.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr, flush=True)

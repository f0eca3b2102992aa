"""What a benchmark records of the CPU it ran on: the instruction sets that decide how fast bf16 and int8 run.

This project's machines differ between sessions (an AVX2-only AMD EPYC, a CPU with AVX-512 and AVX512_BF16): a
figure in ``benchmarks/results`` means little without them. Torch-free, so a client-side benchmark can record them
without importing it.
"""

from __future__ import annotations

from pathlib import Path

CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16",
             "amx_int8")


def cpu_flags(cpuinfo: str | None = None) -> dict:
    """The CPU's model name and which of :data:`CPU_FLAGS` it has, from ``cpuinfo`` (the text of /proc/cpuinfo, read
    when not given; empty where it is absent)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    flags = set()
    model = ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
    return {"model": model, **{f: f in flags for f in CPU_FLAGS}}

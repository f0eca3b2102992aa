"""benchmarks/cpu_info.py: what every CPU benchmark records of its machine, read from /proc/cpuinfo's text."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cpu_info import CPU_FLAGS, cpu_flags  # noqa: E402

AVX2_ONLY = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2 vaes
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2 vaes avx512f
"""

SAPPHIRE = "model name\t: Intel Xeon\nflags\t\t: avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_int8\n"


def test_an_avx2_only_cpu_has_no_bf16_or_int8_instructions():
    got = cpu_flags(AVX2_ONLY)
    assert got["model"] == "AMD EPYC 7B13"
    assert got["avx2"] and got["fma"] and got["f16c"]
    # the first processor's line counts, not a later one's
    assert not any(got[f] for f in ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16",
                                    "amx_int8"))
    assert set(got) == {"model", *CPU_FLAGS}


def test_a_cpu_with_native_bf16_and_int8():
    got = cpu_flags(SAPPHIRE)
    assert got["avx512_bf16"] and got["amx_bf16"] and got["amx_int8"] and got["avx512_vnni"]
    assert not got["avx_vnni"] and not got["f16c"]


def test_no_cpuinfo_gives_nothing():
    assert cpu_flags("") == {"model": "", **{f: False for f in CPU_FLAGS}}

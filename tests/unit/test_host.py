"""The runner's record of the machine a run ran on (:mod:`corbin_fl.experiments.host`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from corbin_fl.experiments.host import ISA_FLAGS, host_record

# two processors as Linux's /proc/cpuinfo lists them (abridged: the fields read, and others)
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512cd avx512_bf16 amx_bf16 amx_tile
bugs\t\t: spectre_v1

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Some Other Name
flags\t\t: fpu sse
"""


def test_the_first_processor_names_the_model_and_its_isa_flags(tmp_path: Path) -> None:
    (info := tmp_path / "cpuinfo").write_text(CPUINFO, encoding="utf-8")
    assert host_record(info) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8480+",
        "cpus": os.cpu_count(),
        "isa": ["avx2", "avx512f", "avx512_bf16", "amx_tile"],  # in ISA_FLAGS' order
        "machine": platform.machine(),
    }


def test_a_machine_without_cpuinfo_is_recorded_without_failing(tmp_path: Path) -> None:
    rec = host_record(tmp_path / "missing")
    assert rec["cpu"] == platform.processor() and rec["isa"] == []
    (empty := tmp_path / "empty").write_text("processor\t: 0\nflags\t\t:\n", encoding="utf-8")
    assert host_record(empty)["isa"] == []


def test_this_machine_is_recorded() -> None:
    rec = host_record()
    assert rec["cpus"] == os.cpu_count() and set(rec["isa"]) <= set(ISA_FLAGS)
    if Path("/proc/cpuinfo").exists():
        assert rec["cpu"]  # Linux names a model

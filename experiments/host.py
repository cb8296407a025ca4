"""The machine a run ran on, for the runner's record of the run (``summary.json``'s ``"run"``).

A run's seconds compare only with runs on a like machine: a pool that resumes over sessions
may run on different machines (issue 40's paper pool did: the same code trained a client's
round in 0.11 s on one and 0.07 s on the next). With the simulation runtime the clients and
the server run where the runner does, so this is the machine that did the work; a deployment's
clients run on their own machines, which the app records per node (``client_devices``).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any, Final

CPUINFO: Final[Path] = Path("/proc/cpuinfo")
"""Linux's description of the processors; absent elsewhere."""
ISA_FLAGS: Final[tuple[str, ...]] = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
"""The CPU flags that decide which kernels torch's CPU backend picks (and so its speed), in the
order recorded."""


def host_record(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """``{"cpu": model name, "cpus": logical CPUs, "isa": [flags], "machine": arch}``.

    ``cpu`` is the first processor's ``model name`` in ``cpuinfo`` (``platform.processor()``
    where the file is missing or names none), ``isa`` the flags of :data:`ISA_FLAGS` that its
    first ``flags`` line lists (empty without one), ``cpus`` is ``os.cpu_count()`` and
    ``machine`` ``platform.machine()``. Never raises: a field it cannot read is empty
    (``""``, ``[]``, or 0 CPUs).
    """
    model, flags = "", set[str]()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count() or 0,
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "machine": platform.machine(),
    }

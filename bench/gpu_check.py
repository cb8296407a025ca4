"""The GPU check: every test that touches a device, the main job, and its figures, in one command.

Usage (from the repository root, on a machine with an NVIDIA GPU, or without one)::

    python bench/gpu_check.py [--clients 2] [--rounds 3] [--workers 4] [--m 11200000]
                              [--skip-tests] [--skip-local] [--out DIR]

It says which device it found (``no GPU found`` on a CPU-only machine, and then runs everything on
the CPU: the CUDA cases of the tests skip), then

1. runs ``pytest`` on every test of the in-process layers (``tests/unit``, ``tests/protocol``) that
   touches a device: the whole protocol layer (the mod encodes on the GPU when there is one), the
   tests marked ``device``, the tests named for ``cuda``, ``device`` or ``gpu``, and the mod's
   unit tests (``test_registry``, ``test_policy``);
2. runs the main job, ``corbin-fl local`` with ``device = "auto"``, while it samples the GPU memory
   every process holds (``nvidia-smi``);
3. times the client path of ``corbinq`` (expand_seed + corbinq + pack_bits) and of ``ldpq``
   (+ pack_bits) on each device, in G params/s;

and prints the figures: the test outcome, the run's accuracy per round, the device each client
trained on, per-process start time, the handler's time and its breakdown (imports, device start,
model, data, optimizer set-up, training loop), encoding time, the client-path rates and the GPU
memory held. It exits non-zero if the tests or the run failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from corbin_fl.deploy.follow import read_jsonl

REPO = Path(__file__).resolve().parents[1]

DEVICE_TESTS = "cuda or device or gpu or protocol or test_registry or test_policy"
"""``pytest -k`` expression of the tests that touch a device (names, files and markers: the
``protocol`` marker is set on every test of ``tests/protocol``, ``device`` on the CUDA cases)."""

PARTS = ("startup", "handler", "import", "device", "model", "data", "setup", "train", "encode")
"""``clientapp_seconds`` of a ``metrics.jsonl`` row: process start before the handler, the
handler, its parts, and the mod's encoding."""


def device_report() -> str | None:
    """Print what this machine offers; the CUDA device's name, or None without one."""
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    if not torch.cuda.is_available():
        print("no GPU found: every step runs on the CPU (the CUDA cases of the tests skip)")
        return None
    name = torch.cuda.get_device_name(0)
    print(f"GPU: {name} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s))")
    return name


# ----------------------------------------------------------------------------- 1. tests
def run_tests(workers: int, log: Path) -> tuple[int, str]:
    """Every in-process test that touches a device; its exit status and summary line (the whole
    output goes to ``log``; on a failure the failing tests and their errors are printed)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", DEVICE_TESTS]
    if workers > 0 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    else:
        cmd += ["-p", "no:xdist"]
    cmd += ["tests/unit", "tests/protocol"]
    print("$ python", shlex.join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    log.write_text(proc.stdout + proc.stderr)
    lines = proc.stdout.strip().splitlines()
    tail = lines[-1] if lines else proc.stderr.strip()[-300:]
    if proc.returncode != 0:
        errors = [ln for ln in lines if ln.startswith(("E ", "FAILED", "ERROR", "_____"))]
        print("\n".join(errors[-80:]), file=sys.stderr)
        print(f"(the whole pytest output: {log})", file=sys.stderr)
    return proc.returncode, f"{tail} ({time.monotonic() - t0:.0f} s wall)"


# ----------------------------------------------------------------------------- 2. the main job
class GpuMemory:
    """Samples ``nvidia-smi``'s compute processes: the most memory each process held (MiB)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak: dict[str, tuple[str, int]] = {}
        self.peak_total = 0
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuMemory:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        query = "--query-compute-apps=pid,process_name,used_memory"
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", query, "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                ).stdout
            except (OSError, subprocess.SubprocessError):
                return
            total = 0
            for line in out.strip().splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) != 3 or not parts[2].isdigit():
                    continue
                pid, name, mib = parts[0], parts[1], int(parts[2])
                total += mib
                if mib > self.peak.get(pid, ("", 0))[1]:
                    self.peak[pid] = (name, mib)
            self.peak_total = max(self.peak_total, total)
            self._stop.wait(self.interval)


def run_local(clients: int, rounds: int, out: Path) -> tuple[int, float]:
    """``corbin-fl local`` with ``device = "auto"``; its exit status and wall seconds."""
    cli = shutil.which("corbin-fl")
    head = [cli] if cli else [sys.executable, "-m", "corbin_fl.deploy.cli"]
    cmd = [
        *head,
        "local",
        "--clients",
        str(clients),
        "--rounds",
        str(rounds),
        "--run-config",
        'device="auto"',
        "--out",
        str(out),
        "--quiet",
    ]
    print("$", shlex.join(["corbin-fl", *cmd[len(head) :]]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, check=False)
    return proc.returncode, time.monotonic() - t0


def read_run(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's ``metrics.jsonl`` rows and ``summary.json`` (empty when missing)."""
    rows = read_jsonl(out / "metrics.jsonl")
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return rows, summary


def _s(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def print_run(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Accuracy, the clients' devices and the ClientApp's seconds per round (means over clients)."""
    print("round  test acc  " + "  ".join(f"{p:>8}" for p in PARTS) + "  (seconds)")
    for row in rows:
        secs = row.get("clientapp_seconds") or {}
        acc = row.get("test_accuracy")
        cells = "  ".join(f"{_s(secs.get(p)):>8}" for p in PARTS)
        print(f"{row.get('round', '?'):>5}  {_s(acc):>8}  {cells}")
    accs = tuple(round(float(r["test_accuracy"]), 3) for r in rows if "test_accuracy" in r)
    print(f"test accuracy per round: {accs}")
    print(f"final test accuracy: {_s(summary.get('final_test_accuracy'))}")
    devices = summary.get("client_devices") or (rows[-1].get("devices") if rows else None)
    print(f"client devices: {json.dumps(devices)}")


# ----------------------------------------------------------------------------- 3. client path
def _best(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def client_path_rates(m: int, d: int, repeats: int) -> dict[str, dict[str, float]]:
    """G params/s of the client path on each device: ``corbinq`` (expand_seed + corbinq +
    pack_bits, the packed bits back on the host), ``ldpq`` (+ pack_bits), and the two parts of
    the first: ``expand_seed`` alone (its ChaCha20 keystream is made on the host, then moved to
    the device) and ``corbinq_given_z`` (corbinq + pack_bits with ``z`` already on the device)."""
    from corbin_fl.mechanisms import context_label, corbinq, expand_seed, ldpq, pack_bits

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    seed, label = bytes(range(32)), context_label(1, 1, 17, 42)
    out: dict[str, dict[str, float]] = {}
    for dev in devices:
        w = torch.randn(m, generator=torch.Generator().manual_seed(1)).mul_(0.05).to(dev)
        coins = torch.Generator(device=dev).manual_seed(99)

        def corbin_path(w: torch.Tensor = w, coins: torch.Generator = coins) -> object:
            z = expand_seed(seed, label, m, d, device=w.device)
            return pack_bits(corbinq(w, 0.0, 0.1, 1.0, z, d, lead=True, generator=coins))

        def ldpq_path(w: torch.Tensor = w, coins: torch.Generator = coins) -> object:
            return pack_bits(ldpq(w, 0.0, 0.1, 1.0, generator=coins))

        def expand(w: torch.Tensor = w) -> object:
            return expand_seed(seed, label, m, d, device=w.device)

        z_here = expand_seed(seed, label, m, d, device=dev)

        def quantize(
            w: torch.Tensor = w, z: torch.Tensor = z_here, coins: torch.Generator = coins
        ) -> object:
            return pack_bits(corbinq(w, 0.0, 0.1, 1.0, z, d, lead=True, generator=coins))

        corbin_path()  # warm-up (kernels, the CUDA context)
        ldpq_path()
        out[str(dev)] = {
            "corbinq": m / _best(corbin_path, dev, repeats) / 1e9,
            "ldpq": m / _best(ldpq_path, dev, repeats) / 1e9,
            "expand_seed": m / _best(expand, dev, repeats) / 1e9,
            "corbinq_given_z": m / _best(quantize, dev, repeats) / 1e9,
        }
    return out


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when the tests and the run succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2, help="SuperNodes of the run (2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the run (3)")
    parser.add_argument(
        "--workers", type=int, default=4, help="pytest-xdist workers for the tests (0: serial)"
    )
    parser.add_argument("--m", type=int, default=11_200_000, help="parameters (client path)")
    parser.add_argument("--d", type=int, default=5, help="shared bits per parameter")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats (best kept)")
    parser.add_argument(
        "--out", type=Path, default=None, help="pytest.log and run/ go here (default: a temp dir)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="do not run the tests")
    parser.add_argument("--skip-local", action="store_true", help="do not run corbin-fl local")
    args = parser.parse_args(argv)

    print("== device")
    gpu = device_report()
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    tests_line = "skipped"
    if not args.skip_tests:
        print("\n== 1. tests that touch a device", flush=True)
        rc, tests_line = run_tests(args.workers, out / "pytest.log")
        failed |= rc != 0
        print(tests_line)

    memory: GpuMemory | None = None
    local_line = "skipped"
    if not args.skip_local:
        print("\n== 2. the main job: corbin-fl local, device = auto", flush=True)
        with GpuMemory() as memory:
            rc, wall = run_local(args.clients, args.rounds, out / "run")
        failed |= rc != 0
        local_line = f"exit {rc}, {wall:.0f} s wall, files in {out / 'run'}"
        print(local_line)
        print_run(*read_run(out / "run"))

    print("\n== 3. client path", flush=True)
    rates = client_path_rates(args.m, args.d, args.repeats)
    for dev, rate in rates.items():
        print(
            f"{dev:>5}: corbinq {rate['corbinq']:.3f} G params/s, ldpq {rate['ldpq']:.3f} "
            f"G params/s (m = {args.m:,}, d = {args.d}, with pack_bits to the host)"
        )
        print(
            f"{'':>5}  of which expand_seed alone (host ChaCha20, then to {dev}) "
            f"{rate['expand_seed']:.3f} G params/s, corbinq + pack_bits with z given "
            f"{rate['corbinq_given_z']:.3f} G params/s"
        )

    print("\n== GPU memory held during the run")
    if gpu is None or memory is None or not memory.available:
        print("not measured (no GPU or no nvidia-smi, or the run was skipped)")
    else:
        for pid, (name, mib) in sorted(memory.peak.items(), key=lambda kv: -kv[1][1]):
            print(f"pid {pid:>7}  {mib:>6} MiB  {os.path.basename(name)}")
        print(f"most held at once: {memory.peak_total} MiB over {len(memory.peak)} process(es)")

    print("\n== summary")
    print(f"device: {gpu or 'CPU only (no GPU found)'}")
    print(f"tests: {tests_line}")
    print(f"run: {local_line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

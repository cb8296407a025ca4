"""Peak memory of the server's aggregation and of the client's quantization step.

Usage::

    python bench/bench_memory.py [--clients 50 --eps 1.0 --d 5]

Every scenario runs in a FRESH Python subprocess. The baseline is the resident set size right
after the imports; peaks are the kernel's ``VmHWM`` (reset with ``/proc/self/clear_refs``, so they
are exact and exclude the import transients), falling back to ``resource.getrusage`` ``ru_maxrss``
(an upper bound) where that is unavailable. The model layout is ResNet18 for CIFAR-10 (11.2M
parameters, 102 float tensors), computed once in the parent and passed to the children, which
allocate only what the scenario needs.

Server (budget: ``3 x`` the model's float32 size ``4m`` plus the packed updates alive). Figure:
the peak RSS over the baseline DURING the aggregation, i.e. its inputs (the global model ``w`` and
the per-layer ``c``, ``r``) plus everything the aggregation allocates, exactly as
``server/round.py`` calls ``server/aggregation.py``:

- ``server-stream``: ``make_aggregator(cfg, w, c_layer, r_layer, layout)``, then for each of the
  ``--clients`` replies one Flower ``ArrayRecord`` holding the packed update (``np.save`` bytes,
  as deserialized from the wire) validated, decoded and folded into the ``BitCounter`` (one
  record alive at a time), then ``estimate()`` (written over the int32 counts) and
  ``apply_global_lr(..., inplace=True)``;
- ``server-batch``: the same with every reply's record alive before aggregation (what happens
  when one ``grid.pull_messages`` call returns all replies at once).

Client (budget: ``2 x 4m``). Figure: the peak of the quantization step over the RSS at its start
(the trained model ``w``, the global model and the per-layer ``c``, ``r`` received from the
server are its inputs): ``client.encode.encode`` of a paired CorBin client, i.e. ``expand_seed``
(ChaCha20 -> ``z``, int16), ``corbinq`` layer by layer with scalar ``c_l``, ``r_l`` into one bool
vector, ``pack_bits``. A check also confirms that the layer-by-layer call gives the SAME bits as
one call on the per-element expansion of ``c``, ``r`` (same ``z``, same tie coins).

Printed: model float32 bytes, packed bytes, peak RSS deltas, the ratio to the budget, and the
RSS after each step of each scenario.
"""

from __future__ import annotations

import argparse
import json
import resource
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def _peak_bytes() -> int:
    """Peak RSS of this process so far (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _status_bytes(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status`` (0 where unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark ``VmHWM`` (Linux >= 4.0: ``clear_refs`` value 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class _Meter:
    """Resident memory of this process relative to a baseline taken at construction.

    The baseline is the current RSS after the imports. ``peak()`` is the kernel's ``VmHWM``
    after a reset at the baseline (exact, Linux); where it cannot be reset, ``ru_maxrss``, which
    cannot be reset either and so includes the import peak (an upper bound).
    """

    def __init__(self) -> None:
        import gc

        gc.collect()
        self.hwm_ok = _reset_hwm()
        self.base = _status_bytes("VmRSS") or _peak_bytes()
        self.trace: list[tuple[str, int, int]] = []
        self._earlier_peak = 0
        self._phase_start = 0

    def _abs_peak(self) -> int:
        return _status_bytes("VmHWM") if self.hwm_ok else _peak_bytes()

    def peak(self) -> int:
        """Peak RSS since the baseline, over the baseline."""
        return max(self._earlier_peak, self._abs_peak()) - self.base

    def start_phase(self) -> None:
        """Start measuring a phase: its peak will be taken over the RSS of this moment."""
        import gc

        gc.collect()
        self._earlier_peak = max(self._earlier_peak, self._abs_peak())
        if self.hwm_ok:
            _reset_hwm()
        self._phase_start = _status_bytes("VmRSS")

    def phase_peak(self) -> int:
        """Peak RSS since :meth:`start_phase`, over the RSS at its start (exact with VmHWM)."""
        return self._abs_peak() - self._phase_start

    def phase_total(self) -> int:
        """Peak RSS since :meth:`start_phase`, over the baseline (the phase's inputs included)."""
        return self._abs_peak() - self.base

    def now(self) -> int:
        return _status_bytes("VmRSS") - self.base

    def mark(self, label: str) -> None:
        self.trace.append((label, self.now(), self.peak()))


# ============================================================================ children
def _layout(spec: dict[str, Any]) -> Any:
    from corbin_fl.layout import ParamLayout

    sizes = tuple(int(s) for s in spec["sizes"])
    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += s
    return ParamLayout(
        names=tuple(spec["names"]),
        shapes=tuple(tuple(int(x) for x in sh) for sh in spec["shapes"]),
        offsets=tuple(offsets),
        sizes=sizes,
        m=total,
    )


def _all_finite(vec: Any, block: int = 1 << 20) -> bool:
    """``torch.isfinite(vec).all()`` in blocks (the one-shot call has model-sized temporaries)."""
    import torch

    return all(bool(torch.isfinite(vec[i : i + block]).all()) for i in range(0, vec.numel(), block))


def _child(scenario: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one scenario in this (fresh) process and return its figures."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord

    from corbin_fl import wire
    from corbin_fl.config import RunConfig
    from corbin_fl.layout import layer_center_radius
    from corbin_fl.mechanisms.packing import BitCounter, mean_from_counts, pack_bits
    from corbin_fl.mechanisms.quantizers import corbinq
    from corbin_fl.mechanisms.randomness import expand_seed
    from corbin_fl.server.aggregation import apply_global_lr, make_aggregator

    # imported so that their import cost is in the baseline, not in a phase
    _ = (BitCounter, mean_from_counts, pack_bits, corbinq, expand_seed)
    torch.set_num_threads(1)
    layout = _layout(spec)
    m = layout.m
    clients, eps, d = int(spec["clients"]), float(spec["eps"]), int(spec["d"])
    cfg = RunConfig.from_flower({"mechanism": "corbin", "epsilon": eps, "d": d})
    gen = np.random.default_rng(1)
    nbytes = wire.packed_len(m)
    pad = 8 * nbytes - m
    tgen = torch.Generator().manual_seed(1)
    meter = _Meter()
    t0 = time.perf_counter()

    def model_vector() -> torch.Tensor:
        w = torch.empty(m, dtype=torch.float32)
        torch.randn(m, generator=tgen, out=w)
        return w.mul_(0.05)

    def packed_record() -> ArrayRecord:
        raw = gen.integers(0, 256, size=nbytes, dtype=np.uint8)
        if pad:
            raw[-1] &= np.uint8((0xFF << pad) & 0xFF)
        return ArrayRecord({wire.BITS: wire.to_array(raw)})

    mark = meter.mark
    w = model_vector()
    if scenario.startswith("server"):
        mark("inputs: global model w")
        inputs = meter.now()
        c_layer, r_layer = layer_center_radius(w, layout, 0.0, 1e-3)
        mark("per-layer c, r")
        meter.start_phase()  # server/aggregation.py from here on
        agg = make_aggregator(cfg, w, c_layer, r_layer, layout)
        mark("aggregator")
        if scenario == "server-batch":
            records = [packed_record() for _ in range(clients)]
            mark(f"{clients} reply records held")
            for rec in records:
                agg.add(rec)
            del records
        else:
            for _ in range(clients):
                agg.add(packed_record())
        mark(f"{clients} updates counted")
        est = agg.estimate()
        assert est is not None
        mark("estimate (over the counts buffer)")
        w_new = apply_global_lr(w, est, cfg.global_lr, inplace=True)
        assert w_new.shape == (m,) and _all_finite(w_new)
        mark("new global model")
    else:
        from flwr.app import Context, RecordDict

        from corbin_fl.client.encode import encode
        from corbin_fl.client.shared import Shared

        w_global = model_vector()
        c_layer, r_layer = layer_center_radius(w_global, layout, 0.0, 1e-3)
        mark("inputs: trained model w, global model, per-layer c, r")
        inputs = meter.now()
        context = Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
        shared = Shared(partner=12, lead=True, secret=secrets.token_bytes(32))
        meter.start_phase()  # the quantization step from here on
        key, packed, _, _ = encode(
            cfg,
            context,
            w=w,
            w_global=w_global,
            c=c_layer,
            r=r_layer,
            layout=layout,
            rnd=1,
            assignment=wire.PAIRED,
            shared=shared,
            shared_seed=None,
        )
        assert key == wire.BITS and packed.shape == (nbytes,)
        mark("encode: z, corbinq per layer, pack_bits")
    seconds = time.perf_counter() - t0
    return {
        "scenario": scenario,
        "m": m,
        "baseline": meter.base,
        "inputs_delta": inputs,
        "peak_delta": meter.peak(),
        "phase_peak": meter.phase_peak(),
        "phase_total": meter.phase_total(),
        "seconds": seconds,
        "exact_peak": meter.hwm_ok,
        "trace": meter.trace,
    }


def _run_child(scenario: str, spec_path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", scenario, "--spec", str(spec_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scenario {scenario} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ============================================================================ parent
def _resnet18_spec() -> dict[str, Any]:
    from corbin_fl.app.models import build_model
    from corbin_fl.layout import layout_of

    layout = layout_of(build_model("resnet18", 3, 10, seed=0))
    return {"names": layout.names, "shapes": layout.shapes, "sizes": layout.sizes}


def _check_per_layer_equals_per_element(spec: dict[str, Any]) -> bool:
    """Same ``z`` and the same tie coins: per-layer scalars give the per-element bits exactly."""
    import torch

    from corbin_fl.layout import expand_per_element, layer_center_radius
    from corbin_fl.mechanisms.quantizers import corbinq

    small = {"names": spec["names"][:6], "shapes": spec["shapes"][:6], "sizes": spec["sizes"][:6]}
    layout = _layout(small)
    g = torch.Generator().manual_seed(3)
    w = 0.05 * torch.randn(layout.m, generator=g)
    c_l, r_l = layer_center_radius(w, layout, 0.0, 1e-3)
    z = torch.randint(0, 32, (layout.m,), generator=g, dtype=torch.int16)
    full = corbinq(
        w,
        expand_per_element(c_l, layout),
        expand_per_element(r_l, layout),
        1.0,
        z,
        5,
        lead=False,
        generator=torch.Generator().manual_seed(9),
    )
    q = torch.Generator().manual_seed(9)
    parts = [
        corbinq(w[o : o + s], float(c_l[i]), float(r_l[i]), 1.0, z[o : o + s], 5, lead=False,
                generator=q)
        for i, (o, s) in enumerate(zip(layout.offsets, layout.sizes, strict=True))
    ]  # fmt: skip
    return bool(torch.equal(full, torch.cat(parts)))


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; as parent run every scenario in a subprocess and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(Path(args.spec).read_text())
        sys.stdout.write(json.dumps(_child(args.child, spec)) + "\n")
        return 0
    if args.clients < 1:
        parser.error("--clients must be >= 1")

    import tempfile

    spec = {**_resnet18_spec(), "clients": args.clients, "eps": args.eps, "d": args.d}
    m = sum(spec["sizes"])
    model_bytes = 4 * m
    packed_bytes = (m + 7) // 8
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        results = {s: _run_child(s, spec_path) for s in ("server-stream", "server-batch", "client")}
    lines = [
        f"model: ResNet18 / CIFAR-10, m = {m:,} parameters, {len(spec['sizes'])} layers",
        f"model float32 bytes (4m): {model_bytes:,} ({model_bytes / MIB:.1f} MiB)",
        f"one packed update (ceil(m/8)): {packed_bytes:,} ({packed_bytes / MIB:.2f} MiB); "
        f"{args.clients} of them: {args.clients * packed_bytes / MIB:.1f} MiB",
        "",
        "measured: server = peak RSS during the aggregation over the after-imports baseline",
        "(inputs w, c, r included); client = peak of the quantization step over its start.",
        "",
        f"{'scenario':<23} {'measured':>10} {'budget':>10} {'ratio':>6} {'seconds':>8}",
    ]
    verdict: dict[str, float] = {}
    for name, res in results.items():
        if name == "server-stream":  # 3 x 4m + the one update being decoded
            budget, measured = 3 * model_bytes + packed_bytes, res["phase_total"]
        elif name == "server-batch":  # 3 x 4m + every reply's packed update alive at once
            budget, measured = 3 * model_bytes + args.clients * packed_bytes, res["phase_total"]
        else:  # the quantization step against 2 x 4m
            budget, measured = 2 * model_bytes, res["phase_peak"]
        verdict[name] = measured / budget
        lines.append(
            f"{name:<23} {measured / MIB:>6.1f} MiB {budget / MIB:>6.1f} MiB "
            f"{verdict[name]:>6.2f} {res['seconds']:>8.2f}"
        )
    for name, res in results.items():
        lines += ["", f"{name}: RSS over the baseline after each step (now / peak so far)"]
        lines += [
            f"  {label:<40} {now / MIB:>7.1f} MiB / {peak / MIB:>7.1f} MiB"
            for label, now, peak in res["trace"]
        ]
    lines += [
        "",
        "peak = kernel VmHWM reset at the baseline (exact)"
        if all(r["exact_peak"] for r in results.values())
        else "peak = ru_maxrss (includes the import peak: an upper bound)",
        "within budget: "
        + ", ".join(f"{k} {'yes' if v <= 1.0 else 'NO'}" for k, v in verdict.items()),
        "corbinq layer by layer gives the same bits as on per-element c, r (same z, same coins): "
        f"{_check_per_layer_equals_per_element(spec)}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The composed guarantee against the sum-seeing server against its own bounds (issue 38, part 2).

For each cell of the grid ``eps_p x n x delta x K`` (the one-bit mechanisms: ``ldpfl``, ``pbm``
with one trial, ``rqm`` with 2 levels; :func:`corbin_fl.mechanisms.secure_sum.one_bit_profile`)
it prints:

* ``project``: the figure the run's privacy report uses, the per-update ``eps`` of
  :func:`~corbin_fl.mechanisms.secure_sum.compose_run` with ``m = K`` steps and one round;
* ``lower``: a lower bound, the worst single ordered vertex pair composed exactly ``K`` times
  with optimistic rounding (:func:`corbin_fl.mechanisms.server_pld.fixed_vertex_lower_bound`,
  an array of ``2^--lower-fft`` losses: each step's loss is rounded down by up to one gap, so
  a coarser array gives a lower, still valid, bound);
* ``rdp``: a plain Renyi-DP upper bound, ``K max D_alpha`` over every vertex pair and both
  orders, converted with Canonne-Kamath-Steinke at the best of a grid of orders
  (:func:`corbin_fl.mechanisms.server_pld.rdp_epsilon`);
* ``envelope``: the connect-the-dots envelope PLD alone, composed at the same grid (the figure
  before issue 38; ``--no-envelope`` skips it);
* the ratios ``project/lower``, ``rdp/lower``, ``project/rdp``, and ``dominant``: the ordered
  vertex pair that dominates every other for every ``g >= 0`` (``family:k:direction``,
  :func:`corbin_fl.mechanisms.server_pld.dominant_pair`, an exact check) or ``-``.

A final row is the real run's update: ``eps_p = 1``, ``n = 4``, ``K = 421,642`` (the CNN),
``delta = 1e-5`` (``--no-real`` skips it). ``--check`` exits 1 if a cell breaks the issue's
goal: ``project < lower``, ``project > rdp``, or ``project > 1.02 lower`` where a vertex
dominates. Times are process CPU seconds.

Usage::

    python bench/bench_server_accounting.py
    python bench/bench_server_accounting.py --eps-p 1 --n 4 10 --steps 1000 --no-real
    python bench/bench_server_accounting.py --n 3 5 9 --check
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.mechanisms import secure_sum as ss
from corbin_fl.mechanisms import server_pld as sp

CNN_PARAMETERS = 421_642
"""``app.models.SmallCNN()``'s floating-point entries: one update's steps."""


def envelope_eps(profile: ss.SumProfile, steps: int, delta: float, max_fft: int) -> float:
    """The connect-the-dots envelope PLD alone, at ``compose_run``'s grid (the old figure)."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    g = ss._grid(profile)
    s = ss._stride(g, steps, max_fft)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        g.h * s, g.lo // s, g.hi // s, g.deltas[::s]
    )
    return float(sp.self_compose(PrivacyLossDistribution(pmf), steps).get_epsilon_for_delta(delta))


def cell(
    profile: ss.SumProfile,
    dominant: sp.Dominant | None,
    curve: tuple[Any, Any],
    steps: int,
    delta: float,
    envelope: bool,
    lower_fft: int,
) -> dict[str, Any]:
    """One cell's figures."""
    c0 = time.process_time()
    project = ss.compose_run(profile, steps, 1, delta)[0].eps
    c1 = time.process_time()
    lower, worst = sp.fixed_vertex_lower_bound(profile, steps, delta, max_fft=lower_fft)
    rdp = sp.rdp_epsilon(profile, steps, delta, curve=curve)
    env = envelope_eps(profile, steps, delta, ss._REPORT_FFT) if envelope else math.nan
    return {
        "eps_p": profile.local_eps,
        "n": profile.n,
        "delta": delta,
        "K": steps,
        "dominant": "-"
        if dominant is None
        else f"{dominant.family}:{dominant.k}:{dominant.direction}",
        "worst": f"{worst[1]}:{worst[2]}",
        "lower": lower,
        "rdp": rdp,
        "envelope": env,
        "project": project,
        "project_s": c1 - c0,
        "cell_s": time.process_time() - c0,
    }


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else "inf"
    return f"{x:,.1f}" if x >= 100 else f"{x:.4g}"


HEAD = (
    "eps_p",
    "n",
    "delta",
    "K",
    "dominant",
    "worst fixed",
    "lower",
    "rdp",
    "envelope",
    "project",
    "project/lower",
    "rdp/lower",
    "project/rdp",
    "cpu s",
)


def row(r: dict[str, Any]) -> str:
    """One Markdown table row (a direction's ``||`` escaped, ``P\\|\\|Q``: a bare ``|`` ends a
    Markdown cell)."""
    vals = (
        f"{r['eps_p']:g}",
        str(r["n"]),
        f"{r['delta']:g}",
        f"{r['K']:,}",
        r["dominant"],
        r["worst"],
        _fmt(r["lower"]),
        _fmt(r["rdp"]),
        _fmt(r["envelope"]),
        _fmt(r["project"]),
        f"{r['project'] / r['lower']:.4f}",
        f"{r['rdp'] / r['lower']:.4f}",
        f"{r['project'] / r['rdp']:.4f}",
        f"{r['cell_s']:.1f}",
    )
    vals = tuple(v.replace("||", "\\|\\|") for v in vals)
    return "| " + " | ".join(vals) + " |"


def failures(r: dict[str, Any]) -> list[str]:
    """The issue's goals this cell breaks (relative slack 1e-9 for float rounding)."""
    out = []
    if r["project"] < r["lower"] * (1 - 1e-9):
        out.append("project below the lower bound")
    if r["project"] > r["rdp"] * (1 + 1e-9):
        out.append("project above the RDP bound")
    if r["dominant"] != "-" and r["project"] > 1.02 * r["lower"]:
        out.append("project above 1.02 x lower where a vertex dominates")
    return out


def parser() -> argparse.ArgumentParser:
    """The command line (documented in docs/BENCHMARKS.md)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--eps-p", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 10, 50])
    ap.add_argument("--delta", type=float, nargs="+", default=[1e-5, 1e-6])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--no-real", action="store_true", help="skip the real run's update row")
    ap.add_argument("--no-envelope", action="store_true", help="skip the envelope-only column")
    ap.add_argument("--check", action="store_true", help="exit 1 if a cell breaks a goal")
    ap.add_argument(
        "--lower-fft",
        type=int,
        default=22,
        help="log2 of the lower bound's PLD array (finer: a tighter lower bound, slower)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Print the grid; with ``--check``, exit 1 where a goal fails."""
    args = parser().parse_args(argv)
    cells = [
        (e, n, d, k) for e in args.eps_p for n in args.n for d in args.delta for k in args.steps
    ]
    if not args.no_real:
        cells.append((1.0, 4, 1e-5, CNN_PARAMETERS))
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "---|" * len(HEAD))
    profiles: dict[tuple[float, int], tuple[ss.SumProfile, Any, Any]] = {}
    bad = 0
    start = time.process_time()
    for e, n, d, k in cells:
        if (e, n) not in profiles:
            prof = ss.one_bit_profile(e, n)
            profiles[(e, n)] = (prof, sp.dominant_pair(prof), sp.coarse_rdp_curve(prof))
        prof, dom, curve = profiles[(e, n)]
        r = cell(prof, dom, curve, k, d, not args.no_envelope, 1 << args.lower_fft)
        print(row(r), flush=True)
        for f in failures(r):
            print(f"FAIL eps_p={e:g} n={n} delta={d:g} K={k}: {f}", flush=True)
            bad += 1
    print(f"{len(cells)} cells, {bad} failures, {time.process_time() - start:.0f} CPU s")
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())

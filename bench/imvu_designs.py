"""The I-MVU designs against the bounds the solver must meet (issue 30).

For every shipped ``(bits, eps)`` the table prints the mean variance over the design's input
points (``MVUTable.mean_variance``, the LP's objective, in units of ``r^2``) of

- ``before``: the committed design of the previous solver version (read from git: the newest
  commit of ``corbin_fl/mvu_tables/`` whose files hold an older ``version``);
- ``shipped``: the design the app uses now (its store's, ``corbin_fl.design_store``), or with
  ``--solve`` a fresh ``solve_mvu`` (searched from the shipped lower-bit design);
- ``LP at starts``: the best of ``mvu_at`` (the LP at fixed output values) over the starts: the
  previous design's values, the lower-bit design's values completed to ``2^bits``, evenly spaced
  values on ``[-1.5 s, 1.5 s]`` (``s = 1 / tanh(eps / 2)``), and at 2 bits and eps 0.1 the
  asymmetric output values quoted in issue 30 (-20.02, 19.77, 20.65, 22.03);
- ``lower bits``: the shipped design with the next smaller budget.

``ok`` says the design is no worse than every bound. A second table gives each design's
exactness on 20001 evenly spaced inputs of ``[-1, 1]`` (the linear interpolation of
``IMVU.probabilities``): the largest bias ``|E[v] - x|``, the largest log likelihood ratio on
those inputs and the exact epsilon ``IMVU.epsilon()`` (both at most ``eps``), and the asymmetry
``max_k |v_k + v_{K-1-k}|`` of the output values. Run from the repository root::

    python bench/imvu_designs.py            # the shipped designs (seconds)
    python bench/imvu_designs.py --solve    # solve them again (minutes)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.design_store import designs
from corbin_fl.mechanisms.baselines.imvu import (
    IMVU,
    IMVU_BITS,
    INPUT_POINTS,
    MVU_DESIGNS,
    SOLVER_VERSION,
    MVUKey,
    complete_values,
    evenly_spaced,
    mvu_at,
    solve_mvu,
)

ROOT = Path(__file__).resolve().parents[1]
STORE = designs(MVU_DESIGNS)
"""The app's store of the I-MVU designs (its shipped folder: ``corbin_fl/mvu_tables/``)."""
ISSUE_START = {(2, 0.1): (-20.02, 19.77, 20.65, 22.03)}
"""Output values quoted in issue 30 (the authors' best 2-bit values at eps 0.1, rounded)."""


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def previous_designs() -> tuple[str, dict[tuple[int, float], dict[str, object]]]:
    """The newest committed tables of an older solver version: (commit, {(bits, eps): doc})."""
    folder = STORE.shipped.relative_to(ROOT).as_posix()
    try:
        commits = _git("log", "--format=%H", "--", folder).split()
    except (OSError, subprocess.CalledProcessError):
        return "", {}
    for commit in commits:
        docs: dict[tuple[int, float], dict[str, object]] = {}
        for path in _git("ls-tree", "--name-only", commit, f"{folder}/").split():
            doc = json.loads(_git("show", f"{commit}:{path}"))
            if doc.get("version", SOLVER_VERSION) < SOLVER_VERSION:
                docs[(int(doc["bits"]), float(doc["eps"]))] = doc
        if docs:
            return commit, docs
    return "", {}


def main(argv: list[str] | None = None) -> int:
    """Print the table (module docstring); returns 1 when a design is worse than a bound."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--solve", action="store_true", help="solve instead of reading")
    args = parser.parse_args(argv)
    commit, before = previous_designs()
    print(f"before: {commit[:12] or 'none found'}; solver version now {SOLVER_VERSION}")
    head = (
        f"{'bits':>4} {'eps':>5} | {'before':>12} | {'shipped':>12} {'change':>8} | "
        f"{'LP at starts':>12} {'(best start)':>14} | {'lower bits':>12} | ok"
    )
    print(head)
    print("-" * len(head))
    failed = False
    designs = []
    for eps in args.eps:
        lower = None
        for bits in IMVU_BITS:
            k = 1 << bits
            table = (
                solve_mvu(eps, bits, lower=lower) if args.solve else STORE.get(MVUKey(eps, bits))
            )
            starts: dict[str, np.ndarray] = {
                "even": evenly_spaced(eps, k),
            }
            old = before.get((bits, eps))
            if old is not None:
                starts["before"] = np.asarray(old["values"], dtype=np.float64)
            if lower is not None:
                starts["lower"] = complete_values(lower.values, k)
            if (bits, eps) in ISSUE_START:
                starts["issue"] = np.asarray(ISSUE_START[(bits, eps)])
            at = {}
            for name, values in starts.items():
                lp = mvu_at(eps, values, INPUT_POINTS)
                if lp is not None:
                    at[name] = lp.mean_variance
            best = min(at, key=at.__getitem__)
            bounds = [*at.values()] + ([lower.mean_variance] if lower is not None else [])
            ok = all(table.mean_variance <= bound for bound in bounds)
            failed |= not ok
            was = float(old["mean_variance"]) if old is not None else float("nan")  # type: ignore[arg-type]
            change = 100.0 * (table.mean_variance / was - 1.0)
            low = f"{lower.mean_variance:12.6f}" if lower is not None else f"{'-':>12}"
            print(
                f"{bits:>4} {eps:>5g} | {was:12.6f} | {table.mean_variance:12.6f} {change:+7.3f}% "
                f"| {at[best]:12.6f} {'(' + best + ')':>14} | {low} | {'yes' if ok else 'NO'}"
            )
            lower = table
            designs.append(table)
    print()
    head = (
        f"{'bits':>4} {'eps':>5} | {'max |bias|':>10} | {'grid eps':>12} | "
        f"{'exact eps':>12} | asymmetry"
    )
    print(head)
    print("-" * len(head))
    x = torch.linspace(-1.0, 1.0, 20001, dtype=torch.float64)
    for table in designs:
        mech = IMVU(table.eps, table.bits, table)
        p = mech.probabilities(x)
        bias = float((p @ torch.as_tensor(table.values) - x).abs().max())
        hi, lo = p.max(dim=0).values, p.min(dim=0).values
        used = hi > 0
        grid_eps = float(torch.log(hi[used] / lo[used]).max())
        v = np.sort(table.values)
        failed |= not (grid_eps <= table.eps and mech.epsilon() <= table.eps)
        print(
            f"{table.bits:>4} {table.eps:>5g} | {bias:10.1e} | {grid_eps:12.9f} | "
            f"{mech.epsilon():12.9f} | {np.abs(v + v[::-1]).max():.1e}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Solve the I-MVU designs of the experiments' eps grid and store them with the package.

``corbin_fl/mvu_tables/`` holds one JSON file per ``(eps, bits, inputs)`` with its
inputs; the app's design store (:mod:`corbin_fl.design_store`) reads it (after checking it is
stochastic, unbiased and exactly eps-LDP) instead of solving on every machine. The budgets of
one eps are solved in increasing order, each searched from the one before
(``solve_mvu(..., lower=...)``), so a design is never worse than the one with fewer bits. Files
of another solver version are left in place: delete them (``git rm``) when the new ones are
written. Run from the repository root::

    python bench/solve_mvu_tables.py                     # eps 0.1 0.3 1 3, bits 1 2 4
    python bench/solve_mvu_tables.py --eps 0.5 --bits 2  # add one more
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.design_store import designs
from corbin_fl.mechanisms.baselines.imvu import IMVU_BITS, MVU_DESIGNS, MVUTable, solve_mvu

STORE = designs(MVU_DESIGNS)


def main(argv: list[str] | None = None) -> int:
    """Solve and write each requested table; prints its time and mean variance."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--bits", type=int, nargs="+", default=list(IMVU_BITS))
    parser.add_argument("--out", type=Path, default=STORE.shipped)
    args = parser.parse_args(argv)
    for eps in args.eps:
        lower: MVUTable | None = None
        for bits in sorted(args.bits):
            t0 = time.perf_counter()
            below = [b for b in IMVU_BITS if b < bits]
            if below and (lower is None or lower.bits != below[-1]):
                lower = solve_mvu(eps, below[-1])
            table = solve_mvu(eps, bits, lower=lower)
            lower = table
            path = STORE.write(table, args.out)
            print(
                f"eps {eps:g} bits {bits}: mean variance {table.mean_variance:.6g} "
                f"({time.perf_counter() - t0:.1f} s) -> {path}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

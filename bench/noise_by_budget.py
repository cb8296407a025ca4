"""Per-parameter noise of the bits-frontier mechanisms at each eps_p (the numbers of
docs/results/quick/bits-frontier/discussion.md).

Usage::

    python bench/noise_by_budget.py [--eps 0.1 0.3 1 3] [--pairs 100000] [--seed 0]

Prints two markdown tables, in units of r^2 (inputs in the normalised range [-1, 1]):

(a) each private-bit mechanism's variance ``FiniteMechanism.variance`` (and LDPQ's
    ``alpha^2 - x^2``), averaged over inputs uniform on a grid of [-1, 1], as the runs
    configured them (PBM m = 1, 2; RQM 2, 3 levels; I-MVU 1, 2, 4 bits from the shipped
    designs);
(b) the exact pair MSE of CorBinQ (``mechanisms.theory.corbin_pair_mse``, d = 5) and of two
    independent LDPQ quantizers (``ldpq_pair_mse``), averaged over ``--pairs`` pairs of inputs
    drawn uniformly from [-1, 1] (seeded), and their ratio.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from corbin_fl.design_store import designs
from corbin_fl.mechanisms.baselines.imvu import IMVU, MVU_DESIGNS, MVUKey
from corbin_fl.mechanisms.baselines.pbm import PBM
from corbin_fl.mechanisms.baselines.rqm import RQM
from corbin_fl.mechanisms.theory import corbin_pair_mse, ldpq_pair_mse

D = 5


def variances(eps: float, x: torch.Tensor) -> dict[str, float]:
    """Mean variance over ``x`` of LDPQ and each private-bit mechanism at ``eps``."""
    alpha = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    out = {"LDPQ (1 bit)": float((alpha**2 - x**2).mean())}
    store = designs(MVU_DESIGNS)
    mechanisms = {
        "PBM m=1": PBM(eps, 1),
        "PBM m=2": PBM(eps, 2),
        "RQM 2 levels": RQM(eps, 2),
        "RQM 3 levels": RQM(eps, 3),
        "I-MVU 1 bit": IMVU(eps, 1, store.get(MVUKey(eps, 1))),
        "I-MVU 2 bits": IMVU(eps, 2, store.get(MVUKey(eps, 2))),
        "I-MVU 4 bits": IMVU(eps, 4, store.get(MVUKey(eps, 4))),
    }
    out.update({name: float(m.variance(x).mean()) for name, m in mechanisms.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    x = torch.linspace(-1, 1, 2001, dtype=torch.float64)
    table = {eps: variances(eps, x) for eps in args.eps}
    names = list(next(iter(table.values())))
    print("(a) mean per-parameter variance, r^2\n")
    print("| eps_p | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for eps, row in table.items():
        print(f"| {eps:g} | " + " | ".join(f"{row[n]:.4g}" for n in names) + " |")

    rng = np.random.default_rng(args.seed)
    w1, w2 = rng.uniform(-1, 1, args.pairs), rng.uniform(-1, 1, args.pairs)
    print(f"\n(b) mean pair MSE, r^2 (d = {D}, {args.pairs} uniform pairs, seed {args.seed})\n")
    print("| eps_p | CorBinQ pair | LDPQ pair | ratio |")
    print("|---|---|---|---|")
    for eps in args.eps:
        corbin = float(np.mean(corbin_pair_mse(w1, w2, 0.0, 1.0, eps, D)))
        ldpq = float(np.mean(ldpq_pair_mse(w1, w2, 0.0, 1.0, eps)))
        print(f"| {eps:g} | {corbin:.4g} | {ldpq:.4g} | {corbin / ldpq:.1%} |")


if __name__ == "__main__":
    main()

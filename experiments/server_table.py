"""The sum-seeing server's table: each mechanism's guarantee against a server that sees only the
sum of the clients' symbols (secure aggregation, threat model B) at several numbers of clients.

The rows come from the registry, not from a list of names: every registered mechanism whose
symbols in a secure sum are binomial (its entry's ``sum_trials``: the exact worst case of
:func:`corbin_fl.mechanisms.secure_sum.one_bit_guarantee` for one trial,
:func:`~corbin_fl.mechanisms.secure_sum.binomial_guarantee` for more), one row per number of
trials with every mechanism and setting that has it; every paired mechanism with an independent
share (its privacy category's exact guarantee against the sum, at the given ``gamma``); every
other paired mechanism (no DP: :func:`corbin_fl.mechanisms.secure_sum.corbin_against_sum`). A
row's label is the mechanism's registered name with the setting of its integer parameters
(``pbm pbm-trials=2``), or ``gamma`` for an independent share.

``python -m corbin_fl.experiments.server_table`` prints it at the quick-scale settings
(:data:`QUICK`); an experiment's report prints it at its runs' settings
(:func:`corbin_fl.experiments.report.server_scaling`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from corbin_fl import registry
from corbin_fl.config import RunConfig
from corbin_fl.mechanisms import secure_sum as ss
from corbin_fl.mechanisms.protection import protection

__all__ = ["QUICK", "binomial_settings", "format_table", "server_table"]

#: Quick-scale settings of the committed experiments (experiments/quick/*.toml,
#: app/models.py): MNIST small CNN with ``m = 421,642`` parameters, 10 rounds, ``delta = 1e-5``,
#: ``eps_p = 1`` (targets, bits, dropout; ``eps_p = 5`` in mechanisms.toml), AugCorBin-FL
#: ``gamma = 0.2``, CorBin-FL ``d = 5``, binomial symbols of 1 and 2 ``trials`` (PBM's trials in
#: bits-frontier), update range ``R = 0.01`` (range-mode "update").
QUICK: dict[str, Any] = {
    "m": 421_642,
    "rounds": 10,
    "delta": 1e-5,
    "eps_p": 1.0,
    "gamma": 0.2,
    "d": 5,
    "trials": 2,
    "r": 0.01,
}


def binomial_settings(counts: Sequence[int]) -> dict[int, str]:
    """Trials ``M`` of ``counts`` -> the label of the registered mechanisms whose symbols in a
    secure sum are ``Binomial(M, p)`` (their entry's ``sum_trials``), with the setting of their
    integer parameters, ``" / "``-joined (``"ldpfl / pbm pbm-trials=1 / rqm rqm-levels=2"``).

    Tried for each such mechanism, in registration order: its defaults, then each of its integer
    parameters set to each count of ``counts`` that its check accepts. A count that no mechanism
    has is left out.
    """
    found: dict[int, list[str]] = {int(c): [] for c in counts}
    for mech in registry.REGISTRY.values():
        if mech.sum_trials is None:
            continue
        ints = [p for p in mech.params if p.type is int]
        tries = [RunConfig(mechanism=mech.name)]
        for p in ints:
            for count in found:
                cfg = RunConfig(mechanism=mech.name, params={p.key: count})
                if p.problem(count, cfg) is None:
                    tries.append(cfg)
        seen: set[str] = set()
        for cfg in tries:
            trials = mech.sum_trials(cfg)
            setting = " ".join(f"{p.key}={cfg.param(p.key)}" for p in ints)
            label = f"{mech.name} {setting}" if setting else mech.name
            if trials in found and label not in seen:
                seen.add(label)
                found[trials].append(label)
    return {trials: " / ".join(labels) for trials, labels in found.items() if labels}


def server_table(
    ns: Sequence[int] = (10, 100, 1000),
    *,
    eps_p: float = QUICK["eps_p"],
    m: int = QUICK["m"],
    rounds: int = QUICK["rounds"],
    delta: float = QUICK["delta"],
    gamma: float = QUICK["gamma"],
    d: int = QUICK["d"],
    trials: int = QUICK["trials"],
) -> list[dict[str, Any]]:
    """One row per (mechanism, n): the composed guarantee against the sum-seeing server.

    Rows, for each ``n`` (module docstring): the binomial symbols of one trial and of
    ``trials`` trials (:func:`binomial_settings`); each paired mechanism with an independent
    share (the exact bound at ``floor(gamma n + 1/2)`` independent clients, where some client's
    case exists); each other paired mechanism (no DP, at ``d`` shared bits). Only mechanisms
    with a secure-sum form (``sum_levels``) have a row. Keys: ``mechanism`` (the row's label),
    ``n``, ``bits``, ``dp``, ``per_parameter_eps``, ``per_update_eps``, ``all_rounds_eps``,
    ``delta``, ``note`` (the words of :func:`corbin_fl.mechanisms.protection.protection` for the
    run's ``eps``, and what the row was computed at).
    """
    binomial = binomial_settings(sorted({1, int(trials)}))
    paired = [
        mech for mech in registry.REGISTRY.values() if mech.pairs and mech.sum_levels is not None
    ]
    shared = [mech for mech in paired if mech.category.independent_share]
    pairs_only = [mech for mech in paired if not mech.category.independent_share]
    rows: list[dict[str, Any]] = []
    for n in ns:
        for count, label in binomial.items():
            if count == 1:
                g = ss.one_bit_guarantee(eps_p, n, m, rounds, delta)
            else:
                g = ss.binomial_guarantee(eps_p, count, n, m, rounds, delta)
            rows.append(_row(label, n, int(g.get("bits_per_parameter", 1)), g, ""))
        for mech in shared:
            exact_sum = mech.category.exact_sum()
            assert exact_sum is not None  # an independent share declares it
            ac = exact_sum(eps_p, n, gamma, m, rounds, delta)
            if "exact" in ac:
                note = f"{ac['independent']} of {n} independent (floor(gamma n + 1/2))"
                label = f"{mech.name} gamma={gamma}"
                rows.append(_row(label, n, _bits(mech), ac["exact"], note))
        for mech in pairs_only:
            c = ss.corbin_against_sum(eps_p, d, m, rounds)
            rows.append(
                {
                    "mechanism": mech.name,
                    "n": n,
                    "bits": _bits(mech),
                    "dp": False,
                    "per_parameter_eps": math.inf,
                    "per_update_eps": math.inf,
                    "all_rounds_eps": math.inf,
                    "delta": delta,
                    "note": f"no DP: p_inf = {c['per_parameter']['inf_mass']:.3g} per parameter",
                }
            )
    return rows


def _bits(mech: registry.Mechanism) -> int:
    """Bits of one symbol of ``mech`` in a secure sum at its defaults (integers in
    ``[0, levels]``: a paired mechanism's bit has ``levels = 1``)."""
    assert mech.sum_levels is not None
    return max(1, math.ceil(math.log2(mech.sum_levels(RunConfig(mechanism=mech.name)) + 1)))


def _row(name: str, n: int, bits: int, g: dict[str, Any], note: str) -> dict[str, Any]:
    words = protection(g["all_rounds"]["eps"]) if g["dp"] else ""
    note = "; ".join(x for x in (words and f"run: {words}", note) if x)
    return {
        "mechanism": name,
        "n": n,
        "bits": bits,
        "dp": bool(g["dp"]),
        "per_parameter_eps": g["per_parameter"]["eps"],
        "per_update_eps": g["per_update"]["eps"],
        "all_rounds_eps": g["all_rounds"]["eps"],
        "delta": g["per_parameter"]["delta"],
        "note": note,
    }


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Plain-text table of :func:`server_table` rows."""
    head = ("mechanism", "n", "bits", "dp", "eps/param", "eps/update", "eps/run", "delta", "note")
    lines = [" | ".join(head)]
    for r in rows:
        lines.append(
            " | ".join(
                (
                    str(r["mechanism"]),
                    str(r["n"]),
                    str(r["bits"]),
                    "yes" if r["dp"] else "no",
                    _fmt(r["per_parameter_eps"]),
                    _fmt(r["per_update_eps"]),
                    _fmt(r["all_rounds_eps"]),
                    f"{r['delta']:g}",
                    r["note"],
                )
            )
        )
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.4g}"


if __name__ == "__main__":  # pragma: no cover
    print(format_table(server_table()))

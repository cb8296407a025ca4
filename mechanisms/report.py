"""The run's privacy report: one call, one guarantee per threat model (the server calls it once).

:func:`privacy_report` validates the run's settings, computes the numbers and hands them to the
words: threat model A's compositions through the :class:`~corbin_fl.mechanisms.accounting.
Accountant` (one update, and ``T`` of them), the pair-joint view of B for a pairing mechanism
(:mod:`~corbin_fl.mechanisms.privacy_loss`), the MSE bounds of Theorems 1-3 (accuracy, not
privacy); :mod:`~corbin_fl.mechanisms.threat_models` arranges them per adversary (one function
per privacy family) and, with secure aggregation, :mod:`~corbin_fl.mechanisms.secure_threat_models`
states (B) against the sum the server sees. ``server/records.py`` writes the result to
``summary.json``; the terminal table, ``report.md`` and the figures read it from there.

Against (A), ``k`` released parameters compose exactly: pure ``eps_p``-DP bits as ``k``-fold
randomized response (``L = eps_p (k - 2J)``, ``J ~ Binomial(k, 1/(1+e^eps_p))``), Gaussian ones
as one Gaussian with ``mu sqrt(k)``; one update is ``k = m``, the run ``k = m T`` (``T`` updates
when the unit is the update). Against (B), paired bits have a privacy loss with an atom at
``+infinity`` of mass ``p_inf`` per parameter, hence ``delta >= 1 - (1 - p_inf)^k`` for every
``eps``: no DP (with secure aggregation: see :mod:`corbin_fl.mechanisms.secure_threat_models`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from corbin_fl.mechanisms.accounting import Accountant, PrivacyEvent, canonical_mechanism
from corbin_fl.mechanisms.analytic_gaussian import analytic_gaussian_sigma
from corbin_fl.mechanisms.categories import Privacy, category
from corbin_fl.mechanisms.privacy_loss import (
    MAX_PAIR_D,
    eps_parameter,
    pair_joint_epsilon,
    pair_joint_pld,
)
from corbin_fl.mechanisms.secure_threat_models import secure_threat_models
from corbin_fl.mechanisms.theory import alpha64, ldpq_mse, theorem2_bound, theorem3_mse_bound
from corbin_fl.mechanisms.threat_models import (
    central_threat_models,
    local_threat_models,
    no_dp_threat_models,
)
from corbin_fl.mechanisms.validate import integer, positive, probability, real

if TYPE_CHECKING:
    from corbin_fl.mechanisms.secure_sum import SumView

__all__ = ["REPORT_VERSION", "privacy_report"]

#: Version of the report's layout (one entry per threat model under ``threat_models``). The first
#: layout (a single ``dp`` flag) is no longer read: every committed run was rewritten once.
REPORT_VERSION = 2


def privacy_report(
    mechanism: str,
    eps_p: float | None,
    delta: float,
    m: int,
    rounds: int,
    d: int | None = None,
    gamma: float | None = None,
    n: int | None = None,
    *,
    r: float | None = None,
    delta_p: float | None = None,
    delta_u: float | None = None,
    planned_rounds: int | None = None,
    secure: SumView | None = None,
) -> dict[str, Any]:
    """JSON-ready privacy summary of a run, per threat model (the server calls this once).

    Parameters
    ----------
    mechanism : str
        A registered mechanism (one with a declared privacy category; aliases ``ldp``,
        ``vanilla`` accepted).
    eps_p : float or None
        Per-parameter budget (per-round budget of the whole update when the category's unit is
        ``"update"``); ignored for a mechanism without DP.
    delta : float
        Target ``delta`` of the composed guarantees.
    m : int
        Parameters per update.
    rounds : int
        Number of rounds ``T`` a client may take part in (worst case: all).
    d : int, optional
        Shared bits of a pairing mechanism: enables the pair-joint numbers of (B).
    gamma : float, optional
        The independent share of a mechanism that has one (AugCorBin-FL; with ``gamma = 1`` no
        client is paired; the MSE bound of Theorem 3).
    n, r : int and float, optional
        Clients per round and ``max_j r_j`` (the MSE bounds).
    delta_p, delta_u : float, optional
        The own ``delta`` of a Gaussian mechanism's release, per parameter and per update
        (default ``delta``).
    planned_rounds : int, optional
        Family ``"central"``: the rounds its noise was calibrated for (``num-rounds``; default
        ``rounds``); ``eps_p`` is then the central ``epsilon`` of those rounds.
    secure : SumView, optional
        The run had secure aggregation (:class:`corbin_fl.mechanisms.secure_sum.SumView`: the
        fewest clients in an unmasked sum, ...): (B) is then the guarantee against a server that
        sees only the sum, and the report gets a ``secure_aggregation`` block
        (:func:`corbin_fl.mechanisms.secure_threat_models.secure_threat_models`). None (the
        default): the report of a run without it.

    Returns
    -------
    dict
        Plain JSON types. Keys: ``version`` (:data:`REPORT_VERSION`), ``mechanism``, ``m``,
        ``rounds``, ``eps_p`` (``None`` without DP), ``delta`` (the target of the composed
        guarantees; absent for a mechanism without DP, which has none), ``threat_models``
        (``A``: eavesdropper on one uplink, ``B``: server that sees every bit, ``C``: malicious
        client, ``D``: malicious server; see :mod:`corbin_fl.mechanisms.threat_models` for each
        entry), ``notes`` (how the numbers were obtained, about this mechanism only) and, for
        randomized-response mechanisms with ``n`` and ``r``, ``mse_bounds`` (accuracy, not
        privacy). No figure comes from the paper's eq. (5), which is not a valid bound
        (:func:`corbin_fl.mechanisms.theory.eq5_as_printed`). How the numbers compose: the
        module's docstring.
    """
    mech = canonical_mechanism(mechanism)
    cat = category(mech)
    delta = probability(delta, "delta")
    m = integer(m, "m", 1)
    rounds = integer(rounds, "rounds", 1)
    gamma = None if gamma is None else _share(gamma)
    report: dict[str, Any] = {"version": REPORT_VERSION, "mechanism": mech, "m": m}
    report.update(rounds=rounds, eps_p=None)
    if cat.family == "none":
        report["threat_models"], report["notes"] = no_dp_threat_models(mech, cat)
        if secure is not None:
            secure_threat_models(report, cat, None, None, d, gamma, secure)
        return report
    if cat.family == "central":
        if secure is not None:
            raise ValueError(f"{mech}: the server adds the noise, so it cannot sum masked inputs")
        return _central_report(report, eps_p, delta, rounds, planned_rounds)
    ep = positive(eps_p, "eps_p")
    report["eps_p"] = ep
    report["delta"] = delta
    own = _own_delta(cat, delta, delta_p, delta_u)
    view_a = _uplink_view(mech, cat, ep, own, m, rounds, delta)
    pair, pair_reason = _pair_view(cat, ep, d, m, rounds, delta, secure is not None)
    report["threat_models"], report["notes"] = local_threat_models(
        mech, cat, ep, m, rounds, view_a, pair, pair_reason, gamma
    )
    if n is not None and r is not None and cat.randomized_response:
        report["mse_bounds"] = _mse_bounds(cat, r, ep, n, gamma)
    if secure is not None:
        secure_threat_models(report, cat, ep, view_a, d, gamma, secure)
    return report


def _central_report(
    report: dict[str, Any],
    eps_p: float | None,
    delta: float,
    rounds: int,
    planned_rounds: int | None,
) -> dict[str, Any]:
    """Family ``"central"``: ``eps_p`` is the central ``epsilon`` of the ``planned_rounds`` the
    server's noise was calibrated for (default ``rounds``)."""
    target = positive(eps_p, "eps_p")
    planned = rounds if planned_rounds is None else integer(planned_rounds, "rounds", 1)
    report["delta"] = delta
    report["threat_models"], report["notes"] = central_threat_models(
        report["mechanism"], target, delta, rounds, planned
    )
    return report


def _share(gamma: float) -> float:
    """``gamma`` checked: a real in ``[0, 1]``."""
    value = real(gamma, "gamma", finite=False)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {value!r}")
    return value


def _own_delta(cat: Privacy, delta: float, delta_p: float | None, delta_u: float | None) -> float:
    """A Gaussian release's own ``delta``: ``delta_p`` per parameter, ``delta_u`` per
    update (each checked where it applies), else the report's ``delta``."""
    if cat.family == "gdp" and cat.unit == "parameter" and delta_p is not None:
        return probability(delta_p, "delta_p")
    if cat.family == "gdp" and cat.unit == "update" and delta_u is not None:
        return probability(delta_u, "delta_u")
    return delta


def _uplink_view(
    mech: str, cat: Privacy, ep: float, own_delta: float, m: int, rounds: int, delta: float
) -> dict[str, Any]:
    """Threat model A's blocks: ``per_parameter`` (or the one update's release), ``per_update``
    and ``all_rounds`` (``{"k", "eps", "delta"}``), one update and ``T`` of them composed by the
    :class:`~corbin_fl.mechanisms.accounting.Accountant` at ``delta``.

    ``own_delta`` is a Gaussian release's own ``delta`` (per parameter or per update).
    """
    if cat.family == "pure":
        event = PrivacyEvent(1, "", mech, ep, m)
        return {
            "per_parameter": {"eps": eps_parameter(ep), "delta": 0.0},
            "per_update": _composed(event, 1, m, delta),
            "all_rounds": _composed(event, rounds, m * rounds, delta),
        }
    event = PrivacyEvent(1, "", mech, ep, m, delta=own_delta)
    mu1 = 1.0 / analytic_gaussian_sigma(ep, own_delta, 1.0)
    if cat.unit == "parameter":
        return {
            "per_parameter": {"eps": ep, "delta": own_delta, "mu": mu1},
            "per_update": _composed(event, 1, m, delta),
            "all_rounds": _composed(event, rounds, m * rounds, delta),
        }
    return {  # a Gaussian release of the whole update, once per round
        "per_update": {"k": 1, "eps": ep, "delta": own_delta, "mu": mu1},
        "all_rounds": _composed(event, rounds, rounds, delta),
    }


def _composed(event: PrivacyEvent, count: int, k: int, delta: float) -> dict[str, Any]:
    """``{"k", "eps", "delta"}`` of ``count`` releases like ``event`` (``k`` units in all)."""
    return {"k": k, "eps": Accountant().compose(event, count).get_epsilon(delta), "delta": delta}


def _pair_view(
    cat: Privacy, ep: float, d: int | None, m: int, rounds: int, delta: float, secure: bool
) -> tuple[dict[str, Any] | None, str | None]:
    """The pair-joint view of B for a pairing mechanism (None elsewhere), or why it is not
    computed (secure aggregation: the server sees no pair's two bits; ``d`` missing or beyond
    :data:`~corbin_fl.mechanisms.privacy_loss.MAX_PAIR_D`)."""
    if not cat.paired:
        return None, None
    if secure:
        return None, "secure aggregation: the server sees no pair's two bits"
    if d is None:
        return None, "d not given"
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise TypeError(f"d must be an int, got {type(d).__name__}")
    if not 1 <= int(d) <= MAX_PAIR_D:
        return None, f"d = {int(d)} is outside 1..{MAX_PAIR_D}"
    pld = pair_joint_pld(ep, int(d))
    return {
        "per_parameter": {
            "inf_mass": pld.inf_mass,
            "single_triple_inf_mass": pld.single_inf_mass,
            "max_finite_loss": pld.max_finite_loss,
        },
        "per_update": _pair_block(ep, int(d), m, delta),
        "all_rounds": _pair_block(ep, int(d), m * rounds, delta),
    }, None


def _pair_block(eps_p: float, d: int, k: int, delta: float) -> dict[str, Any]:
    """``k`` paired parameters: ``eps`` at ``delta`` (None when infinite) and the realisable
    lower bound ``1 - (1 - p_inf)^k`` on ``delta``."""
    pld = pair_joint_pld(eps_p, d)
    floor_single = 1.0 - math.exp(k * math.log1p(-pld.single_inf_mass))
    eps = pair_joint_epsilon(eps_p, d, k, delta)
    return {
        "k": k,
        "eps": eps if math.isfinite(eps) else None,
        "eps_is_infinite": not math.isfinite(eps),
        "delta": delta,
        "delta_lower_bound": floor_single,
    }


def _mse_bounds(cat: Privacy, r: float, ep: float, n: int, gamma: float | None) -> dict[str, float]:
    """The MSE bounds of LDPQ (``ldpq``, [17, Lemma 3]: n independent releases, LDP-FL's),
    CorBin-FL's Theorem 2 (``corbin_theorem2``) and, with an independent share, its Theorem 3
    (``corbin_theorem3``: a gamma-share quantizes independently, AugCorBin-FL's), ``d ->
    infinity``: accuracy, not privacy. Runs written before these names hold ``ldpfl`` and
    ``augcorbin_theorem3`` for the first and the last (nothing reads them)."""
    bounds = {
        "ldpq": float(ldpq_mse(r, ep, n)),
        "corbin_theorem2": float(theorem2_bound(r, ep, n)),
        "alpha": float(alpha64(ep)),
    }
    if cat.independent_share and gamma is not None:
        bounds["corbin_theorem3"] = float(theorem3_mse_bound(r, ep, n, gamma))
    return bounds

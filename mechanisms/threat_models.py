"""The words of a run's privacy report: one guarantee per adversary, one function per family.

:func:`corbin_fl.mechanisms.report.privacy_report` computes the numbers (threat model A's from
:class:`~corbin_fl.mechanisms.accounting.Accountant`, the pair-joint view of B from
:mod:`~corbin_fl.mechanisms.privacy_loss`) and hands them here; this module arranges them per
threat model (keys and names: :data:`~corbin_fl.mechanisms.accounting.THREAT_MODELS`) and says
in plain language what holds against each adversary:

- :func:`no_dp_threat_models`: a mechanism without any noise (family ``"none"``);
- :func:`central_threat_models`: DP-FedAvg's Gaussian sum query (family ``"central"``): the
  server adds the noise;
- :func:`local_threat_models`: noise drawn on the client (families ``"pure"`` and
  ``"gdp"``), with or without pairing: (A) one uplink, (B) the server that sees every bit,
  (C) a malicious client (post-processing of B's view, plus its partner's ``z`` when paired;
  nothing from the paper's eq. (5), which is not a valid bound:
  :func:`corbin_fl.mechanisms.theory.eq5_as_printed`), (D) a malicious server, which can learn
  every pair's ``z`` (SECURITY.md, threat model 4) and keeps only the per-parameter (per-update)
  guarantee of the mechanisms whose noise is drawn on the client.

Every entry has ``name``, ``dp`` (whether the report gives a differential-privacy guarantee
against that adversary), ``headline`` (at most 46 characters, for tables) and ``guarantee`` (one
plain-language paragraph); entries with ``dp`` true add the numbers (``per_parameter``,
``per_update``, ``all_rounds``: blocks ``{"k", "eps", "delta"}`` as in threat model A); entries
without DP carry no ``delta`` anywhere (the paired mechanisms' ``pair_joint`` block holds only
the lower bounds on ``delta`` that show why). A headline whose composed ``eps`` exceeds
:data:`~corbin_fl.mechanisms.protection.MEANINGFUL_EPS` says
:data:`~corbin_fl.mechanisms.protection.NO_PROTECTION`. The sentence helpers here are shared with
:mod:`corbin_fl.mechanisms.secure_threat_models` (a run with secure aggregation). No mechanism is
named: what applies follows its privacy category
(:class:`~corbin_fl.mechanisms.categories.Privacy`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from corbin_fl.mechanisms.accounting import THREAT_MODELS
from corbin_fl.mechanisms.analytic_gaussian import central_epsilon, central_noise_multiplier
from corbin_fl.mechanisms.categories import Privacy
from corbin_fl.mechanisms.protection import NO_PROTECTION, per_parameter_text, protection

Entries = dict[str, dict[str, Any]]
"""One entry per threat model, by key (:data:`~corbin_fl.mechanisms.accounting.THREAT_MODELS`)."""


def empty_entries() -> Entries:
    """``{key: {"name": ..., "dp": False}}`` for every threat model, in the order of the keys."""
    return {key: {"name": name, "dp": False} for key, name in THREAT_MODELS.items()}


# ============================================================================ words and numbers


def g4(x: Any) -> str:
    """Four significant digits (the precision every view prints)."""
    return f"{float(x):.4g}"


def bound_sentence(cat: Privacy) -> str:
    """``" <cat.bound_note>"``: why the report prints nothing from a published bound of the
    mechanism that is not valid (AugCorBin-FL's eq. (5), ``theory.eq5_as_printed``), or ""."""
    return f" {cat.bound_note}" if cat.bound_note else ""


def run_headline(eps: float, delta: float, tail: str) -> str:
    """``"(eps, delta) <tail>"``, or :data:`NO_PROTECTION` with the ``eps`` when it bounds
    nothing (``eps > MEANINGFUL_EPS``, :mod:`corbin_fl.mechanisms.protection`)."""
    if protection(eps):
        return f"{NO_PROTECTION}: run eps {g4(eps)}"
    return f"({g4(eps)}, {delta:g}) {tail}"


def per_parameter_sentence(eps: float, delta: float, eps_p: float | None) -> str:
    """``"per parameter (0.99997, 1e-05)-DP, no better than eps_p = 1"`` (5 digits)."""
    text = per_parameter_text(eps, eps_p)
    number, _, rest = text.partition(" (")
    return f"per parameter ({number}, {delta:g})-DP" + (f", {rest[:-1]}" if rest else "")


def protection_sentence(run_eps: float, rounds: int) -> str:
    """The plain words when the run's ``eps`` bounds nothing, else ``""``."""
    if not protection(run_eps):
        return ""
    return (
        f" Over all {rounds} rounds eps = {g4(run_eps)} is formally DP and practically none "
        f"({NO_PROTECTION}: above eps = 10 a test may tell two inputs apart every time at a "
        "false-positive rate of 1 in e^10 = 22,026; mechanisms/protection.py)."
    )


def copy_blocks(view: Mapping[str, Any] | None, *parts: str) -> dict[str, Any]:
    """Copies of the numeric blocks ``parts`` of ``view`` that exist (``None`` ones left out)."""
    out: dict[str, Any] = {}
    for part in parts:
        block = view.get(part) if isinstance(view, Mapping) else None
        if isinstance(block, Mapping):
            out[part] = dict(block)
    return out


def composed_sentence(view: Mapping[str, Any], m: int, rounds: int) -> str:
    """``"one update of m = ...: (eps, delta)-DP; over T rounds: (eps, delta)-DP"``."""
    parts = []
    upd = view.get("per_update")
    if isinstance(upd, Mapping) and int(upd.get("k", 0)) == m:
        parts.append(
            f"one update of m = {m:,} parameters is ({g4(upd['eps'])}, {upd['delta']:g})-DP"
        )
    run = view.get("all_rounds")
    if isinstance(run, Mapping):
        parts.append(f"all {rounds} rounds are ({g4(run['eps'])}, {run['delta']:g})-DP")
    return "; ".join(parts)


def pair_joint_numbers(pair: Mapping[str, Any]) -> dict[str, Any]:
    """Supporting numbers of the pair-joint view, with ``eps``/``delta`` only where an ``eps``
    exists (``delta_lower_bound`` is the lower bound ``1 - (1 - p_inf)^k`` on ``delta``)."""
    out: dict[str, Any] = {}
    pp = pair.get("per_parameter")
    if isinstance(pp, Mapping):
        out["per_parameter"] = {
            key: pp[key]
            for key in ("inf_mass", "single_triple_inf_mass", "max_finite_loss")
            if key in pp
        }
    for part in ("per_update", "all_rounds"):
        block = pair.get(part)
        if not isinstance(block, Mapping):
            continue
        entry: dict[str, Any] = {"k": block.get("k")}
        entry["delta_lower_bound"] = block.get("delta_lower_bound")
        if block.get("eps") is not None and not block.get("eps_is_infinite"):
            entry["eps"] = block["eps"]
            entry["delta"] = block.get("delta")
        out[part] = entry
    return out


# ============================================================================ one per family


def no_dp_threat_models(mech: str, cat: Privacy) -> tuple[Entries, list[str]]:
    """The threat models of a mechanism without noise (family ``"none"``): no DP against anyone.

    The sentences are the category's own (:class:`~corbin_fl.mechanisms.categories.NoDPText`).
    """
    if cat.no_dp is None:
        raise ValueError(f"{mech}: a mechanism without DP needs its no_dp sentences")
    text = cat.no_dp
    tm = empty_entries()
    tm["A"]["headline"], tm["A"]["guarantee"] = text.a_headline, text.a_guarantee
    tm["B"]["headline"], tm["B"]["guarantee"] = text.b_headline, text.b_guarantee
    tm["C"]["headline"], tm["C"]["guarantee"] = "no DP", text.c_guarantee
    tm["D"]["headline"] = "no DP"
    tm["D"]["guarantee"] = text.b_guarantee
    return tm, [f"{mech} has no privacy mechanism: no (eps, delta) exists for any adversary"]


def central_threat_models(
    mech: str, epsilon: float, delta: float, rounds: int, planned: int
) -> tuple[Entries, list[str]]:
    """The threat models of family ``"central"`` (DP-FedAvg's Gaussian sum query) of the
    mechanism ``mech``.

    The noise multiplier ``z`` is calibrated for ``planned`` rounds at (epsilon, delta); the run's
    ``rounds`` (at most ``planned``) compose exactly to one Gaussian with ``mu = sqrt(T) / z``
    (``mechanisms/baselines/central_gaussian.py``).
    """
    z = central_noise_multiplier(epsilon, delta, planned)
    tm = empty_entries()
    tm["A"]["headline"] = "no DP (the clipped update in the clear)"
    tm["A"]["guarantee"] = (
        f"No DP: {mech} uploads the client's clipped update as it is (the server adds "
        "the noise); only TLS hides it on the link."
    )
    tm["B"]["headline"] = "no DP (it sees every clipped update)"
    tm["B"]["guarantee"] = (
        "No DP: the server receives every clipped update as it is; the noise is its own to add."
    )
    eps_run = central_epsilon(z, delta, rounds)
    tm["C"].update(
        {
            "dp": True,
            "headline": (
                f"{NO_PROTECTION}: central eps {eps_run:.3g}"
                if protection(eps_run)
                else f"({eps_run:.3g}, {delta:.3g}) central, {rounds} rounds"
            ),
            "guarantee": (
                f"The {rounds} global models every client receives are ({eps_run:g}, {delta:g})-DP "
                "with respect to any one client's data (add or remove one client; worst case: it "
                f"takes part in every round): each round adds N(0, (z C)^2) with z = {z:.4g} to "
                "the sum of updates clipped to L2 norm C, and the rounds compose exactly to one "
                f"Gaussian with mu = sqrt({rounds})/z. This trusts the server to add the noise."
                + protection_sentence(eps_run, rounds)
            ),
            "per_update": {
                "k": 1,
                "eps": central_epsilon(z, delta, 1),
                "delta": delta,
                "mu": 1 / z,
            },
            "all_rounds": {
                "k": rounds,
                "eps": eps_run,
                "delta": delta,
                "mu": math.sqrt(rounds) / z,
            },
        }
    )
    tm["D"]["headline"] = "no DP (it need not add the noise)"
    tm["D"]["guarantee"] = (
        "No DP: a malicious server sees every clipped update and need not add any noise."
    )
    notes = [
        "central DP (DP-FedAvg's Gaussian sum query): clients send their clipped updates in the "
        f"clear and the server adds the noise; z = {z:.6g} makes {planned} rounds "
        f"({epsilon:g}, {delta:g})-DP (analytic Gaussian calibration, exact GDP composition)",
        "worst case: a client is assumed to take part in every round; no amplification by "
        "sampling is claimed",
    ]
    return tm, notes


def local_threat_models(
    mech: str,
    cat: Privacy,
    eps_p: float,
    m: int,
    rounds: int,
    view_a: Mapping[str, Any],
    pair: Mapping[str, Any] | None,
    pair_reason: str | None,
    gamma: float | None,
) -> tuple[Entries, list[str]]:
    """The threat models of a mechanism whose noise is drawn on the client (``"pure"``,
    ``"gdp"``) and the notes on how the numbers were obtained.

    ``view_a`` holds threat model A's computed blocks (``per_parameter``, ``per_update``,
    ``all_rounds``), ``pair`` the pair-joint view of B for a pairing mechanism (None, with
    ``pair_reason``, where it was not computed), ``gamma`` AugCorBin-FL's independent share (with
    ``gamma = 1`` no client is paired).
    """
    tm = empty_entries()
    paired = cat.paired and not (cat.independent_share and gamma is not None and gamma >= 1.0)
    tm["A"].update(_uplink(mech, cat, float(eps_p), m, rounds, view_a))
    tm["B"].update(
        _every_bit(cat, rounds, view_a, pair, pair_reason) if paired else _same_as_a(cat, view_a)
    )
    tm["C"].update(_malicious_client(cat, paired, tm["B"]))
    tm["D"].update(_malicious_server(cat, float(eps_p), view_a))
    return tm, _notes(mech, cat, rounds, pair, pair_reason)


def _uplink(
    mech: str, cat: Privacy, ep: float, m: int, rounds: int, view_a: Mapping[str, Any]
) -> dict[str, Any]:
    """(A) an eavesdropper on one uplink: the exact composition of the client's releases."""
    a: dict[str, Any] = {
        "dp": True,
        **copy_blocks(view_a, "per_parameter", "per_update", "all_rounds"),
    }
    composed = composed_sentence(view_a, m, rounds)
    if cat.family == "gdp" and cat.unit == "parameter":
        pp = view_a["per_parameter"]
        a["headline"] = f"({ep:g}, {pp['delta']:.3g}) per parameter"
        a["guarantee"] = (
            f"Each released parameter is ({ep:g}, {pp['delta']:g})-DP {cat.release}; "
            f"composed exactly, {composed}.{cat.caveat_a}"
        )
    elif cat.family == "gdp":
        pu = view_a["per_update"]
        a["headline"] = f"({ep:g}, {pu['delta']:.3g}) per update"
        a["guarantee"] = (
            f"Each round's release is ({ep:g}, {pu['delta']:g})-DP for the whole update "
            f"{cat.release}; {composed}.{cat.caveat_a}"
        )
    else:
        what = (
            "uploaded bit is randomized response"
            if cat.randomized_response
            else cat.release or f"released parameter is one symbol of {mech} (exact pure eps_p)"
        )
        a["headline"] = f"eps_p = {ep:g} per parameter"
        a["guarantee"] = (
            f"Each {what} with eps_p = {ep:g} (pure eps_p-DP per parameter"
            + (
                "; a bit's law is the same whether or not its client is paired"
                if cat.paired
                else ""
            )
            + f"); composed exactly, {composed}.{cat.caveat_a}"
        )
    return a


def _every_bit(
    cat: Privacy,
    rounds: int,
    view_a: Mapping[str, Any],
    pair: Mapping[str, Any] | None,
    pair_reason: str | None,
) -> dict[str, Any]:
    """(B) the server that sees every bit, for paired releases: no DP, save at tiny sizes."""
    b: dict[str, Any] = {"headline": "no DP (paired bits are not private against it)"}
    joint = pair_joint_numbers(pair) if isinstance(pair, Mapping) else None
    run_eps = (joint or {}).get("all_rounds", {}).get("eps")
    if joint is not None and run_eps is not None:
        # Only for tiny models and budgets; reported as what it is.
        b["dp"] = True
        run = joint["all_rounds"]
        b["headline"] = run_headline(run_eps, run["delta"], "over the run (pair-joint)")
        b["guarantee"] = (
            "The server receives both bits of every pair; their joint law still gives "
            f"({g4(run_eps)}, {run['delta']:g})-DP over all {rounds} rounds at this tiny "
            "model size (exact pair-joint composition)."
        )
    else:
        who = (
            "Each round a random fraction 1 - gamma of the clients is paired, and the "
            "server receives both bits of every pair"
            if cat.independent_share
            else "The server receives both bits of every pair"
        )
        if joint is not None:
            lb_u = joint.get("per_update", {}).get("delta_lower_bound")
            why = f": for one update delta >= {g4(lb_u)} whatever eps" if lb_u is not None else ""
        else:
            why = f" (pair-joint numbers not computed: {pair_reason or 'not in this report'})"
        b["guarantee"] = (
            f"No DP. {who}; their joint law gives zero probability to outcomes that a "
            f"neighbouring input makes possible, so no eps holds at any useful delta{why}. "
            "The per-parameter eps_p holds only against an eavesdropper on one uplink (A)."
            + (
                " A client that quantizes independently in a round gets A's eps_p for that "
                "round, but it cannot know beforehand that it will."
                if cat.independent_share
                else ""
            )
        )
    if joint is not None:
        b["pair_joint"] = joint
    return b


def _same_as_a(cat: Privacy, view_a: Mapping[str, Any]) -> dict[str, Any]:
    """(B) the server that sees every upload, for independent local noise: A's guarantee."""
    b: dict[str, Any] = {
        "dp": True,
        **copy_blocks(view_a, "per_parameter", "per_update", "all_rounds"),
    }
    b["headline"] = "same as A (independent local noise)"
    alone = "With gamma = 1 no client is paired: each" if cat.independent_share else "Each"
    b["guarantee"] = (
        f"Same as A. {alone} client randomizes its own upload independently of the others, "
        "so seeing every client's upload tells the server about one client only what that "
        "client's upload tells (the other uploads do not depend on its data)." + cat.caveat_b
    )
    return b


def _malicious_client(cat: Privacy, paired: bool, b: Mapping[str, Any]) -> dict[str, Any]:
    """(C) a malicious client, which receives the global model (and its partner's ``z``)."""
    if not paired:
        c: dict[str, Any] = {
            "dp": True,
            **copy_blocks(b, "per_parameter", "per_update", "all_rounds"),
        }
        c["headline"] = "same as B (it sees only the global model)"
        c["guarantee"] = (
            "At least B's guarantee: a client receives only the global model, which the server "
            "computes from the uploads it sees (post-processing of B's view)."
        )
        return c
    if cat.independent_share:
        guarantee = (
            "No DP. A client receives the global model, computed from every bit the server "
            "sees (no DP there), and a paired client also knows its partner's common "
            "randomness z." + bound_sentence(cat)
        )
    else:
        guarantee = (
            "No DP. A client receives the global model, computed from every paired bit, "
            "and a paired client also knows its partner's common randomness z, which the "
            "pair-joint view of B assumes secret; no accounting bounds what the global "
            "model reveals."
        )
    return {"headline": "no DP (nothing bounds the global model)", "guarantee": guarantee}


def _malicious_server(cat: Privacy, ep: float, view_a: Mapping[str, Any]) -> dict[str, Any]:
    """(D) a malicious server: the per-parameter (per-update) eps_p of client-side noise only."""
    if cat.paired:
        return {
            "headline": "no DP (it can learn each pair's z)",
            "guarantee": (
                "No DP (SECURITY.md, threat model 4). The X25519 public keys it relays are not "
                "authenticated end to end, so it can substitute its own, open each pair's sealed "
                "seed and learn the common randomness z; it also chooses the pairing, so it can "
                "pair a client with one it controls. Given z, a paired bit is a threshold "
                "comparison."
                + (
                    " It also chooses which clients quantize independently."
                    if cat.independent_share
                    else ""
                )
            ),
        }
    unit = cat.unit
    d: dict[str, Any] = {
        "dp": True,
        **copy_blocks(view_a, "per_update" if unit == "update" else "per_parameter"),
    }
    d["headline"] = f"per-{unit} eps_p only, at the eps it sets"
    d["guarantee"] = (
        f"Per {unit} only: the noise is drawn on the client, so each release stays "
        f"eps_p-DP per {unit} (here eps_p = {ep:g}) for any "
        + ("model" if unit == "update" else "model, center and radius")
        + " the server sends, at an epsilon no larger than the client's own policy allows "
        "(corbin-max-epsilon, checked on every instruction); but the server sets the number "
        "of rounds, so A's composed numbers do not bind it."
    )
    return d


def _notes(
    mech: str, cat: Privacy, rounds: int, pair: Mapping[str, Any] | None, pair_reason: str | None
) -> list[str]:
    """How the numbers were obtained, about this mechanism only."""
    notes = [
        "worst case: a client is assumed to take part in every one of the "
        f"{rounds} rounds; the numbers count parameters (or updates), not users"
    ]
    if cat.method_note:
        notes.append(cat.method_note)
    elif cat.randomized_response:
        notes.append(
            "(A) each bit is binary randomized response with P(+) in [1/(1+e^eps_p), "
            "e^eps_p/(1+e^eps_p)]; k composed bits have an exact binomial privacy-loss "
            "distribution, which gives (eps, delta)"
            + ("; CorBinQ's marginal equals LDPQ's (Theorem 1)" if cat.paired else "")
        )
    elif cat.family == "pure":
        notes.append(
            f"(A) {mech} is pure eps_p-DP per parameter; k parameters are dominated by k-fold "
            "randomized response (optimal composition, Kairouz et al. 2015)"
        )
    elif cat.unit == "parameter":
        notes.append(
            "(A) analytic Gaussian noise per parameter (mu = 2r/sigma); k Gaussian releases "
            "compose exactly to one with mu*sqrt(k)"
        )
    else:
        notes.append(
            f"(A) {mech}: update-level (eps_p, delta) per round; rounds compose as Gaussian "
            "releases"
        )
    if isinstance(pair, Mapping) and cat.paired:
        p_inf = (pair.get("per_parameter") or {}).get("single_triple_inf_mass")
        if p_inf is not None:
            notes.append(
                "(B) the pair-joint privacy loss has an atom at +infinity of mass "
                f"p_inf = {g4(p_inf)} per parameter, so k parameters have "
                "delta >= 1-(1-p_inf)^k for every eps"
            )
    elif cat.paired:
        notes.append(f"(B) pair-joint view not computed: {pair_reason or 'not in this report'}")
    return notes

"""Threat models B, C and D of a run with secure aggregation: the server sees only sums.

:func:`corbin_fl.mechanisms.report.privacy_report` builds a run's report without it
(:mod:`corbin_fl.mechanisms.threat_models`); with ``secure=`` a
:class:`~corbin_fl.mechanisms.secure_sum.SumView` of the run it hands the report to
:func:`secure_threat_models`, which replaces (B) by the guarantee against that sum, computed by
:mod:`corbin_fl.mechanisms.secure_sum` from what the run did (the fewest clients in an unmasked
sum, the parameters, the rounds), one function per privacy family. (A) does not change; (C) and
(D) say what the sum does not give them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corbin_fl.mechanisms.categories import Privacy
from corbin_fl.mechanisms.threat_models import (
    bound_sentence,
    copy_blocks,
    g4,
    per_parameter_sentence,
    protection_sentence,
    run_headline,
)

if TYPE_CHECKING:
    from types import ModuleType

    from corbin_fl.mechanisms.secure_sum import SumView

__all__ = ["secure_threat_models"]

_SUM_NAME = "server, sees only the sum"
"""Threat model B's name in a report with secure aggregation (the server sees only sums)."""


def _sum_who(s: SumView) -> str:
    """Who is in the sum the server sees, in the words every (B) sentence starts with."""
    if s.source == "rounds":
        where = (
            f"at least n = {s.n} clients in each of the {s.rounds} round(s) whose sum it unmasked "
            "(the fewest survivors of any round"
            + (f"; {s.abandoned} round(s) abandoned, nothing unmasked" if s.abandoned else "")
            + ")"
        )
    else:
        where = f"the configured n = {s.n} clients (no round of this run unmasked a sum)"
    return (
        "With secure aggregation (SecAgg+) the server learns, per parameter and round, only the "
        f"sum of the symbols of {where}"
    )


_SUM_ASSUMES = (
    " This holds against a server that follows the protocol (honest-but-curious; D says what "
    "a deviating one can do) and colludes with no client: a client knows its own symbols, so "
    "against the server and c colluding clients these figures hold at n - c."
)


def _secagg_deviation(s: SumView) -> str:
    """What secure aggregation leaves against a malicious server (the code's checks, exactly)."""
    params = (
        f" This run: Shamir threshold t >= {s.threshold} of k >= {s.neighbours} neighbours."
        if s.threshold is not None and s.neighbours is not None
        else ""
    )
    return (
        " Secure aggregation does not bind a deviating server. It relays the SecAgg+ public keys, "
        "which are not authenticated end to end either, so it can substitute its own, open every "
        "share ciphertext and unmask any client's input. Relaying them honestly, it can still lie "
        "about dropouts: an honest client refuses an unmask request that names one client both "
        "survivor and dropped, answers one unmask request per round, and refuses a threshold "
        "t <= k/2 of its k neighbours, but no round checks that every client got the same "
        "survivor list, so a server that names a victim a survivor to the victim's neighbours "
        "and each of those neighbours dropped to t of theirs recovers the victim's self mask and "
        "every mask key of its pairwise masks, hence its symbols (tested: 10 clients, t = 5, no "
        f"colluding client).{params}"
    )


def _secure_blocks(
    sum_view: Mapping[str, Any], view_a: Mapping[str, Any] | None, m: int, rounds: int
) -> tuple[dict[str, Any], bool]:
    """``per_parameter`` / ``per_update`` / ``all_rounds`` blocks of one ``secure_sum`` result.

    A composed ``eps`` above threat model A's at the same ``delta`` (both hold; only at a tiny
    ``n``, where the PLD grid costs more than the sum gains) is replaced by A's. Returns the
    blocks and whether one was.
    """
    pp = sum_view["per_parameter"]
    out: dict[str, Any] = {"per_parameter": {"eps": pp["eps"], "delta": pp["delta"]}}
    took_a = False
    for part, k in (("per_update", m), ("all_rounds", m * rounds)):
        eps = float(sum_view[part]["eps"])
        a_block = view_a.get(part) if isinstance(view_a, Mapping) else None
        same_delta = isinstance(a_block, Mapping) and a_block["delta"] == sum_view[part]["delta"]
        if same_delta and not eps <= float(a_block["eps"]):  # type: ignore[index]
            eps, took_a = float(a_block["eps"]), True  # type: ignore[index]
        out[part] = {"k": k, "eps": eps, "delta": sum_view[part]["delta"]}
    return out, took_a


@dataclass(frozen=True)
class _Sum:
    """What every (B) entry against the sum is computed from."""

    ss: ModuleType
    s: SumView
    cat: Privacy
    eps_p: float | None
    view_a: Mapping[str, Any] | None
    m: int
    rounds: int
    delta: float
    n_eff: int
    capped: str
    who: str


def secure_threat_models(
    report: dict[str, Any],
    cat: Privacy,
    eps_p: float | None,
    view_a: Mapping[str, Any] | None,
    d: int | None,
    gamma: float | None,
    s: SumView,
) -> None:
    """Threat models B, C and D of a run with secure aggregation (``report`` is changed in place).

    (B) is computed by :mod:`corbin_fl.mechanisms.secure_sum` from ``s`` (the fewest clients in
    an unmasked sum), the report's ``m`` and rounds, at the report's ``delta``:

    - independent mechanisms whose symbols are binomial (``s.trials``: one bit, or PBM's
      trials): the exact worst case over all inputs, composed (``dp`` true);
    - paired with an independent share (AugCorBin-FL): its category's exact guarantee against
      the sum (:meth:`~corbin_fl.mechanisms.categories.Privacy.exact_sum`) at the independent
      clients of the worst round (the entry's ``independent`` block says how many, of how many,
      and from where); ``dp`` where it is finite; nothing from a published bound that is not
      valid (the category's ``bound_note`` says why: the paper's eq. (5));
    - CorBin-FL: no DP (a pair's sum is nearly deterministic), with the lower bound on ``delta``;
    - a mechanism without DP: no DP (the sum carries no noise);
    - any other local-DP mechanism: A's guarantee, which the sum can only improve (not computed).

    (A) does not change. (C): a client knows its own symbols, so B's sum figures do not carry
    over to it as they are; its entry says so where it quoted B. (D) keeps its guarantee and
    says what secure aggregation leaves against a deviating server (:func:`_secagg_deviation`).
    The exact profile is computed at ``min(n, secure_sum.REPORT_MAX_N)``, which bounds any larger
    ``n``.
    """
    # secure_sum imports scipy.stats and dp_accounting: 0.8-0.9 CPU-s on top of this module
    # (time.process_time around the import, 2026-11-29), paid only with secure aggregation
    from corbin_fl.mechanisms import secure_sum as ss

    tm: dict[str, dict[str, Any]] = report["threat_models"]
    n_eff = min(s.n, ss.REPORT_MAX_N)
    ctx = _Sum(
        ss=ss,
        s=s,
        cat=cat,
        eps_p=eps_p,
        view_a=view_a,
        m=int(report["m"]),
        rounds=int(report["rounds"]),
        delta=float(report["delta"]) if "delta" in report else 0.0,  # none without DP
        n_eff=n_eff,
        capped=(
            f" (computed at n = {n_eff}, which bounds every larger n: the guarantee never gets "
            "worse as n grows)"
            if n_eff < s.n
            else ""
        ),
        who=_sum_who(s),
    )
    notes = [n for n in report["notes"] if not n.startswith("(B)")]
    block = {**s.as_dict(), "computed_at_n": n_eff}
    b: dict[str, Any] = {"name": _SUM_NAME, "dp": False}
    if cat.no_dp is not None:
        b_note = _sum_without_noise(b, ctx)
    elif cat.paired and not cat.independent_share:
        b_note = _sum_of_pairs(b, ctx, d)
    elif cat.paired:
        b_note = _sum_with_independent_share(b, ctx, gamma)
    elif s.trials is not None:
        b_note = _sum_of_binomials(b, ctx, s.trials)
    else:
        b_note = _sum_not_analysed(b, ctx)
    tm["B"] = b
    if b_note:
        notes.append(b_note)
    _client_knows_its_symbols(tm["C"], cat)
    _deviating_server(tm["D"], cat, s)
    notes.append(
        "(D) secure aggregation protects against an honest-but-curious server only: the "
        "SecAgg+ keys it relays are not authenticated, and no round checks that all clients got "
        "the same survivor list (SECURITY.md, Secure aggregation)"
    )
    report["notes"] = notes
    report["secure_aggregation"] = block


def _sum_without_noise(b: dict[str, Any], ctx: _Sum) -> str:
    """(B) family ``"none"``: the sum is a deterministic function of the updates."""
    b["headline"] = "no DP (the sum carries no noise)"
    b["guarantee"] = (
        f"No DP. {ctx.who}; the symbols carry no noise, so their sum is a deterministic function "
        "of the clients' updates and no eps holds."
    )
    return ""


def _sum_of_pairs(b: dict[str, Any], ctx: _Sum, d: int | None) -> str:
    """(B) paired releases, none independent (CorBin-FL): a pair's sum is nearly deterministic."""
    if d is None:
        b["headline"] = "no DP (a pair's sum is nearly deterministic)"
        b["guarantee"] = (
            f"No DP, even with secure aggregation. {ctx.who}; a pair's bits sum to the randomized "
            "rounding of q1 + q2 (nearly deterministic), so a neighbouring input makes an "
            "impossible sum possible (d not given: no numbers)."
        )
        return ""
    m, rounds = ctx.m, ctx.rounds
    c = ctx.ss.corbin_against_sum(float(ctx.eps_p or 0.0), int(d), m, rounds)
    b["headline"] = "no DP (a pair's sum is nearly deterministic)"
    b["guarantee"] = f"{c['guarantee']} {ctx.who}: that does not help."
    b["sum"] = {
        "per_parameter": {"inf_mass": c["per_parameter"]["inf_mass"]},
        "per_update": {"k": m, "delta_lower_bound": c["per_update"]["delta_lower_bound"]},
        "all_rounds": {
            "k": m * rounds,
            "delta_lower_bound": c["all_rounds"]["delta_lower_bound"],
        },
    }
    return (
        "(B) secure aggregation: CorBin-FL's pair sum is the randomized rounding of "
        f"q1 + q2; an outcome impossible under a neighbouring input has mass p_inf = "
        f"{g4(c['per_parameter']['inf_mass'])} per parameter (mechanisms/secure_sum.py, "
        "corbin_against_sum)"
    )


def _sum_with_independent_share(b: dict[str, Any], ctx: _Sum, gamma: float | None) -> str:
    """(B) paired releases with an independent share (AugCorBin-FL): the exact worst case at the
    independent clients of the worst round; nothing from the paper's eq. (5)."""
    s, m, rounds, delta = ctx.s, ctx.m, ctx.rounds, ctx.delta
    ep = float(ctx.eps_p or 0.0)
    g_eff = gamma if gamma is not None else (s.independent or 0) / s.n
    exact_sum = ctx.cat.exact_sum()
    assert exact_sum is not None  # an independent share declares it (categories.Privacy)
    ac = exact_sum(
        ep,
        s.n,
        g_eff,
        m,
        rounds,
        delta,
        independent=s.independent,
        paired=s.paired,
        max_exact_n=ctx.ss.REPORT_MAX_N,
    )
    n_ind = int(ac["independent"])
    exact = ac.get("exact")
    b["dp"] = bool(ac["dp"])
    if s.independent is not None:
        drawn = "the fewest in any unmasked sum"
    else:
        drawn = "floor(gamma n + 1/2) as the pairing draws it"
    configured = (
        f"; gamma = {gamma:g} configured, so {n_ind} of {s.n} is the share used"
        if gamma is not None
        else ""
    )
    who_ind = f"{ctx.who}, of which {n_ind} quantized independently ({drawn}{configured})"
    b["independent"] = {"count": n_ind, "of": s.n, "from": ac["independent_from"]}
    if b["dp"] and isinstance(exact, Mapping):
        blocks, _ = _secure_blocks(exact, ctx.view_a, m, rounds)
        b.update(blocks)
        run = blocks["all_rounds"]
        pp = blocks["per_parameter"]
        b["headline"] = run_headline(run["eps"], delta, f"over the run, n >= {s.n}")
        b["guarantee"] = (
            f"{who_ind}. The exact worst case (an independent client's bit among the other "
            "independent ones, or a paired client's bit, which given its partner's can be "
            "a point mass, over the independent clients' bits) gives "
            f"{per_parameter_sentence(pp['eps'], delta, ep)}; composed, one update "
            f"of m = {m:,} parameters is ({g4(blocks['per_update']['eps'])}, "
            f"{delta:g})-DP and all {rounds} rounds are ({g4(run['eps'])}, "
            f"{delta:g})-DP{ctx.capped}.{protection_sentence(run['eps'], rounds)}"
            f"{bound_sentence(ctx.cat)}{_SUM_ASSUMES}"
        )
    else:
        b["headline"] = "no DP (too few independent clients)"
        b["guarantee"] = (
            f"No DP. {who_ind}. A paired client's bit, given its partner's, can be a point "
            "mass, so only the independent clients' bits hide it, and with so few of them "
            "a sum impossible under a neighbouring input keeps a mass that, composed over "
            f"the run, exceeds delta = {delta:g}.{bound_sentence(ctx.cat)}"
        )
    return f"(B) secure aggregation: {ac['note']}"


def _sum_of_binomials(b: dict[str, Any], ctx: _Sum, trials: int) -> str:
    """(B) independent releases whose symbols are binomial (one bit, or PBM's trials): the exact
    worst case over every input, composed."""
    m, rounds, delta, s = ctx.m, ctx.rounds, ctx.delta, ctx.s
    ep = float(ctx.eps_p or 0.0)
    if trials == 1:
        g = ctx.ss.one_bit_guarantee(ep, ctx.n_eff, m, rounds, delta)
        what = "each symbol is one bit with P(1) in [1/(1+e^eps_p), e^eps_p/(1+e^eps_p)]"
    else:
        g = ctx.ss.binomial_guarantee(ep, trials, ctx.n_eff, m, rounds, delta)
        what = (
            f"each symbol counts the successes of {trials} trials with P in the range of "
            "(eps_p/M)-randomized response (the Poisson binomial mechanism's native setting, "
            "arXiv 2108.09449)"
        )
    blocks, took_a = _secure_blocks(g, ctx.view_a, m, rounds)
    b.update(blocks)
    b["dp"] = True
    run = blocks["all_rounds"]
    b["headline"] = run_headline(run["eps"], delta, f"over the run, n >= {s.n}")
    a_run = (ctx.view_a or {}).get("all_rounds", {}).get("eps")
    pp_eps = blocks["per_parameter"]["eps"]
    b["guarantee"] = (
        f"{ctx.who}; {what}. The exact worst case over every input of this client and of the "
        f"other n - 1 gives {per_parameter_sentence(pp_eps, delta, ep)}; composed with a "
        "dominating privacy-loss distribution, one update of "
        f"m = {m:,} parameters is ({g4(blocks['per_update']['eps'])}, {delta:g})-DP and all "
        f"{rounds} rounds are ({g4(run['eps'])}, {delta:g})-DP{ctx.capped}"
        + (f" (A's, the uploads one by one: {g4(a_run)})" if a_run is not None else "")
        + "."
        + protection_sentence(run["eps"], rounds)
        + _SUM_ASSUMES
    )
    return (
        "(B) secure aggregation: exact worst case of one client's symbols in the sum over "
        "every input of it and of the others (vertices of the probability box, both "
        "directions; mechanisms/secure_sum.py), composed over m parameters and T rounds "
        "with a dominating connect-the-dots PLD (dp_accounting), one chain of FFT "
        "compositions for the update and the run"
        + ("; a composed eps above A's is replaced by A's (both hold)" if took_a else "")
    )


def _sum_not_analysed(b: dict[str, Any], ctx: _Sum) -> str:
    """(B) any other local-DP release: at least A's (the sum is not analysed)."""
    b["dp"] = True
    b.update(copy_blocks(ctx.view_a, "per_parameter", "per_update", "all_rounds"))
    b["headline"] = "at least A's (the sum is not analysed)"
    b["guarantee"] = (
        f"At least A's. {ctx.who}, a function of the uploads, so each client keeps A's "
        "guarantee; how much the sum adds is not computed for this mechanism and settings "
        "(only binomial symbols have the exact worst case of mechanisms/secure_sum.py)."
        + _SUM_ASSUMES
    )
    return "(B) secure aggregation: the sum is not analysed for these settings; A's numbers"


def _client_knows_its_symbols(c: dict[str, Any], cat: Privacy) -> None:
    """(C): a client knows its own symbols; the entries that quoted B or the pair-joint view."""
    if not cat.paired and c.get("dp") and cat.no_dp is None:
        c["headline"] = "at least A's (it sees only the global model)"
        c["guarantee"] = (
            "At least A's guarantee (these numbers): a client receives only the global model, a "
            "function of the uploads. B's figures for the sum do not carry over as they are: a "
            "client knows its own symbols, so for it they hold at n - 1 (n - c for c colluding "
            "clients), which this report does not compute."
        )
    elif cat.paired and not c.get("dp"):
        c["guarantee"] = (
            "No DP. A client receives the global model, a function of the sum the server sees, "
            "but a paired client also knows its partner's common randomness z, which the "
            "analysis against the server (B) assumes secret, and its own bits; no accounting "
            "here bounds what the global model reveals to it." + bound_sentence(cat)
        )


def _deviating_server(d: dict[str, Any], cat: Privacy, s: SumView) -> None:
    """(D): its guarantee stays; what secure aggregation leaves against a deviating server."""
    if cat.no_dp is not None:
        d["guarantee"] = (
            "No DP: the uploads carry no noise, and a deviating server can unmask each of them."
        )
    d["guarantee"] = str(d.get("guarantee", "")) + _secagg_deviation(s)

"""The run's privacy report with secure aggregation (issue 29 item 3), and what it must not change.

- ``ldpfl`` / ``pbm`` with secure aggregation: (B) has ``dp: true``, finite ``(eps, delta)``,
  falling as ``n`` grows, equal to :mod:`corbin_fl.mechanisms.secure_sum`'s figures;
- ``corbin``: ``dp: false`` with the reason (a pair's sum is nearly deterministic);
- ``augcorbin``: the exact worst case only (nothing from the paper's eq. (5), not a valid bound),
  with the independent share it used and why;
- B shows the per-parameter figure beside the composed one, and "no meaningful protection" where
  the run's eps exceeds 10;
- the report's ``n`` is the fewest survivors of a round whose sum the server unmasked;
- (A) does not change; (D) keeps its guarantee and says what a deviating server can do, and the
  lying-server attack it describes works on the real SecAgg+ roles;
- a run WITHOUT secure aggregation gets exactly the report it got before (frozen below).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_keys import keys

from corbin_fl import registry
from corbin_fl.config import RunConfig
from corbin_fl.mechanisms import augcorbin
from corbin_fl.mechanisms import secure_sum as ss
from corbin_fl.mechanisms.categories import Privacy
from corbin_fl.mechanisms.report import privacy_report
from corbin_fl.mechanisms.secure_sum import SumView
from corbin_fl.server.records import build_summary, privacy_summary, sum_view

DELTA = 1e-5
M, T = 2_000, 3

#: privacy_summary(cfg, 7, 5_000, 10, 0.05) of each config below, computed with the code of
#: commit c4e3120 (before secure aggregation entered the report) and frozen (augcorbin refrozen
#: for issue 38: C prints nothing from eq. (5), and mse_bounds has Theorem 3's; mse_bounds' keys
#: renamed for issue 41 for the bound, not the mechanism: ldpfl -> ldpq, augcorbin_theorem3 ->
#: corbin_theorem3): a run without secure aggregation must keep exactly this report
#: (docs/results' summaries are regenerated against it).
FROZEN = Path(__file__).with_name("privacy_reports_without_secagg.json")
FROZEN_CONFIGS: dict[str, dict[str, Any]] = {
    "corbin": {"mechanism": "corbin", "epsilon": 1.0, "d": 5},
    "augcorbin": {"mechanism": "augcorbin", "epsilon": 1.0, "gamma": 0.2},
    "ldpfl": {"mechanism": "ldpfl", "epsilon": 1.0},
    "pbm-2": {"mechanism": "pbm", "epsilon": 2.0, "pbm_trials": 2},
    "rqm-3": {"mechanism": "rqm", "epsilon": 1.0, "rqm_levels": 3},
    "ternary": {"mechanism": "ternary", "epsilon": 0.5},
    "signsgd": {"mechanism": "signsgd", "epsilon": 1.0, "range_mode": "update"},
    "gaussian": {"mechanism": "gaussian", "epsilon": 1.0},
    "central-gaussian": {"mechanism": "central-gaussian", "epsilon": 2.0, "num_rounds": 7},
}


def _secure(mech: str, view: SumView, **kw: Any) -> dict[str, Any]:
    rep = privacy_report(
        mech, kw.pop("eps_p", 1.0), DELTA, kw.pop("m", M), kw.pop("T", T), **kw, secure=view
    )
    json.dumps(rep, allow_nan=False)
    return rep


# ------------------------------------------------------------------ runs without it: unchanged


@pytest.mark.parametrize("name", sorted(FROZEN_CONFIGS))
def test_reports_without_secure_aggregation_are_unchanged(name: str) -> None:
    frozen = json.loads(FROZEN.read_text(encoding="utf-8"))
    kw = dict(FROZEN_CONFIGS[name])
    cfg = RunConfig().replace(num_rounds=kw.pop("num_rounds", 7), **kw)
    got = json.loads(json.dumps(privacy_summary(cfg, 7, 5_000, 10, 0.05)))
    assert got == frozen[name]
    assert "secure_aggregation" not in got


def test_build_summary_of_a_plain_run_has_no_secure_view() -> None:
    cfg = RunConfig(mechanism="ldpfl", num_rounds=2)
    assert sum_view(cfg, [], 5) is None
    rows = [_row(1, 5, sa=None), _row(2, 5, sa=None)]
    summary = build_summary(cfg, rows, {"round": 2}, 5_000)
    assert summary["privacy"] == privacy_summary(cfg, 2, 5_000, 5, 0.05)


# ------------------------------------------------------------------ ldpfl, pbm: the exact sum


def test_ldpfl_against_the_sum_is_dp_equals_secure_sum_and_falls_with_n() -> None:
    runs = []
    for n in (5, 20, 80):
        rep = _secure("ldpfl", SumView(n, trials=1, rounds=T, threshold=3, neighbours=4))
        b = rep["threat_models"]["B"]
        g = ss.one_bit_guarantee(1.0, n, M, T, DELTA)
        assert b["dp"] is True and b["name"] == "server, sees only the sum"
        assert b["per_parameter"] == {"eps": g["per_parameter"]["eps"], "delta": DELTA}
        assert b["per_update"] == {"k": M, "eps": g["per_update"]["eps"], "delta": DELTA}
        assert b["all_rounds"] == {"k": M * T, "eps": g["all_rounds"]["eps"], "delta": DELTA}
        assert math.isfinite(b["all_rounds"]["eps"]) and 0 < len(b["headline"]) <= 46
        assert "honest-but-curious" in b["guarantee"] and f"n = {n} clients" in b["guarantee"]
        pp = f"per parameter ({g['per_parameter']['eps']:.5g}, {DELTA:g})-DP"
        assert pp in b["guarantee"]
        # m = 2,000 parameters, 3 rounds: the run's eps bounds nothing, and B says so
        assert b["all_rounds"]["eps"] > 10
        assert b["headline"] == f"no meaningful protection: run eps {b['all_rounds']['eps']:.4g}"
        assert "formally DP and practically none" in b["guarantee"]
        assert rep["secure_aggregation"]["n"] == n
        runs.append(b)
    for part in ("per_parameter", "per_update", "all_rounds"):
        eps = [b[part]["eps"] for b in runs]
        assert eps[0] > eps[1] > eps[2], (part, eps)
    # never weaker than A's (the sum is post-processing of all uploads)
    a = _secure("ldpfl", SumView(5, trials=1))["threat_models"]["A"]
    assert runs[0]["all_rounds"]["eps"] < a["all_rounds"]["eps"]


def test_pbm_trials_use_the_native_pbm_analysis() -> None:
    rep = _secure("pbm", SumView(6, trials=2, rounds=T))
    b, g = rep["threat_models"]["B"], ss.binomial_guarantee(1.0, 2, 6, M, T, DELTA)
    assert b["dp"] is True and b["all_rounds"]["eps"] == g["all_rounds"]["eps"]
    assert "2108.09449" in b["guarantee"]


def test_exact_profile_is_capped_soundly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above REPORT_MAX_N the figure at REPORT_MAX_N is reported (it bounds every larger n)."""
    monkeypatch.setattr(ss, "REPORT_MAX_N", 8)
    rep = _secure("ldpfl", SumView(30, trials=1, rounds=T))
    b = rep["threat_models"]["B"]
    assert rep["secure_aggregation"]["computed_at_n"] == 8
    assert b["all_rounds"]["eps"] == ss.one_bit_guarantee(1.0, 8, M, T, DELTA)["all_rounds"]["eps"]
    assert "computed at n = 8" in b["guarantee"] and "n = 30 clients" in b["guarantee"]


def test_unanalysed_symbols_keep_the_local_guarantee() -> None:
    for mech, view in (("rqm", SumView(10)), ("ternary", SumView(10))):
        plain = privacy_report(mech, 1.0, DELTA, M, T)["threat_models"]
        b = _secure(mech, view)["threat_models"]["B"]
        assert b["dp"] is True and b["headline"].startswith("at least A's")
        for part in ("per_parameter", "per_update", "all_rounds"):
            assert b[part] == plain["A"][part]


# ------------------------------------------------------------------ corbin, augcorbin


def test_corbin_has_no_dp_against_the_sum_and_says_why() -> None:
    rep = _secure("corbin", SumView(10, rounds=T), d=5)
    b = rep["threat_models"]["B"]
    c = ss.corbin_against_sum(1.0, 5, M, T)
    assert b["dp"] is False and b["headline"].startswith("no DP")
    assert "a pair's sum is nearly deterministic" in b["headline"]
    assert b["guarantee"].startswith("No DP, even with secure aggregation")
    assert "randomized rounding of q1 + q2" in b["guarantee"]
    assert b["sum"]["per_parameter"]["inf_mass"] == c["per_parameter"]["inf_mass"]
    assert b["sum"]["per_update"]["delta_lower_bound"] == c["per_update"]["delta_lower_bound"]
    assert "delta" not in keys(b) and "eps" not in keys(b)
    assert "pair_joint" not in b  # the server sees no pair's two bits


def test_augcorbin_too_few_independent_clients_is_no_dp_and_names_the_share() -> None:
    rep = _secure(
        "augcorbin", SumView(10, independent=2, paired=True, rounds=T), d=5, gamma=0.2, r=0.01
    )
    b = rep["threat_models"]["B"]
    assert b["dp"] is False and b["headline"] == "no DP (too few independent clients)"
    assert "eps" not in keys(b) and "delta" not in keys(b) and "ucdp_theorem3" not in keys(rep)
    assert b["independent"] == {"count": 2, "of": 10, "from": "records"}
    assert "gamma = 0.2 configured" in b["guarantee"] and "is not a valid bound" in b["guarantee"]


def test_augcorbin_small_n_reports_the_configured_gamma_and_the_share_drawn() -> None:
    """Issue 38: n = 3, gamma = 0.2: the pairing draws floor(0.6 + 1/2) = 1 independent client;
    the report says gamma = 0.2 (configured) and 1 of 3 (used), never 0.333..."""
    rep = _secure("augcorbin", SumView(3, rounds=T), d=5, gamma=0.2, r=0.01)
    b = rep["threat_models"]["B"]
    assert b["independent"] == {"count": 1, "of": 3, "from": "floor(gamma n + 1/2)"}
    assert "gamma = 0.2 configured, so 1 of 3" in b["guarantee"]
    assert "0.333" not in json.dumps(rep)


def test_augcorbin_exact_bound_is_b_and_nothing_comes_from_eq5() -> None:
    """Enough independent clients for the exact bound: B is it, with its per-parameter figure;
    the paper's eq. (5) gives no figure (tests/unit/test_lower_bounds.py shows why)."""
    view = SumView(300, independent=150, paired=True, rounds=T)
    rep = _secure("augcorbin", view, d=5, gamma=0.5, r=0.01)
    b = rep["threat_models"]["B"]
    ac = augcorbin.augcorbin_guarantee(
        1.0, 300, 0.5, M, T, DELTA, independent=150, paired=True, max_exact_n=1000
    )
    assert b["dp"] is True and "ucdp_theorem3" not in keys(rep)
    assert b["all_rounds"]["eps"] == ac["exact"]["all_rounds"]["eps"]
    assert b["per_parameter"]["eps"] == ac["exact"]["per_parameter"]["eps"]
    pp = f"per parameter ({ac['exact']['per_parameter']['eps']:.5g}, {DELTA:g})-DP"
    assert pp in b["guarantee"] and "is not a valid bound" in b["guarantee"]
    assert "Theorem 3 of arXiv 2409.13133 applies" not in json.dumps(rep)
    assert 0 < len(b["headline"]) <= 46


def test_an_independent_share_is_analysed_by_its_categorys_guarantee_against_the_sum() -> None:
    """The report names no mechanism: (B) of a share of independent clients is the guarantee its
    privacy category declares (augcorbin's: mechanisms/augcorbin.py), and the category says why
    nothing comes from the paper's eq. (5); a share without that guarantee is refused."""
    cat = registry.get("augcorbin").category
    assert cat.exact_sum() is augcorbin.augcorbin_guarantee
    assert "eq. 5) is not a valid bound" in cat.bound_note
    rep = _secure("augcorbin", SumView(300, independent=150, paired=True, rounds=T), gamma=0.5)
    assert rep["threat_models"]["B"]["guarantee"].count(cat.bound_note) == 1
    assert f"(B) secure aggregation: {augcorbin.SUM_NOTE}" in rep["notes"]
    assert "mechanisms/augcorbin.py (augcorbin_profile)" in augcorbin.SUM_NOTE
    with pytest.raises(ValueError, match="sum_guarantee"):
        Privacy("pure", paired=True, independent_share=True)
    with pytest.raises(ValueError, match="sum_guarantee"):
        Privacy("pure", paired=True, sum_guarantee="m:f")
    assert registry.get("corbin").category.exact_sum() is None


def test_signsgd_sum_has_no_dp() -> None:
    rep = _secure("signsgd", SumView(10), eps_p=None)
    b = rep["threat_models"]["B"]
    assert b["dp"] is False and "delta" not in keys(rep) and "eps" not in keys(b)


# ------------------------------------------------------------------ A, C, D


@pytest.mark.parametrize(
    ("mech", "view", "kw"),
    [
        ("ldpfl", SumView(10, trials=1, threshold=6, neighbours=9), {}),
        ("corbin", SumView(10, threshold=6, neighbours=9), {"d": 5}),
        ("augcorbin", SumView(10, independent=2, paired=True), {"d": 5, "gamma": 0.2, "r": 0.01}),
        ("pbm", SumView(10, trials=2), {}),
        ("rqm", SumView(10, trials=1), {}),
    ],
)
def test_a_unchanged_d_keeps_its_guarantee_and_names_the_attacks(
    mech: str, view: SumView, kw: dict[str, Any]
) -> None:
    plain = privacy_report(mech, 1.0, DELTA, M, T, n=10, **kw)["threat_models"]
    rep = _secure(mech, view, n=10, **kw)
    tm = rep["threat_models"]
    assert tm["A"] == plain["A"]
    d = tm["D"]
    assert d["dp"] is plain["D"]["dp"] and d["headline"] == plain["D"]["headline"]
    assert {k: v for k, v in d.items() if k != "guarantee"} == {
        k: v for k, v in plain["D"].items() if k != "guarantee"
    }
    assert d["guarantee"].startswith(plain["D"]["guarantee"])
    assert "not authenticated end to end" in d["guarantee"]
    assert "same survivor list" in d["guarantee"]
    if view.threshold is not None:
        assert f"t >= {view.threshold} of k >= {view.neighbours}" in d["guarantee"]
    for key, entry in tm.items():
        assert 0 < len(entry["headline"]) <= 46, (mech, key, entry["headline"])
        assert entry["headline"].startswith("no DP") is not entry["dp"], (mech, key)
        assert entry["guarantee"].startswith("No DP") is not entry["dp"], (mech, key)
        if not entry["dp"]:
            assert "delta" not in keys(entry) and "eps" not in keys(entry), (mech, key)
    assert not any("pair-joint" in note for note in rep["notes"])


def test_lying_server_unmasks_one_client_without_colluders() -> None:
    """What (D) says: no round checks that every client got the same survivor list, so a server
    that names a victim a survivor to its neighbours and each neighbour dropped to t of theirs
    recovers the victim's input from honest clients alone (complete graph, n = 10, t = 5). Each
    client's own checks (its neighbours' split matches the survivor list it is told, that list's
    graph is connected) pass: the lists differ between clients, and nothing compares them."""
    from corbin_fl.secagg.client import SecAggClient, pair_mask, pair_sign, self_mask
    from corbin_fl.secagg.messages import UnmaskRequest
    from corbin_fl.secagg.server import SecAggServer
    from corbin_fl.secagg.shamir import combine_shares

    rng = np.random.default_rng(3)
    ids = [100 + 7 * i for i in range(10)]
    inputs = {u: rng.integers(0, 2, size=64) for u in ids}
    clients = {u: SecAggClient(u, 1) for u in ids}
    srv = SecAggServer(run_id=1, server_round=1, node_ids=ids, levels=1)
    srv.receive_adverts({u: clients[u].advertise(1) for u in srv.advertise_targets()})
    srv.receive_shares({u: clients[u].share_keys(r) for u, r in srv.share_requests().items()})
    srv.receive_masked({u: clients[u].mask(r, inputs[u]) for u, r in srv.mask_requests().items()})
    t, victim = srv.threshold, ids[0]
    assert (srv.k, t) == (9, 5)
    nbrs = sorted(srv._accepted[victim])
    b_shares: dict[int, bytes] = {}
    s_shares: dict[int, dict[int, bytes]] = {v: {} for v in nbrs}
    for i, w in enumerate(ids):  # each honest holder gets lists that look consistent to it
        others = [v for v in sorted(srv._accepted[w]) if v != victim]
        named = victim in srv._accepted[w]
        fill = [others[(i + j) % len(others)] for j in range(t - 1 - named)]
        surv = ([victim] if named else []) + fill
        drop = [v for v in others if v not in surv]
        told = tuple(sorted({w, *surv}))  # the survivor list told to w alone (connected)
        reply = clients[w].unmask(
            UnmaskRequest(1, tuple(sorted(surv)), tuple(sorted(drop)), all_survivors=told)
        )
        if victim in reply.self_mask_shares:
            b_shares[w] = reply.self_mask_shares[victim]
        for v, share in reply.key_shares.items():
            s_shares[v][w] = share
    seed = combine_shares(b_shares, t, 32)
    y = srv._masked[victim] - self_mask(
        seed, 64, srv.config.bits, run_id=1, server_round=1, owner=victim
    )
    for v in nbrs:
        key = combine_shares(s_shares[v], t, 32)
        pm = pair_mask(
            key,
            srv.keys[victim].s_public,
            64,
            srv.config.bits,
            run_id=1,
            server_round=1,
            u=victim,
            v=v,
        )
        y = y - pm if pair_sign(victim, v) > 0 else y + pm
    y &= np.uint64((1 << srv.config.bits) - 1)
    assert np.array_equal(y.astype(np.int64), inputs[victim])


# ------------------------------------------------------------------ the run's n: from the rounds


def _row(rnd: int, participants: int, sa: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "round": rnd,
        "participants": participants,
        "round_trips": 3,
        "bytes_up": {"total": 0},
        "bytes_down": {"total": 0},
        "max_radius": 0.05,
        **extra,
    }
    if sa is not None:
        row["secure_aggregation"] = sa
    return row


def _sa(survivors: int, abandoned: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "on": True,
        "levels": 1,
        "sampled": 6,
        "b": 3,
        "k": 5,
        "t": 3,
        "survivors": survivors,
        "abandoned": abandoned,
        **extra,
    }


def test_the_reports_n_is_the_fewest_survivors_of_an_unmasked_round() -> None:
    cfg = RunConfig(mechanism="ldpfl", num_rounds=3, secure_aggregation=True)
    rows = [
        _row(1, 6, _sa(6, assignments={"solo": 6})),
        _row(2, 4, _sa(4, k=4, t=4, assignments={"solo": 4})),
        _row(3, 0, _sa(0, abandoned="mask: node 7's self-mask seed has 2 holders")),
    ]
    view = sum_view(cfg, rows, 6)
    assert view == SumView(
        4,
        independent=None,
        paired=None,
        trials=1,
        rounds=2,
        abandoned=1,
        threshold=3,
        neighbours=4,
        bits=3,
        source="rounds",
    )
    summary = build_summary(cfg, rows, {"round": 2}, M)
    priv = summary["privacy"]
    assert priv["secure_aggregation"]["n"] == 4 and priv["secure_aggregation"]["rounds"] == 2
    b = priv["threat_models"]["B"]
    assert b["dp"] is True
    assert b["all_rounds"]["eps"] == ss.one_bit_guarantee(1.0, 4, M, 3, DELTA)["all_rounds"]["eps"]
    assert "at least n = 4 clients" in b["guarantee"] and "1 round(s) abandoned" in b["guarantee"]


def test_the_report_prints_k_t_and_their_worst_bounds() -> None:
    """``privacy -> secure_aggregation`` holds the smallest t, k and the largest bounds of the
    unmasked rounds (issue 38: k, t printed with their failure probabilities)."""
    cfg = RunConfig(mechanism="ldpfl", num_rounds=3, secure_aggregation=True)
    rows = [
        _row(1, 6, _sa(6, p_security=0.0, p_abandon=0.03)),
        _row(2, 5, _sa(5, p_security=1e-13, p_abandon=0.01)),
        _row(3, 0, _sa(0, abandoned="mask: ...", p_security=0.5, p_abandon=0.9)),  # not counted
    ]
    block = build_summary(cfg, rows, {"round": 2}, M)["privacy"]["secure_aggregation"]
    assert (block["threshold"], block["neighbours"]) == (3, 5)
    assert (block["p_security"], block["p_abandon"]) == (1e-13, 0.03)


def test_augcorbin_independent_clients_come_from_the_assignments() -> None:
    cfg = RunConfig(mechanism="augcorbin", gamma=0.4, num_rounds=2, secure_aggregation=True)
    rows = [
        _row(1, 10, _sa(10, assignments={"independent": 4, "paired": 6})),
        _row(2, 7, _sa(7, assignments={"independent": 2, "paired": 4, "partner-gone": 1})),
    ]
    view = sum_view(cfg, rows, 10)
    assert view is not None and (view.n, view.independent, view.paired) == (7, 3, True)
    # a record without assignments: independent + unpaired - lost is a lower bound
    old = [_row(1, 8, _sa(8), independent=4, unpaired=0, pairs=3)]  # 10 sampled: 2 lost
    old[0]["secure_aggregation"]["sampled"] = 10
    legacy = sum_view(cfg, old, 10)
    assert legacy is not None and legacy.independent == 2 and legacy.paired is True


def test_no_unmasked_round_falls_back_to_the_configured_clients() -> None:
    cfg = RunConfig(mechanism="ldpfl", num_rounds=1, secure_aggregation=True, min_clients=5)
    view = sum_view(cfg, [_row(1, 0, _sa(0, abandoned="setup: fewer than 2 nodes"))], None)
    assert view == SumView(5, trials=1, abandoned=1, source="configuration")
    report = privacy_summary(cfg, 0, M, None, None)
    assert report["secure_aggregation"]["source"] == "configuration"
    assert "no round of this run unmasked a sum" in report["threat_models"]["B"]["guarantee"]


def test_registry_trials_of_the_secure_mechanisms() -> None:
    trials = {
        name: (m.sum_trials(RunConfig(mechanism=name)) if m.sum_trials else None)
        for name, m in registry.REGISTRY.items()
        if m.sum_levels is not None
    }
    assert trials == {
        "corbin": None,
        "augcorbin": None,
        "ldpfl": 1,
        "ternary": None,
        "pbm": 1,
        "rqm": 1,
        "signsgd": None,
    }
    assert registry.get("pbm").sum_trials(RunConfig().replace(mechanism="pbm", pbm_trials=3)) == 3  # type: ignore[misc]
    assert (
        registry.get("rqm").sum_trials(RunConfig().replace(mechanism="rqm", rqm_levels=3)) is None
    )  # type: ignore[misc]


def test_refusal_lists_mechanisms_by_what_they_give_against_the_server() -> None:
    """Issue 38 item 4: refusing fedavg / gaussian names the mechanisms with DP against the
    server first, corbin and signsgd last, said to give none."""
    from corbin_fl.secure import refusal

    for mech in ("fedavg", "gaussian"):
        why = refusal(mech)
        assert why is not None
        use = why.split("; use ", 1)[1]
        assert use.index("ldpfl") < use.index("augcorbin") < use.index("corbin, signsgd")
        assert use.index("corbin, signsgd") < use.index("give no DP against the server")
        assert "each client's own noise" in use.split("augcorbin")[0]

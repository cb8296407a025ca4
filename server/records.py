"""The run's records: one ``metrics.jsonl`` row per round, ``summary.json``, the privacy summary.

:func:`round_record` turns one round's :class:`~corbin_fl.server.stages.RoundState` into its row
(the launcher contract: ``corbin-fl local`` and the experiments read it), :func:`build_summary`
the run's rows and evaluations into ``summary.json``, and :func:`ledger_privacy` /
:func:`privacy_summary` the privacy ledger into the report every figure quotes
(:func:`corbin_fl.mechanisms.report.privacy_report`, per threat model).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flwr.app import RecordDict

from corbin_fl import registry, wire
from corbin_fl.config import RunConfig
from corbin_fl.mechanisms.report import privacy_report
from corbin_fl.server.checkpoint import TrainingState, ledger_counts
from corbin_fl.server.metrics import client_device, client_devices
from corbin_fl.server.stages import RoundState

if TYPE_CHECKING:
    from corbin_fl.mechanisms.secure_sum import SumView

logger = logging.getLogger(__name__)


def round_record(
    state: RoundState, seconds: float, evals: dict[str, float], cfg: RunConfig
) -> dict[str, Any]:
    """One line of ``metrics.jsonl`` (the launcher contract)."""
    accepted = set(state.client_metrics)
    fallbacks = sum(1 for m in state.client_metrics.values() if m.get(wire.M_FALLBACK, 0.0) > 0)
    record: dict[str, Any] = {
        "round": state.round,
        **evals,
        "sampled": len(state.sampled),
        "participants": len(accepted),
        "dropped": {str(n): why for n, why in sorted(state.dropped.items())},
        "pairs": len(state.pairs),
        "carried_pairs": state.carried_pairs,
        "pipeline_broken": dict(sorted(state.pipeline_broken.items())),
        "unpaired": len(state.unpaired),
        "independent": len(state.independent),
        "fallbacks": fallbacks,
        "paired_updates": sum(
            1 for m in state.client_metrics.values() if m.get(wire.M_PAIRED, 0.0) > 0
        ),
        "round_trips": state.round_trips,
        "bytes_up": {**state.bytes_up, "total": sum(state.bytes_up.values())},
        "bytes_down": {**state.bytes_down, "total": sum(state.bytes_down.values())},
        "stage_seconds": dict(state.stage_seconds),
        "round_seconds": seconds,
        "max_radius": state.max_radius,
        "update_radius": state.max_radius if cfg.quantizes_update else None,
        "train_loss": _mean(_app_metric(r, wire.M_TRAIN_LOSS) for r in state.app_records.values()),
        "clientapp_seconds": {  # startup, handler and its parts as this project's app reports them
            **{
                key: _mean(_app_metric(r, f"{key}-seconds") for r in state.app_records.values())
                for key in (
                    "startup",
                    "handler",
                    "import",
                    "device",
                    "model",
                    "data",
                    "setup",
                    "train",
                )
            },
            "encode": _mean(m.get(wire.M_ENCODE_SECONDS) for m in state.client_metrics.values()),
        },
        "clip_fraction": _mean(m.get(wire.M_CLIP_FRACTION) for m in state.client_metrics.values()),
        "devices": {  # the training device each client names (checked, never fatal)
            str(nid): client_device(recs, nid) for nid, recs in sorted(state.app_records.items())
        },
    }
    if state.secure is not None:  # server/secure_round.py
        record["secure_aggregation"] = state.secure
    if cfg.paired and cfg.test_z_digest:
        matched = mismatched = 0
        for a, b in state.pairs:
            da, db = state.z_digests.get(a), state.z_digests.get(b)
            if da is not None and db is not None:
                matched += da == db
                mismatched += da != db
        record["z_matched_pairs"] = matched
        record["z_mismatched_pairs"] = mismatched
    return record


def _app_metric(records: RecordDict, key: str) -> float | None:
    """``key`` of the first app MetricRecord of a reply that has it (a number), else None."""
    for rec in records.metric_records.values():
        value = rec.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _mean(values: Any) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def build_summary(
    cfg: RunConfig,
    history: list[dict[str, Any]],
    best: dict[str, Any],
    num_params: int,
    *,
    train: TrainingState | None = None,
) -> dict[str, Any]:
    """``summary.json``: config, final and best-validation accuracies, round trips, privacy.

    With ``train`` (a :class:`server.checkpoint.TrainingState`) the summary also counts the
    privacy ledger's releases (per node), the releases of rounds a crash aborted, and lists the
    Flower run ids that contributed rounds (more than one after a resume).
    """
    final = history[-1] if history else {}
    participation = [int(r["participants"]) for r in history]
    summary: dict[str, Any] = {
        "config": cfg.to_flower(),
        "num_params": num_params,
        "rounds": len(history),
        "final_test_accuracy": final.get("test_accuracy"),
        "final_test_loss": final.get("test_loss"),
        "final_val_accuracy": final.get("val_accuracy"),
        "best_val_round": best["round"],
        "best_val_accuracy": best.get("val_accuracy"),
        "best_val_test_accuracy": best.get("test_accuracy"),
        "round_trips_per_round": [int(r["round_trips"]) for r in history],
        "participants_per_round": participation,
        "bytes_up_total": sum(int(r["bytes_up"]["total"]) for r in history),
        "bytes_down_total": sum(int(r["bytes_down"]["total"]) for r in history),
        "clip_fraction": clip_summary(history),
        "client_devices": client_devices(history),
    }
    clients = max(participation, default=0)
    r_max = max((float(r["max_radius"]) for r in history), default=None)
    secure = sum_view(cfg, history, clients or None)
    if train is not None:
        summary["privacy"] = ledger_privacy(
            cfg, train.ledger, num_params, clients, r_max, secure=secure
        )
    else:
        summary["privacy"] = privacy_summary(
            cfg, len(history), num_params, clients, r_max, secure=secure
        )
    if train is not None:
        summary["privacy_ledger"] = {
            **ledger_counts(train.ledger),
            "aborted_releases": len(train.aborted_releases),
        }
        summary["run_ids"] = list(train.run_ids)
    return summary


def clip_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Fraction of coordinates the mechanism clipped into its range (mean over the clients of a
    round, as the clients report it): per round, the run's mean and its largest round."""
    per_round = [r.get("clip_fraction") for r in history]
    known = [float(v) for v in per_round if v is not None]
    return {
        "per_round": per_round,
        "mean": sum(known) / len(known) if known else None,
        "max": max(known, default=None),
    }


def ledger_privacy(
    cfg: RunConfig,
    ledger: Any,
    num_params: int,
    clients: int | None,
    r_max: float | None,
    *,
    secure: SumView | None = None,
) -> dict[str, Any]:
    """The run's privacy report from its privacy ledger (one typed event per released update).

    The composition count is the largest number of updates any one node actually released
    (including the releases of rounds a crash aborted), and ``eps_p``, ``m``, ``d`` come from
    those events, not from the configuration; a run that released nothing falls back to the
    configured worst case of zero rounds. ``ledger`` in the report says what was counted.
    ``secure``: :func:`sum_view` of the run (secure aggregation), passed on to
    :func:`privacy_summary`.
    """
    events = list(ledger)
    if not events:
        report = privacy_summary(cfg, 0, num_params, clients, r_max, secure=secure)
        report["ledger"] = {"releases": 0, "nodes": 0, "max_releases_per_node": 0}
        return report
    per_node = Counter(e.node for e in events)
    mechanisms = sorted({e.mechanism for e in events})
    if mechanisms != [cfg.mechanism]:
        logger.error("privacy ledger holds mechanisms %s, the run %s", mechanisms, cfg.mechanism)
    released = [e.eps_p for e in events if e.eps_p is not None]
    paired_d = [e.d for e in events if e.paired and e.d is not None]
    view = replace(
        cfg,
        epsilon=max(released) if released else cfg.epsilon,
        d=max(paired_d) if paired_d else cfg.d,
    )
    report = privacy_summary(
        view, max(per_node.values()), max(e.m for e in events), clients, r_max, secure=secure
    )
    report["ledger"] = {
        "releases": len(events),
        "nodes": len(per_node),
        "max_releases_per_node": max(per_node.values()),
        "paired_releases": sum(1 for e in events if e.paired),
    }
    return report


def privacy_summary(
    cfg: RunConfig,
    rounds: int,
    num_params: int,
    clients: int | None,
    r_max: float | None,
    *,
    secure: SumView | None = None,
) -> dict[str, Any]:
    """The run's privacy report, from ``mechanisms.report.privacy_report``.

    One entry per threat model (``threat_models``: A an eavesdropper on one uplink, B the
    server, which sees every bit, C a malicious client, D a malicious server), each with a
    ``dp`` flag and a plain-language ``guarantee``: ``eps_p`` per parameter and the per-update
    and ``T``-round (eps, delta) against A (worst case: a client takes part in every round),
    "no DP" against the server for the paired mechanisms (with the pair-joint lower bounds on
    delta), and no ``delta`` anywhere for a mechanism without DP. On a failure the report is
    ``{"mechanism", "eps_p", "error"}`` and the failure is logged.

    With secure aggregation (``cfg.secure_aggregation``) the server sees only sums, and (B) is
    the guarantee against that sum, from ``secure`` (:func:`sum_view` of the run's rounds) or,
    when it is None, from the configuration alone (``clients``, else ``min-clients``, as ``n``).
    Without it the report is the one runs always had.
    """
    view = None
    if cfg.secure_aggregation:
        view = secure if secure is not None else sum_view(cfg, [], clients)
    try:
        return privacy_report(
            cfg.mechanism,
            cfg.epsilon,
            cfg.delta,
            num_params,
            max(rounds, 1),
            d=cfg.d if cfg.paired else None,
            gamma=cfg.gamma if registry.get(cfg.mechanism).independent_share else None,
            n=clients or None,
            r=r_max,
            planned_rounds=cfg.num_rounds,
            secure=view,
        )
    except (ValueError, TypeError, ArithmeticError) as exc:
        logger.exception("privacy report failed")
        return {"mechanism": cfg.mechanism, "eps_p": cfg.epsilon, "error": str(exc)}


def sum_view(cfg: RunConfig, history: list[dict[str, Any]], clients: int | None) -> SumView | None:
    """What secure aggregation showed the server over the run (None without it).

    From the rounds' ``secure_aggregation`` records (:mod:`corbin_fl.server.secure_round`):
    ``n`` is the FEWEST survivors of a round whose sum the server unmasked (the worst round; an
    abandoned round unmasked nothing), the independent clients are the fewest in such a sum
    (every assignment but ``paired``; for a record without ``assignments``, the lower bound
    ``independent + unpaired - (sampled - survivors)`` of its row), ``t`` and ``k`` the smallest
    and ``b`` and the bounds ``p_security``, ``p_abandon`` the largest of those rounds. When no
    round unmasked a sum, ``n`` is ``clients``
    (else ``min-clients``, at least 2) and the source says ``configuration``. ``trials``: the
    registry entry's ``sum_trials`` under ``cfg``.
    """
    if not cfg.secure_aggregation:
        return None
    # Lazy: secure_sum imports scipy.stats and dp_accounting, about 1 s (measured), which only a
    # run with secure aggregation needs.
    from corbin_fl.mechanisms.secure_sum import SumView

    entry = registry.get(cfg.mechanism)
    trials = entry.sum_trials(cfg) if entry.sum_trials is not None else None
    unmasked: list[tuple[dict[str, Any], dict[str, Any]]] = []
    abandoned = 0
    for row in history:
        sa = row.get("secure_aggregation")
        if not isinstance(sa, dict):
            continue
        if sa.get("abandoned") is not None or int(sa.get("survivors") or 0) < 1:
            abandoned += 1
            continue
        unmasked.append((row, sa))
    if not unmasked:
        n = max(2, int(clients or cfg.min_clients))
        return SumView(n, trials=trials, abandoned=abandoned, source="configuration")
    survivors = [int(sa["survivors"]) for _, sa in unmasked]
    independent: list[int] = []
    paired: list[int] = []
    for (row, sa), n_r in zip(unmasked, survivors, strict=True):
        kinds = sa.get("assignments")
        if isinstance(kinds, dict):
            p = int(kinds.get(wire.PAIRED, 0))
            independent.append(n_r - p)
            paired.append(p)
        else:  # a record written before assignments were recorded: a lower bound
            lost = int(sa.get("sampled", n_r)) - n_r
            solo = int(row.get("independent", 0)) + int(row.get("unpaired", 0))
            independent.append(min(n_r, max(0, solo - lost)))
            paired.append(min(n_r, 2 * int(row.get("pairs", 0))))
    return SumView(
        min(survivors),
        independent=min(independent) if entry.pairs else None,
        paired=any(paired) if entry.pairs else None,
        trials=trials,
        rounds=len(unmasked),
        abandoned=abandoned,
        threshold=min((int(sa["t"]) for _, sa in unmasked if "t" in sa), default=None),
        neighbours=min((int(sa["k"]) for _, sa in unmasked if "k" in sa), default=None),
        bits=max((int(sa["b"]) for _, sa in unmasked if "b" in sa), default=None),
        source="rounds",
        p_security=max(
            (float(sa["p_security"]) for _, sa in unmasked if "p_security" in sa), default=None
        ),
        p_abandon=max(
            (float(sa["p_abandon"]) for _, sa in unmasked if "p_abandon" in sa), default=None
        ),
    )

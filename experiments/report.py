"""``report.md``: setup, model-selection rule, tables (mean ± std over seeds), figures, privacy,
and the quick-scale TARGET checks (printed with PASS / MISS and the numbers, never asserted).

Targets (the quick-scale acceptance bar of this project):

* federated (``epsilon`` experiment): CorBin-FL beats LDP-FL on mean test accuracy at every
  ``eps_p <= 1``; by at least 5 points at ``eps_p = 0.5``; CorBin-FL at ``eps_p = 1`` is within
  5 points of FedAvg;
* MSE (``mse`` experiment): the measured pair MSE is within 3 standard errors of the closed form
  (grid averages, per ``eps`` and quantizer); CorBinQ's MSE is at most half of LDPQ's at
  ``eps_p = 0.5``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from corbin_fl.fsio import atomic_write_text
from experiments.results import (
    SELECTION_RULE,
    GroupResult,
    RunResult,
    group_label,
    privacy_view,
)
from experiments.spec import ExperimentSpec

if TYPE_CHECKING:  # typing only: a federated report must not import torch
    from experiments.mse import GridMSE, RealWeightsMSE

logger = logging.getLogger(__name__)

Status = Literal["PASS", "MISS", "N/A"]


@dataclass(frozen=True)
class Target:
    """One quick-scale target check: a name, PASS / MISS / N/A, and the numbers behind it."""

    name: str
    status: Status
    detail: str


# --------------------------------------------------------------------------- helpers


def _pct(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{100 * x:.2f}"


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "—" if math.isnan(x) else ("∞" if x > 0 else "-∞")
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _rel(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(base).resolve()))
    except ValueError:
        return str(path)


def _without(setting: Mapping[str, Any], *keys: str) -> str:
    return json.dumps({k: v for k, v in setting.items() if k not in keys}, sort_keys=True)


# --------------------------------------------------------------------------- targets


def federated_targets(groups: Sequence[GroupResult]) -> list[Target]:
    """The three accuracy targets, evaluated on lambda-selected mean test accuracy.

    CorBin-FL and LDP-FL settings are matched on every key but the mechanism; FedAvg is
    matched on every key but the mechanism and epsilon (it does not use eps_p). A target whose
    runs are not in this experiment is ``N/A``.
    """
    corbin = [g for g in groups if g.setting.get("mechanism") == "corbin"]
    ldpfl = {
        _without(g.setting, "mechanism"): g for g in groups if g.setting.get("mechanism") == "ldpfl"
    }
    fedavg = {
        _without(g.setting, "mechanism", "epsilon"): g
        for g in groups
        if g.setting.get("mechanism") == "fedavg"
    }
    pairs = []
    for g in corbin:
        other = ldpfl.get(_without(g.setting, "mechanism"))
        eps = g.setting.get("epsilon")
        if other is not None and isinstance(eps, int | float):
            pairs.append((float(eps), g, other))
    pairs.sort(key=lambda p: p[0])
    targets: list[Target] = []

    low = [p for p in pairs if p[0] <= 1.0]
    if low:
        parts = [
            f"eps={e:g}: CorBin {_pct(cg.test.mean)} vs LDP-FL {_pct(lg.test.mean)}"
            for e, cg, lg in low
        ]
        ok = all(cg.test.mean > lg.test.mean for _, cg, lg in low)
        targets.append(
            Target(
                "CorBin-FL > LDP-FL at every eps_p <= 1", "PASS" if ok else "MISS", "; ".join(parts)
            )
        )
    else:
        targets.append(
            Target(
                "CorBin-FL > LDP-FL at every eps_p <= 1",
                "N/A",
                "no CorBin/LDP-FL pair with eps_p <= 1",
            )
        )

    half = [p for p in pairs if math.isclose(p[0], 0.5)]
    if half:
        parts, ok = [], True
        for _, cg, lg in half:
            gap = 100 * (cg.test.mean - lg.test.mean)
            ok &= gap >= 5.0
            parts.append(
                f"CorBin {_pct(cg.test.mean)} - LDP-FL {_pct(lg.test.mean)} = {gap:+.2f} points"
            )
        targets.append(
            Target(
                "CorBin-FL >= LDP-FL + 5 points at eps_p = 0.5",
                "PASS" if ok else "MISS",
                "; ".join(parts),
            )
        )
    else:
        targets.append(
            Target("CorBin-FL >= LDP-FL + 5 points at eps_p = 0.5", "N/A", "no pair at eps_p = 0.5")
        )

    at_one = []
    for g in corbin:
        eps = g.setting.get("epsilon")
        if isinstance(eps, int | float) and math.isclose(float(eps), 1.0):
            ref = fedavg.get(_without(g.setting, "mechanism", "epsilon"))
            if ref is not None:
                at_one.append((g, ref))
    if at_one:
        parts, ok = [], True
        for c, f in at_one:
            gap = 100 * (f.test.mean - c.test.mean)
            ok &= gap <= 5.0
            parts.append(
                f"FedAvg {_pct(f.test.mean)} - CorBin {_pct(c.test.mean)} = {gap:+.2f} points"
            )
        targets.append(
            Target(
                "CorBin-FL at eps_p = 1 within 5 points of FedAvg",
                "PASS" if ok else "MISS",
                "; ".join(parts),
            )
        )
    else:
        targets.append(
            Target(
                "CorBin-FL at eps_p = 1 within 5 points of FedAvg",
                "N/A",
                "no CorBin eps_p = 1 / FedAvg pair",
            )
        )
    return targets


def mse_targets(grid: GridMSE | None, real: RealWeightsMSE | None) -> list[Target]:
    """The two MSE targets: measured within 3 SE of the closed form; CorBinQ <= LDPQ / 2 at
    eps_p = 0.5 (grid average, and on real weights when measured)."""
    targets: list[Target] = []
    if grid is None:
        return [Target("pair MSE measured within 3 SE of the closed form", "N/A", "no grid")]
    worst: dict[str, tuple[float, str]] = {}
    for which, name in (("corbin", "CorBinQ"), ("ldpq", "LDPQ")):
        mean, se = grid.grid_mean(which)
        closed = getattr(grid, f"{which}_closed").mean(axis=(1, 2))
        for k, eps in enumerate(grid.epsilons):
            z = (mean[k] - closed[k]) / se[k] if se[k] > 0 else 0.0
            if abs(z) >= abs(worst.get("grid", (0.0, ""))[0]):
                worst["grid"] = (z, f"{name} eps={eps:g}: {mean[k]:.5g} vs {closed[k]:.5g}")
    if real is not None:
        for which, name in (("corbin", "CorBinQ"), ("ldpq", "LDPQ")):
            meas = getattr(real, f"{which}_measured")[:, -1]
            se = getattr(real, f"{which}_se")[:, -1]
            closed = getattr(real, f"{which}_closed")[:, -1]
            for k, eps in enumerate(real.epsilons):
                z = (meas[k] - closed[k]) / se[k] if se[k] > 0 else 0.0
                if abs(z) >= abs(worst.get("real weights", (0.0, ""))[0]):
                    worst["real weights"] = (
                        z,
                        f"{name} eps={eps:g}: {meas[k]:.5g} vs {closed[k]:.5g}",
                    )
    ok = all(abs(z) <= 3.0 for z, _ in worst.values())
    n_checks = 2 * len(grid.epsilons) * (2 if real is not None else 1)
    detail = f"{n_checks} averages (grid; real weights) checked; largest |z|: " + "; ".join(
        f"{part}: z={z:+.2f} ({what})" for part, (z, what) in worst.items()
    )
    targets.append(
        Target("pair MSE measured within 3 SE of the closed form", "PASS" if ok else "MISS", detail)
    )
    try:
        k = grid.eps_index(0.5)
    except KeyError:
        targets.append(
            Target("CorBinQ MSE <= LDPQ MSE / 2 at eps_p = 0.5", "N/A", "eps_p = 0.5 not measured")
        )
        return targets
    cm, _ = grid.grid_mean("corbin")
    lm, _ = grid.grid_mean("ldpq")
    ratio = cm[k] / lm[k]
    closed_ratio = grid.corbin_closed[k].mean() / grid.ldpq_closed[k].mean()
    ok = ratio <= 0.5
    detail = (
        f"grid average: {cm[k]:.5g} / {lm[k]:.5g} = {ratio:.3f} (closed form {closed_ratio:.3f})"
    )
    if real is not None:
        try:
            kr = real.epsilons.index(0.5)
        except ValueError:
            kr = -1
        if kr >= 0:
            rr = real.corbin_measured[kr, -1] / real.ldpq_measured[kr, -1]
            ok &= rr <= 0.5
            detail += f"; real weights: ratio {rr:.3f}"
    targets.append(
        Target("CorBinQ MSE <= LDPQ MSE / 2 at eps_p = 0.5", "PASS" if ok else "MISS", detail)
    )
    return targets


def render_targets(targets: Sequence[Target]) -> str:
    """Markdown table of target checks."""
    return _table(
        ["target (quick scale, reported, not asserted)", "status", "numbers"],
        [[t.name, f"**{t.status}**", t.detail] for t in targets],
    )


# --------------------------------------------------------------------------- privacy


_THREAT_MODEL_NAMES: dict[str, str] = {
    "A": "eavesdropper on one uplink",
    "B": "server that sees every bit",
    "C": "malicious client",
    "D": "malicious server",
}
"""Column names; the same as ``mechanisms.accounting.THREAT_MODELS`` (not imported: importing
``mechanisms`` imports torch, and a report of recorded runs needs neither)."""


def _eps_delta(eps: float | None, delta: float | None) -> str:
    if eps is None:
        return "—"
    return f"({_num(eps)}, {_num(delta)})"


def _threat_model_cell(key: str, entry: Any) -> str:
    """One threat model's guarantee in a table cell: "**no DP**" said first, or the headline
    with the composed (eps, delta) of threat model A."""
    if not isinstance(entry, Mapping):
        return "—"
    headline = str(entry.get("headline", ""))
    if entry.get("dp") is not True:
        rest = headline[len("no DP") :].strip() if headline.startswith("no DP") else headline
        cell = f"**no DP** {rest}".strip()
        pu = entry.get("pair_joint", {}).get("per_update") if key == "B" else None
        if isinstance(pu, Mapping) and pu.get("delta_lower_bound") is not None:
            cell += f"; one update: δ ≥ {_num(pu['delta_lower_bound'])} for every eps"
        return cell
    parts = [headline]
    if key == "A":
        for label, part in (("update", "per_update"), ("run", "all_rounds")):
            block = entry.get(part)
            if isinstance(block, Mapping) and not (part == "per_update" and block.get("k") == 1):
                parts.append(f"{label} {_eps_delta(block.get('eps'), block.get('delta'))}")
    return "; ".join(parts)


def privacy_section(groups: Sequence[GroupResult], keys: Sequence[str]) -> str:
    """The privacy of every setting, one column per threat model, from the ``privacy`` report
    the ServerApp wrote into ``summary.json`` (:func:`mechanisms.accounting.privacy_report`,
    computed from the run's real configuration, number of parameters and rounds; reports of
    the earlier layout are read through :func:`experiments.results.privacy_view`)."""
    lines = [
        "From each run's `summary.json` (`mechanisms.accounting.privacy_report`, evaluated by "
        "the ServerApp on the run's actual m parameters, T rounds and clients; see SECURITY.md). "
        "One column per adversary; **no DP** means the report gives no differential-privacy "
        "guarantee against it. **eps_p**: per-parameter PLDP budget (paper eq. 3). "
        "**A, eavesdropper on one uplink**: each parameter's guarantee, then the exact "
        "(eps, δ) of one client update of m parameters and of all T rounds. "
        "**B, server that sees every bit** (honest but curious): for paired mechanisms the "
        "lower bound on δ of the pair-joint view shows why there is no DP. "
        "**C, malicious client**: it receives only the global model (and, when paired, its "
        "partner's common randomness). **D, malicious server**: it can learn every pair's "
        "common randomness and sets epsilon and the rounds.",
        "",
    ]
    rows: list[list[str]] = []
    notes: dict[str, None] = {}
    words: dict[str, list[str]] = {}
    for g in groups:
        run = next((r for r in g.runs if r.summary.get("privacy")), None)
        report = privacy_view(run.summary) if run is not None else None
        label = group_label(g.setting, keys)
        if not isinstance(report, Mapping):
            rows.append([label, "—", "no privacy report in summary.json", "", "", ""])
            continue
        if report.get("error"):
            rows.append([label, _num(report.get("eps_p")), f"error: {report['error']}", "", "", ""])
            continue
        mech = str(report.get("mechanism", "?"))
        for note in report.get("notes", []) or []:
            notes[f"{mech}: {note}"] = None
        tm = report.get("threat_models")
        tm = tm if isinstance(tm, Mapping) else {}
        if mech not in words:
            words[mech] = [f"**{mech}**" + (f" ({label}):" if label != mech else ":")] + [
                f"  - {key}, {name}: {tm[key].get('guarantee', '')}"
                for key, name in _THREAT_MODEL_NAMES.items()
                if isinstance(tm.get(key), Mapping)
            ]
        eps_p = report.get("eps_p")
        rows.append(
            [label, _num(eps_p) if eps_p is not None else "— (no DP)"]
            + [_threat_model_cell(key, tm.get(key)) for key in _THREAT_MODEL_NAMES]
        )
    header = ["setting", "eps_p"] + [f"{k}: {n}" for k, n in _THREAT_MODEL_NAMES.items()]
    lines.append(_table(header, rows))
    if words:
        lines += ["", "The guarantees in words (first setting of each mechanism):", ""]
        for block in words.values():
            lines += [f"- {block[0]}", *block[1:]]
    if notes:
        lines += ["", "Notes from the accountant:", ""]
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------- reports


def _header(spec: ExperimentSpec, command: str) -> list[str]:
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Experiment `{spec.name}`", ""]
    if spec.description:
        lines += [spec.description, ""]
    lines += [
        f"- spec: `{spec.source}`" if spec.source else "- spec: (inline)",
        f"- generated: {now}",
        f"- regenerate: `{command}`",
        "",
    ]
    return lines


DISCUSSION_FILE = "discussion.md"
"""Hand-written analysis next to ``report.md`` (why a target is missed, what a figure shows):
embedded in the report, never overwritten by it."""


def write_federated_report(
    path: Path,
    spec: ExperimentSpec,
    results: Sequence[RunResult],
    groups: Sequence[GroupResult],
    keys: Sequence[str],
    figures: Mapping[str, Path],
    *,
    command: str,
    expected_runs: int,
    failures: Mapping[str, str] | None = None,
) -> list[Target]:
    """Write ``report.md`` of a federated experiment; return the target checks.

    Parameters
    ----------
    results, groups, keys
        All finished runs, the lambda-selected groups and the varying setting keys.
    figures
        Figure name -> PNG path (embedded relative to ``path``).
    command
        The command that regenerates the experiment (printed in the report).
    expected_runs
        Number of runs of the spec (to flag an incomplete experiment).
    failures
        Run id -> reason, for runs that failed in the last invocation.
    """
    base = Path(path).parent
    lines = _header(spec, command)
    done = len(results)
    status = "complete" if done == expected_runs else f"INCOMPLETE ({done}/{expected_runs} runs)"
    lines += [
        "## Setup",
        "",
        f"- runs: {done} of {expected_runs} finished ({status}); backend: {spec.backend}",
        f"- seeds: {list(spec.seeds)}; lambda grid: {list(spec.lambda_grid)}",
        f"- swept: {', '.join(keys) if keys else '(nothing)'}",
        "- base run config: "
        + ", ".join(f"`{k}={v}`" for k, v in sorted(spec.base.items()))
        + (f", `clients={spec.clients}`" if spec.clients is not None else ""),
        "",
        "## Model selection",
        "",
        SELECTION_RULE,
        "",
        "## Results",
        "",
        "Accuracies in percent, mean ± sample std over seeds, at each setting's chosen lambda.",
        "",
    ]
    rows = []
    for g in groups:
        rows.append(
            [
                group_label(g.setting, keys),
                f"{g.global_lr:g}",
                g.test.fmt(),
                g.final_test.fmt(),
                g.val.fmt(),
                g.selected_round.fmt(scale=1.0, digits=1),
                str(g.test.n),
                _num(g.privacy("eps_p")),
                _num(g.uplink_bytes.mean / 1e6, 3) if g.uplink_bytes.n else "—",
                _num(g.seconds.mean, 3),
            ]
        )
    lines.append(
        _table(
            [
                "setting",
                "λ (val)",
                "test acc @ val-selected round",
                "final-round test acc",
                "val acc @ checkpoint",
                "checkpoint round",
                "seeds",
                "eps_p",
                "uplink MB / run",
                "s / run",
            ],
            rows,
        )
    )
    if len(spec.lambda_grid) > 1:
        lines += ["", "### Lambda selection (mean validation accuracy at the checkpoints)", ""]
        lam_rows = []
        for g in groups:
            cells = []
            for lam in spec.lambda_grid:
                s = g.lambda_scores.get(float(lam))
                mark = " ✓" if math.isclose(lam, g.global_lr) else ""
                cells.append(f"{_pct(s.mean)}{mark}" if s is not None else "—")
            lam_rows.append([group_label(g.setting, keys), *cells])
        lines.append(_table(["setting", *(f"λ={lam:g}" for lam in spec.lambda_grid)], lam_rows))
    if figures:
        lines += ["", "## Figures", ""]
        for name, fig in figures.items():
            lines += [f"### {name}", "", f"![{name}]({_rel(fig, base)})", ""]
    lines += ["", "## Privacy", "", privacy_section(groups, keys), ""]
    targets = federated_targets(groups)
    lines += ["## Quick-scale targets", "", render_targets(targets), ""]
    discussion = base / DISCUSSION_FILE
    if discussion.is_file():
        lines += [
            "## Discussion",
            "",
            f"(Written by hand in `{DISCUSSION_FILE}` next to this report; kept when the report "
            "is regenerated.)",
            "",
            discussion.read_text(encoding="utf-8").strip(),
            "",
        ]
    if failures:
        lines += ["## Failed runs (redone on the next invocation)", ""]
        lines += [
            f"- `{rid}`: {reason.splitlines()[0] if reason else ''}"
            for rid, reason in failures.items()
        ]
        lines.append("")
    lines += [
        "## Files",
        "",
        "- `runs.csv`: one row per run (all lambdas; `lambda_selected` marks the chosen ones)",
        "- `groups.csv`: one row per setting at its chosen lambda",
        "- `runs/<run-id>/`: `metrics.jsonl`, `summary.json` (with the runner's `run` record), "
        "`app/` (the app's own output)",
        "",
    ]
    atomic_write_text(path, "\n".join(lines))
    return targets


def write_mse_report(
    path: Path,
    spec: ExperimentSpec,
    grid: GridMSE,
    real: RealWeightsMSE | None,
    figures: Mapping[str, Path],
    *,
    command: str,
) -> list[Target]:
    """Write ``report.md`` of the quantizer-MSE experiment; return the target checks."""
    assert spec.mse is not None
    base = Path(path).parent
    m = spec.mse
    lines = _header(spec, command)
    lines += [
        "## Setup",
        "",
        f"- center c = {m.center:g}, radius r = {m.radius:g}, shared bits d = {m.d}",
        f"- grid: {m.grid_points} x {m.grid_points} points (w1, w2) in [c - r, c + r]^2",
        f"- draws: {m.samples} per point per seed; seeds {list(grid.seeds)}",
        "- pair MSE = E[(Q1(w1) + Q2(w2) - w1 - w2)^2]; CorBinQ = Alg. 2 (lead rule for w1, "
        "follow rule for w2, one uniform codeword z in [0, 2^d)); LDPQ = two independent Alg. 1",
        "- closed forms: `mechanisms.theory.corbin_pair_mse` (exact, finite d) and "
        "`mechanisms.theory.ldpq_pair_mse`",
        "",
        "## Grid-averaged pair MSE",
        "",
        "Measured: mean ± std over seeds of the grid average (pooled SE in parentheses); "
        "z = (measured - closed) / SE; 'points within 3 SE' counts the grid points whose "
        "measured MSE is within 3 SE of the closed form.",
        "",
    ]
    cm, cse = grid.grid_mean("corbin")
    lm, lse = grid.grid_mean("ldpq")
    zc = grid.z_scores("corbin")
    zl = grid.z_scores("ldpq")
    rows = []
    for k, eps in enumerate(grid.epsilons):
        cc = grid.corbin_closed[k].mean()
        lc = grid.ldpq_closed[k].mean()
        sc, sl = grid.seed_stat("corbin", k), grid.seed_stat("ldpq", k)
        rows.append(
            [
                f"{eps:g}",
                f"{sc.fmt(scale=1.0, digits=5)} ({cse[k]:.2g})",
                f"{cc:.5g}",
                f"{(cm[k] - cc) / cse[k]:+.2f}" if cse[k] > 0 else "0",
                f"{sl.fmt(scale=1.0, digits=5)} ({lse[k]:.2g})",
                f"{lc:.5g}",
                f"{(lm[k] - lc) / lse[k]:+.2f}" if lse[k] > 0 else "0",
                f"{cm[k] / lm[k]:.3f} ({cc / lc:.3f})",
                f"{np.mean(np.abs(zc[k]) <= 3):.1%} / {np.mean(np.abs(zl[k]) <= 3):.1%}",
            ]
        )
    lines.append(
        _table(
            [
                "eps_p",
                "CorBinQ measured",
                "CorBinQ closed",
                "z",
                "LDPQ measured",
                "LDPQ closed",
                "z",
                "ratio measured (closed)",
                "points within 3 SE (CorBinQ / LDPQ)",
            ],
            rows,
        )
    )
    if real is not None:
        rw = spec.mse.real_weights
        assert rw is not None
        lines += [
            "",
            "## Pair MSE on real model weights",
            "",
            f"Two clients trained `{rw.model}` on `{rw.dataset}` for {rw.local_epochs} local "
            f"epoch(s) (batch {rw.batch_size}, IID partitions 0 and 1 of {rw.num_partitions}) "
            "from the same initial weights; per-layer c and r from the layer-wise min/max over "
            f"both clients; {real.repeats} quantizations per eps. Per-parameter pair MSE, "
            "measured ± SE (closed form):",
            "",
        ]
        rows = []
        for li, name in enumerate(real.layers):
            cells = [name, str(real.sizes[li]), f"{real.radius[li]:.3g}"]
            for k in range(len(real.epsilons)):
                cells.append(
                    f"{real.corbin_measured[k, li]:.4g} ± {real.corbin_se[k, li]:.1g} "
                    f"({real.corbin_closed[k, li]:.4g}) / {real.ldpq_measured[k, li]:.4g} "
                    f"({real.ldpq_closed[k, li]:.4g})"
                )
            rows.append(cells)
        lines.append(
            _table(
                [
                    "layer",
                    "params",
                    "r (all: max)",
                    *(f"CorBinQ / LDPQ, eps={e:g}" for e in real.epsilons),
                ],
                rows,
            )
        )
    if figures:
        lines += ["", "## Figures", ""]
        for name, fig in figures.items():
            lines += [f"### {name}", "", f"![{name}]({_rel(fig, base)})", ""]
    targets = mse_targets(grid, real)
    lines += ["", "## Quick-scale targets", "", render_targets(targets), ""]
    lines += [
        "## Files",
        "",
        "- `mse_grid.csv`: per (eps, w1, w2): measured mean, SE and closed form, both quantizers",
        "- `mse_real_weights.csv`: per (eps, layer): per-parameter pair MSE" if real else "",
        "",
    ]
    atomic_write_text(path, "\n".join(lines))
    return targets

"""``report.md``: setup, model selection, tables (mean ± std over seeds), figures, privacy and
the quick-scale target checks (PASS / MISS / not resolved / N/A with their numbers, reported,
never asserted). Each target claims a difference and reads its two-sided :data:`CONFIDENCE`
interval (:data:`TARGET_RULE`; the MSE targets are :mod:`experiments.mse`'s).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scipy import stats

from corbin_fl.config import RunConfig
from corbin_fl.experiments import plots, sweep
from corbin_fl.experiments import results as rs
from corbin_fl.experiments import server_table as st
from corbin_fl.experiments.results import GroupResult, Stat, group_label
from corbin_fl.experiments.spec import (
    ExperimentSpec,
    RunValue,
    TargetSpec,
    default_targets,
    grid_name,
)
from corbin_fl.fsio import atomic_write_text
from corbin_fl.mechanisms.accounting import THREAT_MODELS
from corbin_fl.mechanisms.protection import per_parameter_text, protection

logger = logging.getLogger(__name__)

Status = Literal["PASS", "MISS", "not resolved", "N/A"]

CONFIDENCE = 0.95
"""Confidence of the two-sided interval a target check reads (:func:`verdict`)."""

TARGET_RULE = rs.TEXTS["target-rule"].format(confidence=100 * CONFIDENCE)
"""The rule of the target checks, stated above their table in every federated report."""


@dataclass(frozen=True)
class Target:
    """One quick-scale target check: a name, its :data:`Status`, and the numbers behind it."""

    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Difference:
    """A difference with its standard error, degrees of freedom (``inf``: normal) and
    :data:`CONFIDENCE` interval ``[low, high]`` (NaN without an interval: one seed)."""

    value: float
    se: float
    df: float
    low: float
    high: float

    @classmethod
    def welch(cls, a: Stat, b: Stat) -> Difference:
        """``100 (a.mean - b.mean)`` (percentage points) with Welch's t interval of the
        difference (``scipy.stats.ttest_ind(equal_var=False)`` and its ``confidence_interval``
        on the percentages; :meth:`Stat.sample`) and its standard error ``sqrt(va + vb)``,
        ``v = (100 s)^2 / n``; none below two values, a point without spread."""
        value = 100.0 * (a.mean - b.mean)
        if a.n < 2 or b.n < 2 or not (math.isfinite(a.std) and math.isfinite(b.std)):
            return cls(value, math.nan, math.nan, math.nan, math.nan)
        se = math.hypot(100.0 * a.std / math.sqrt(a.n), 100.0 * b.std / math.sqrt(b.n))
        if se == 0.0:
            return cls(value, 0.0, math.inf, value, value)
        test = stats.ttest_ind(100.0 * a.sample(), 100.0 * b.sample(), equal_var=False)
        interval = test.confidence_interval(CONFIDENCE)
        return cls(value, se, float(test.df), float(interval.low), float(interval.high))

    @classmethod
    def normal(cls, value: float, se: float) -> Difference:
        """``value`` with the normal interval ``value ± z se`` (none for a non-finite ``se``)."""
        if not math.isfinite(se) or se < 0.0:
            return cls(value, math.nan, math.nan, math.nan, math.nan)
        half = float(stats.norm.ppf(0.5 + CONFIDENCE / 2)) * se
        return cls(value, se, math.inf, value - half, value + half)

    def fmt(self, digits: int = 2) -> str:
        """``"SE 0.76, 95% CI [-2.03, +3.03], df 2.8"``, or that there is no interval."""
        if math.isnan(self.se):
            return "no interval (one seed)"
        se = f"{self.se:.{digits}f}" if self.se >= 10.0**-digits else f"{self.se:.2g}"
        df = "" if math.isinf(self.df) else f", df {self.df:.1f}"
        ci = f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        return f"SE {se}, {100 * CONFIDENCE:g}% CI {ci}{df}"


def verdict(diff: Difference, threshold: float, claim: Literal["above", "below"]) -> Status:
    """PASS if ``diff``'s whole interval is ``claim`` ``threshold``, MISS if wholly on the other
    side, else "not resolved" (:data:`TARGET_RULE`)."""
    low, high = (diff.low, diff.high) if claim == "above" else (-diff.high, -diff.low)
    threshold = threshold if claim == "above" else -threshold
    if math.isnan(low) or math.isnan(high):
        return "not resolved"
    return "PASS" if low > threshold else "MISS" if high < threshold else "not resolved"


def combine(name: str, checks: Sequence[tuple[Status, str]], missing: str = "") -> Target:
    """The target from its ``(status, numbers)`` checks: MISS if one misses, else not resolved
    if one is, else PASS; ``N/A`` (why: ``missing``) without any."""
    if not checks:
        return Target(name, "N/A", missing)
    found = {status for status, _ in checks}
    status: Status = next(s for s in ("MISS", "not resolved", "N/A", "PASS") if s in found)
    detail = "; ".join(f"{text}: {st}" for st, text in checks) if len(checks) > 1 else checks[0][1]
    return Target(name, status, detail)


def federated_targets(
    groups: Sequence[GroupResult], declared: Sequence[TargetSpec] | None = None
) -> list[Target]:
    """The accuracy targets ``declared`` (a spec's :attr:`ExperimentSpec.targets`; default
    :func:`default_targets`, ``experiments/targets.toml``) on lambda-selected mean test
    accuracy: each target's mechanism and reference matched on every key but the mechanism
    (and epsilon when the reference has no DP)."""
    return [_target(groups, t) for t in (default_targets() if declared is None else declared)]


def _target(groups: Sequence[GroupResult], target: TargetSpec) -> Target:
    """One target's check: every matched (mechanism, reference) pair at its eps_p."""

    def key(g: GroupResult, *drop: str) -> str:
        return json.dumps({k: v for k, v in g.setting.items() if k not in drop}, sort_keys=True)

    def eps(g: GroupResult) -> float:
        return float(g.setting["epsilon"])

    drop = ("mechanism", "epsilon") if target.any_epsilon else ("mechanism",)
    refs = {key(g, *drop): g for g in groups if g.setting.get("mechanism") == target.reference}
    ours = [
        g
        for g in groups
        if g.setting.get("mechanism") == target.mechanism
        and isinstance(g.setting.get("epsilon"), int | float)
    ]
    ours.sort(key=eps)
    # The other keys that tell the mechanism's settings apart (dropout-prob, range-mode, ...)
    # name each comparison, so that two at one eps_p can be told apart.
    keys = sorted({k for c in ours for k in c.setting} - {"epsilon"})
    other = [k for k in keys if len({repr(c.setting[k]) for c in ours if k in c.setting}) > 1]
    within = target.claim == "within"
    names = (target.mechanism_label, target.reference_name)

    def gap(c: GroupResult, o: GroupResult) -> tuple[Status, str]:
        """The verdict on ``c``'s minus the reference ``o``'s mean test accuracy being above
        the margin (``o``'s minus ``c``'s below it, ``within``), in words."""
        (na, a), (nb, b) = (
            ((names[1], o), (names[0], c)) if within else ((names[0], c), (names[1], o))
        )
        diff = Difference.welch(a.test, b.test)
        text = f"{na} {a.test.fmt()} - {nb} {b.test.fmt()} = {diff.value:+.2f} points"
        named = [f"eps={eps(c):g}"] * (target.eps_max is not None) + [
            f"{k}={c.setting[k]}" for k in other if k in c.setting
        ]
        text = f"{', '.join(named)}: {text}" if named else text
        status = verdict(diff, target.margin, "below" if within else "above")
        return status, f"{text} ({diff.fmt()})"

    found = [
        gap(c, o)
        for c in ours
        if target.covers(eps(c)) and (o := refs.get(key(c, *drop))) is not None
    ]
    return combine(target.name, found, target.missing)


def _num(x: Any, digits: int = 4) -> str:
    if isinstance(x, bool):
        return str(x).lower()
    if not isinstance(x, float):
        return "—" if x is None else str(x)
    if not math.isfinite(x):
        return "—" if math.isnan(x) else ("∞" if x > 0 else "-∞")
    scientific = x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3)
    return f"{x:.{digits - 1}e}" if scientific else f"{x:.{digits}g}"


def _amount(x: float) -> str:
    """A measured amount (seconds, megabytes): whole units with thousands separators from 100
    up (``1,263``, not ``1.26e+03``), three significant digits below (:func:`_num`)."""
    return f"{x:,.0f}" if math.isfinite(x) and abs(x) >= 100 else _num(x, 3)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (``|`` in a cell escaped)."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def header(spec: ExperimentSpec, command: str) -> list[str]:
    """The report's title, the spec's description, its source and how to regenerate it."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    source = f"- spec: `{spec.source}`" if spec.source else "- spec: (inline)"
    description = [spec.description, ""] if spec.description else []
    head = [f"# Experiment `{spec.name}`", "", *description, source]
    return [*head, f"- generated: {now}", f"- regenerate: `{command}`", ""]


def section(title: str, *blocks: str) -> list[str]:
    """The lines of a Markdown section: ``## title``, then each block; a blank line after each."""
    return [f"## {title}", "", *(line for block in blocks for line in (block, ""))]


def figures_section(figures: Mapping[str, Path], base: Path) -> list[str]:
    """The ``## Figures`` section (each PNG, saved under ``base``, linked relative to it); none
    without figures."""
    links = [f"### {n}\n\n![{n}]({Path(fig).relative_to(base)})\n" for n, fig in figures.items()]
    return ["## Figures", "", *links, ""] if figures else []


def targets_table(targets: Sequence[Target], scale: str = "quick scale, ") -> str:
    """The target checks as a Markdown table (``scale``: the targets' scale, its header's)."""
    head = [f"target ({scale}reported, not asserted)", "status", "numbers"]
    return table(head, [[t.name, f"**{t.status}**", t.detail] for t in targets])


def _threat_model_cell(key: str, entry: Any, eps_p: Any = None, *, secure: bool = False) -> str:
    """A threat model's guarantee in a cell: "**no DP**" first, or the headline with threat
    model A's composed (eps, delta), each marked "no meaningful protection" above eps 10, and,
    with secure aggregation (``secure``), B's per-parameter eps beside its composed one
    (``mechanisms/protection.py``)."""
    if not isinstance(entry, Mapping):
        return "—"
    headline = str(entry.get("headline", ""))
    if entry.get("dp") is not True:
        cell = f"**no DP** {headline.removeprefix('no DP').strip()}".strip()
        pu = entry.get("pair_joint", {}).get("per_update") if key == "B" else None
        if isinstance(pu, Mapping) and pu.get("delta_lower_bound") is not None:
            cell += f"; one update: δ ≥ {_num(pu['delta_lower_bound'])} for every eps"
        return cell
    parts = [headline]
    for label, part in (("update", "per_update"), ("run", "all_rounds")):
        block = entry.get(part)
        if key == "A" and isinstance(block, Mapping) and (label == "run" or block.get("k") != 1):
            eps, delta = block.get("eps"), block.get("delta")
            words = protection(float(eps)) if eps is not None else ""
            parts.append(
                f"{label} "
                + ("—" if eps is None else f"({_num(eps)}, {_num(delta)})")
                + (f" {words}" if words else "")
            )
    pp = entry.get("per_parameter") if key == "B" and secure else None
    if isinstance(pp, Mapping) and pp.get("eps") is not None:
        ep = None if eps_p is None else float(eps_p)
        parts.append(f"per parameter {per_parameter_text(float(pp['eps']), ep)}")
    return "; ".join(parts)


def privacy_section(groups: Sequence[GroupResult], keys: Sequence[str]) -> str:
    """The privacy of every setting, one column per threat model, from the report the ServerApp
    wrote into ``summary.json`` (read by :func:`experiments.results.privacy_view`)."""
    rows: list[list[str]] = []
    notes: dict[str, None] = {}
    words: dict[str, list[str]] = {}
    secure_any = False
    for g in groups:
        run = next((r for r in g.runs if r.summary.get("privacy")), None)
        report = rs.privacy_view(run.summary) if run is not None else None
        label = group_label(g.setting, keys)
        if not isinstance(report, Mapping) or report.get("error"):
            why = f"error: {report['error']}" if report else "no privacy report in summary.json"
            rows.append([label, _num(report.get("eps_p")) if report else "—", why, "", "", ""])
            continue
        mech = str(report.get("mechanism", "?"))
        notes.update(dict.fromkeys(f"{mech}: {note}" for note in report.get("notes", []) or []))
        tm = report.get("threat_models")
        tm = tm if isinstance(tm, Mapping) else {}
        # each entry's own name (B's, with secure aggregation: the server sees only the sum)
        said = [(k, str(e.get("name") or n)) for k, n in THREAT_MODELS.items()
                if isinstance(e := tm.get(k), Mapping)]  # fmt: skip
        secure_any = secure_any or bool(report.get("secure_aggregation"))
        if mech not in words:  # the first setting of each mechanism
            words[mech] = [f"- **{mech}**" + (f" ({label}):" if label != mech else ":")]
            words[mech] += [f"  - {k}, {n}: {tm[k].get('guarantee', '')}" for k, n in said]
        eps_p = _num(report["eps_p"]) if report.get("eps_p") is not None else "— (no DP)"
        sa = bool(report.get("secure_aggregation"))
        cells = [
            _threat_model_cell(k, tm.get(k), report.get("eps_p"), secure=sa) for k in THREAT_MODELS
        ]
        rows.append([label, eps_p, *cells])
    head = ["setting", "eps_p"] + [f"{k}: {n}" for k, n in THREAT_MODELS.items()]
    if secure_any:
        head[3] = f"B: {THREAT_MODELS['B']} (only the sum with SecAgg+)"
    lines = [rs.TEXTS["privacy-intro"], "", table(head, rows)]
    if words:
        lines += ["", "The guarantees in words (first setting of each mechanism):", ""]
        lines += [line for block in words.values() for line in block]
    if notes:
        lines += ["", "Notes from the accountant:", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines)


def server_scaling(secure: Sequence[GroupResult]) -> tuple[str, str]:
    """The guarantees against the sum-seeing server at n = 10, 100, 1,000 clients
    (:func:`corbin_fl.experiments.server_table.server_table`, one call per gamma of the settings
    with an independent share) at the settings of the ``secure`` groups' runs (eps_p, m,
    rounds, delta, d): its text and its table."""
    s, report = secure[0].setting, rs.privacy_view(secure[0].runs[0].summary) or {}
    kw: dict[str, Any] = {"eps_p": float(s["epsilon"]), "m": int(report["m"])}
    kw |= {"rounds": int(report["rounds"])}
    kw |= {"delta": float(s["delta"]), "d": int(s["d"])}
    shared = [g for g in secure if plots.independent_share(g.setting.get("mechanism"))]
    gammas = sorted({float(g.setting["gamma"]) for g in shared}) or [RunConfig().gamma]
    rows = {(r["mechanism"], r["n"]): r for gm in gammas for r in st.server_table(gamma=gm, **kw)}
    table = st.format_table(sorted(rows.values(), key=lambda r: r["n"]))
    text = rs.TEXTS["server-scaling"].format(**kw, gammas=", ".join(f"{g:g}" for g in gammas))
    return text, f"```\n{table}\n```"


DISCUSSION_FILE = "discussion.md"
"""Hand-written analysis next to ``report.md`` (why a target is missed, what a figure shows):
embedded in the report, never overwritten by it."""

_RESULT_COLUMNS: tuple[tuple[str, Callable[[GroupResult], str]], ...] = (
    ("λ (val)", lambda g: f"{g.global_lr:g}"),
    ("test acc @ val-selected round", lambda g: g.test.fmt()),
    ("final-round test acc", lambda g: g.final_test.fmt()),
    ("val acc @ checkpoint", lambda g: g.val.fmt()),
    ("checkpoint round", lambda g: g.selected_round.fmt(scale=1.0, digits=1)),
    ("seeds", lambda g: str(g.test.n)),
    ("eps_p", lambda g: _num(g.privacy("eps_p"))),
    ("uplink MB / run", lambda g: _amount(g.uplink_bytes.mean / 1e6) if g.uplink_bytes.n else "—"),
    ("uplink bits / parameter", lambda g: _num(plots.uplink_bits(g), 4) if g.runs else "—"),
    ("s / run", lambda g: _amount(g.seconds.mean)),
)
"""The results table's columns after ``setting``: header and cell of a group."""


_GROUP_FIGURES = {
    "accuracy-vs-round": plots.accuracy_vs_round_figure,
    "accuracy-bar": plots.accuracy_bar_figure,
    "accuracy-vs-bits": plots.accuracy_vs_bits_figure,
    "accuracy-vs-server-eps": plots.accuracy_vs_server_eps_figure,
}


def against_table(groups: Sequence[GroupResult], keys: Sequence[str], key: str) -> list[str]:
    """The test accuracy at the validation-selected round (mean ± std over seeds) with one row
    per setting of the other ``keys`` and one column per value of ``key`` (the paper's table
    against eps_p); the settings that do not read ``key`` (FedAvg's eps_p) on a line below.
    Empty unless ``key`` varies over two values or more."""
    reading = [g for g in groups if key in g.setting and rs.reads(key, g.setting)]
    columns = sorted({g.setting[key] for g in reading}, key=lambda v: (str(type(v)), v))
    if key not in keys or len(columns) < 2:
        return []
    others = [k for k in keys if k != key]
    rows: dict[str, dict[RunValue, str]] = {}
    for g in reading:
        rows.setdefault(group_label(g.setting, others), {})[g.setting[key]] = g.test.fmt()
    head = ["setting", *(f"{key}={v:g}" if isinstance(v, float) else f"{key}={v}" for v in columns)]
    body = [[label, *(cells.get(v, "—") for v in columns)] for label, cells in rows.items()]
    lines = [f"### Test accuracy against {key} (at the validation-selected round)", ""]
    lines += [table(head, body), ""]
    if rest := [g for g in groups if all(g is not r for r in reading)]:
        lines += [
            f"Not reading {key}: "
            + "; ".join(f"{group_label(g.setting, others)} {g.test.fmt()}" for g in rest)
            + ".",
            "",
        ]
    return lines


def lambda_text(spec: ExperimentSpec) -> str:
    """The lambda grid, and with ``lambda-seeds`` the seeds that choose and those that run only
    at the chosen lambda (the report's Setup)."""
    own = [f"{grid_name(i)}: {list(lams)}" for i, lams in enumerate(spec.grid_lambdas) if lams]
    if spec.lambda_from is not None:
        return borrowed_text(spec, own)
    text = str(list(spec.lambda_grid)) + (f" (its own: {'; '.join(own)})" if own else "")
    if not spec.confirmation_seeds:
        return text
    return (
        f"{text}, chosen on {rs.seeds_text(spec.selection_seeds)} alone; "
        f"{rs.seeds_text(spec.confirmation_seeds)} ran only at each setting's chosen lambda"
    )


def borrowed_text(spec: ExperimentSpec, own: Sequence[str]) -> str:
    """The Setup's lambda line of a spec with ``[lambda-from]``: the grids that choose (their
    own candidates) and those that take their counterparts' choice."""
    borrow = spec.lambda_from
    assert borrow is not None
    grids = [grid_name(i) for i in range(1 + len(spec.extra_grids)) if spec.borrows(i)]
    renamed = ", ".join(f"{mine} as {theirs}" for mine, theirs in borrow.mechanism.items())
    ignored = ", ".join(f"`{k}`" for k in borrow.ignore)
    text = (
        f"{', '.join(grids)}: not chosen here, each setting runs at the lambda chosen for its "
        f"counterpart in `{borrow.path}` (by that spec's rule and seeds), the setting there "
        "that agrees with it on every key"
        + (f" but {ignored}" if ignored else "")
        + (f", the mechanism {renamed}" if renamed else "")
    )
    return text + (f"; chosen here: {'; '.join(own)}" if own else "")


def lambda_selection(
    spec: ExperimentSpec, groups: Sequence[GroupResult], keys: Sequence[str], finished: set[str]
) -> list[str]:
    """The "Lambda selection" table (each lambda's mean checkpoint validation accuracy, the
    chosen one ticked) of a spec with more than one lambda, and below it the settings whose
    choice is not final (a lambda-choosing run of theirs is not in ``finished``) and those
    whose final choice is an end of their grid (:func:`results.grid_end_text`)."""
    if len(spec.all_lambdas) <= 1:
        return []
    runs = {r.run_id: r for r in sweep.expand_runs(spec)}
    borrowed = {rid for rid, r in runs.items() if r.counterpart is not None}
    choosing = sweep.choosing_runs(runs.values())

    def cell(g: GroupResult, lam: float) -> str:
        mean = g.lambda_scores.get(float(lam), Stat(math.nan, math.nan, 0)).mean
        text = f"{100 * mean:.2f}" if math.isfinite(mean) else "—"
        if not math.isclose(lam, g.global_lr):
            return text
        return f"{text} ✓" + (" (its counterpart's)" if g.runs[0].run_id in borrowed else "")

    lams = spec.all_lambdas
    head = ["setting", *(f"λ={lam:g}" for lam in lams)]
    rows = [[group_label(g.setting, keys), *(cell(g, lam) for lam in lams)] for g in groups]
    over = f", {rs.seeds_text(spec.selection_seeds)}" if spec.confirmation_seeds else ""
    lines = [f"### Lambda selection (mean validation accuracy at the checkpoints{over})", ""]
    lines += [table(head, rows), ""]
    open_, ends = [], []
    for g in groups:
        own = runs.get(g.runs[0].run_id)
        mine = choosing.get(own.setting_key, []) if own is not None else []
        label, grid = group_label(g.setting, keys), [float(r.run_config["global-lr"]) for r in mine]
        if any(r.run_id not in finished for r in mine):
            open_.append(label)
        elif text := rs.grid_end_text(label, g.global_lr, grid):
            ends.append(text)
    if open_:
        lines += ["Not final (a lambda-choosing run not finished):", ""]
        lines += [*(f"- {label}" for label in open_), ""]
    if ends:
        lines += ["Chosen at an end of the grid:", ""]
        lines += [*(f"- {text}" for text in ends), ""]
    return lines


def finalize_federated(
    spec: ExperimentSpec,
    base: Path,
    results: Sequence[rs.RunResult],
    command: str,
    expected: int,
    failures: Mapping[str, str] | None = None,
) -> tuple[list[Target], Path]:
    """Write a federated experiment's ``runs.csv``, ``groups.csv``, figures and ``report.md`` in
    ``base`` from its finished ``results`` (of ``expected`` runs) and return its target checks
    and report; ``failures`` maps run ids to why they failed in this invocation."""
    groups = rs.group_results(results, spec.lambda_seeds)
    keys = rs.varying_keys(results)
    rs.write_table(base / "runs.csv", rs.runs_table(results, groups))
    rs.write_table(base / "groups.csv", rs.groups_table(groups, keys))
    figures: dict[str, Path] = {}
    for name in spec.figures:
        if name in _GROUP_FIGURES:
            fig = _GROUP_FIGURES[name](groups, keys, title=spec.description or spec.name)
        elif (x_key := plots.X_KEY_OF_FIGURE[name]) in keys:
            fig = plots.accuracy_vs_figure(groups, x_key, keys, title=spec.description or spec.name)
        else:
            logger.warning("figure %s skipped: %s does not vary in this experiment", name, x_key)
            continue
        figures[name] = plots.save(fig, base / "figures" / f"{name}.png")
    done = len(results)
    status = "complete" if done == expected else f"INCOMPLETE ({done}/{expected} runs)"
    config = [f"`{k}={v}`" for k, v in sorted(spec.base.items())]
    config += [f"`clients={spec.clients}`"] if spec.clients is not None else []
    setup = rs.TEXTS["setup"].format(
        done=done, expected=expected, status=status, seeds=list(spec.seeds), base=", ".join(config),
        lambdas=lambda_text(spec), swept=", ".join(keys) or "(nothing)",
    )  # fmt: skip
    rows = [[group_label(g.setting, keys), *(f(g) for _, f in _RESULT_COLUMNS)] for g in groups]
    lines = [
        *header(spec, command),
        *section("Setup", setup),
        *section("Model selection", rs.SELECTION_RULE),
        *section(
            "Results",
            rs.TEXTS["results-intro"],
            table(["setting", *(head for head, _ in _RESULT_COLUMNS)], rows),
        ),
    ]
    lines += against_table(groups, keys, "epsilon")
    lines += lambda_selection(spec, groups, keys, {r.run_id for r in results})
    targets = federated_targets(groups, spec.targets)
    lines += figures_section(figures, base) + section("Privacy", privacy_section(groups, keys))
    if secure := [g for g in groups if g.setting.get("secure-aggregation") is True]:
        lines += section("Against the server at n = 10, 100, 1,000", *server_scaling(secure))
    if targets and spec.own_targets is None:  # experiments/targets.toml's, the quick scale's
        lines += section("Quick-scale targets", TARGET_RULE, targets_table(targets))
    elif targets:  # the spec's own (`target = []` checks none)
        lines += section("Accuracy targets", TARGET_RULE, targets_table(targets, scale=""))
    if (discussion := base / DISCUSSION_FILE).is_file():
        why = rs.TEXTS["discussion-note"].format(file=DISCUSSION_FILE)
        lines += section("Discussion", why, discussion.read_text(encoding="utf-8").strip())
    if failures:
        failed = [f"- `{rid}`: {r.splitlines()[0] if r else ''}" for rid, r in failures.items()]
        lines += section("Failed runs (redone on the next invocation)", "\n".join(failed))
    lines += section("Files", rs.TEXTS["files"])
    atomic_write_text(path := base / "report.md", "\n".join(lines))
    return targets, path

"""The paper's table on Fashion-MNIST in one place: every mechanism against eps_p, from the
finished runs of the CPU specs (``experiments/paper/fashion-cpu.toml``: CorBin-FL, LDP-FL, PBM
and FedAvg on 3 seeds; ``fashion-cpu-rest.toml``: the other mechanisms and secure aggregation,
one seed), each setting at the lambda its spec chose (each spec's report says how), beside the
authors' MNIST figures (``texts.md``, ``paper-authors``).

A cell is the mean test accuracy at the validation-selected round over the setting's seeds,
``± t_{0.975, n-1} s / sqrt(n)`` (the 95% confidence half-width of the mean, Student's t,
:func:`scipy.stats.t.ppf`) when ``n >= 2``; each spec's ``report.md`` has the standard
deviations, the lambda selection, the curves and the privacy of every setting.

``python -m corbin_fl.experiments.paper_table [--results docs/results/paper]`` writes
``<results>/table.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from corbin_fl import registry
from corbin_fl.experiments import cli, plots, sweep
from corbin_fl.experiments import results as rs
from corbin_fl.experiments.report import section, table
from corbin_fl.experiments.spec import ExperimentSpec, load_spec
from corbin_fl.fsio import atomic_write_text
from corbin_fl.mechanisms.accounting import THREAT_MODELS

REPO = Path(__file__).resolve().parents[1]
SPECS = (
    REPO / "experiments" / "paper" / "fashion-cpu.toml",
    REPO / "experiments" / "paper" / "fashion-cpu-rest.toml",
)
EPSILONS = (0.1, 0.3, 1.0, 3.0)
"""The paper's eps_p (Sec. V), the table's columns."""
PRIVACY_AT = 1.0
"""The eps_p whose guarantees the privacy table shows (each report has every eps_p)."""
TABLE_FILE = "table.md"


@dataclass(frozen=True)
class Row:
    """One line of the table: a mechanism, with or without secure aggregation, and its
    settings' groups by eps_p (``None``: no DP), from the first spec that runs it;
    ``provisional``: the eps_p whose lambda is not final (a lambda-choosing run not done)."""

    mechanism: str
    secure: bool
    spec: ExperimentSpec
    groups: Mapping[float | None, rs.GroupResult]
    provisional: frozenset[float | None] = frozenset()

    @property
    def label(self) -> str:
        title = registry.get(self.mechanism).title or self.mechanism
        return f"{title} + SecAgg+" if self.secure else title


def half_width(stat: rs.Stat, confidence: float = 0.95) -> float:
    """``t_{(1 + confidence) / 2, n - 1} s / sqrt(n)``: the half-width of the Student-t
    confidence interval of the mean; NaN for fewer than two values."""
    if stat.n < 2:
        return math.nan
    return float(stats.t.ppf((1 + confidence) / 2, stat.n - 1) * stat.std / math.sqrt(stat.n))


def cell(g: rs.GroupResult | None, provisional: bool = False) -> str:
    """``mean ± half-width (n=N), λ L`` in percent (``λ L?`` while the choice is not final);
    ``—`` for a setting with no finished run."""
    if g is None or g.test.n == 0:
        return "—"
    hw = half_width(g.test)
    mean = f"{100 * g.test.mean:.2f}"
    spread = f" ± {100 * hw:.2f}" if math.isfinite(hw) else ""
    return f"{mean}{spread} (n={g.test.n}), λ {g.global_lr:g}{'?' if provisional else ''}"


def _eps_of(setting: Mapping[str, rs.RunValue]) -> float | None:
    """The setting's eps_p, None without DP (its runs do not read ``epsilon``)."""
    return float(setting["epsilon"]) if rs.reads("epsilon", setting) else None


def _key(config: Mapping[str, rs.RunValue]) -> tuple[str, bool]:
    return str(config["mechanism"]), config.get("secure-aggregation") is True


Plans = Mapping[str, Sequence[tuple[sweep.Run, sweep.RunState]]]
"""Each spec's :func:`corbin_fl.experiments.cli.plan`, by spec name."""


def plans(specs: Sequence[ExperimentSpec], results_root: Path) -> Plans:
    """Each spec's plan over the pool under ``results_root`` (read once per table)."""
    return {spec.name: cli.plan(spec, results_root) for spec in specs}


def rows(
    specs: Sequence[ExperimentSpec], results_root: Path, planned: Plans | None = None
) -> list[Row]:
    """A row per mechanism and secure-aggregation flag of ``specs``' settings (finished or
    not; those with DP first, then without, then with secure aggregation, each in registration
    order), each holding its groups at their chosen lambda. A setting that two specs share
    (the same mechanism, flag and eps_p) is the first spec's."""
    found: dict[tuple[str, bool], tuple[ExperimentSpec, dict[float | None, rs.GroupResult]]] = {}
    pending: dict[tuple[str, bool], set[float | None]] = {}
    planned = plans(specs, results_root) if planned is None else planned
    for spec in specs:
        mine = planned[spec.name]
        for run, _ in mine:
            found.setdefault(_key(run.config), (spec, {}))
        open_keys = {r.setting_key for r, st in mine if r.selects and st is not sweep.RunState.DONE}
        setting_of = {r.run_id: r.setting_key for r, _ in mine}
        finished = cli.load_finished(spec, results_root, mine)
        for g in rs.group_results(finished, spec.lambda_seeds):
            owner, groups = found[key := _key(g.setting)]
            if owner is spec:
                groups[eps := _eps_of(g.setting)] = g
                if setting_of[g.runs[0].run_id] in open_keys:
                    pending.setdefault(key, set()).add(eps)
    order = list(registry.REGISTRY)

    def rank(key: tuple[str, bool]) -> tuple[bool, bool, int]:  # DP first, SecAgg+ last
        no_dp = not rs.reads("epsilon", {"mechanism": key[0]})
        return key[1], no_dp, order.index(key[0])

    return [
        Row(*key, *found[key], frozenset(pending.get(key, ()))) for key in sorted(found, key=rank)
    ]


def accuracy_table(table_rows: Sequence[Row]) -> str:
    """Mechanisms against eps_p (the paper's :data:`EPSILONS` and any other a row has), and
    FedAvg's no-DP column, with the uplink bits per parameter each row's runs measured."""
    found = {e for row in table_rows for e in row.groups if e is not None}
    columns = sorted(found | set(EPSILONS))
    head = ["mechanism", *(f"eps_p = {e:g}" for e in columns), "no DP", "bits / parameter"]
    body = []
    for row in table_rows:
        cells = [cell(row.groups.get(e), e in row.provisional) for e in (*columns, None)]
        bits = sorted({f"{plots.uplink_bits(g):.3f}" for g in row.groups.values() if g.runs})
        body.append([row.label, *cells, " / ".join(bits) or "—"])
    return table(head, body)


def privacy_table(table_rows: Sequence[Row]) -> str:
    """Each row's guarantee per threat model at eps_p = :data:`PRIVACY_AT` (the headline of
    the ServerApp's report in ``summary.json``), ``—`` before that setting has a finished run."""
    head = ["mechanism", *(f"{k}: {name}" for k, name in THREAT_MODELS.items())]
    if any(row.secure for row in table_rows):  # there the server sees only the sum
        head[2] += " (only the sum in the SecAgg+ rows)"
    body = []
    for row in table_rows:
        g = row.groups.get(PRIVACY_AT, row.groups.get(None))
        report = rs.privacy_view(g.runs[0].summary) if g is not None and g.runs else None
        tm = report.get("threat_models", {}) if isinstance(report, Mapping) else {}
        body.append([row.label, *(str(tm.get(k, {}).get("headline", "—")) for k in THREAT_MODELS)])
    return table(head, body)


def progress(specs: Sequence[ExperimentSpec], planned: Plans) -> str:
    """How many of each spec's runs have finished (``corbin-fl experiment plan``'s count)."""
    parts = []
    for spec in specs:
        mine = planned[spec.name]
        done = sum(s is sweep.RunState.DONE for _, s in mine)
        parts.append(f"`{spec.name}` {done} of {done + len(cli.to_do(mine))} runs")
    return "; ".join(parts)


def _shown(path: Path | None) -> str:
    """A spec's path relative to the repository when it is in it."""
    if path is None:
        return "(inline)"
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def build(specs: Sequence[ExperimentSpec], results_root: Path) -> str:
    """The text of ``table.md``."""
    planned = plans(specs, results_root)
    table_rows = rows(specs, results_root, planned)
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    sources = ", ".join(f"`{_shown(s.source)}` (report: `{s.name}/report.md`)" for s in specs)
    lines = [
        "# The paper's table on Fashion-MNIST (CPU cut)",
        "",
        f"- from: {sources}",
        f"- finished: {progress(specs, planned)}",
        f"- generated: {now}",
        f"- regenerate: `python -m corbin_fl.experiments.paper_table --results {results_root}`",
        "",
        *section(
            "Test accuracy against eps_p", rs.TEXTS["paper-table"], accuracy_table(table_rows)
        ),
        *section(
            f"The guarantee per threat model at eps_p = {PRIVACY_AT:g}",
            rs.TEXTS["paper-privacy"],
            privacy_table(table_rows),
        ),
        *section("The authors' MNIST figures", rs.TEXTS["paper-authors"]),
    ]
    return "\n".join(lines)


def write(results_root: Path, spec_paths: Sequence[Path] = SPECS) -> Path:
    """Write ``<results_root>/table.md`` from the finished runs of ``spec_paths``."""
    specs = [load_spec(p) for p in spec_paths]
    atomic_write_text(path := Path(results_root) / TABLE_FILE, build(specs, Path(results_root)))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m corbin_fl.experiments.paper_table``: write the table; print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results/paper"))
    parser.add_argument(
        "--specs", type=Path, nargs="+", default=list(SPECS), help="(this checkout's CPU specs)"
    )
    args = parser.parse_args(argv)
    print(write(args.results, args.specs))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

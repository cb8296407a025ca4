"""Finished runs -> model selection on validation data only (:data:`SELECTION_RULE`, stated in
every report; :func:`select_round` says how it differs from the ServerApp's ``best_val_round``)
-> the statistics over seeds, lambda selection and curves as pandas group-bys
(:func:`group_results`) -> ``runs.csv`` and ``groups.csv``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.deploy.follow import read_jsonl
from corbin_fl.experiments import sweep
from corbin_fl.experiments.spec import CLIENTS_KEY, RunValue
from corbin_fl.fsio import atomic_write_text
from corbin_fl.registry import REGISTRY

logger = logging.getLogger(__name__)

_SECTIONS = re.split(
    r"^## (\S+)$", Path(__file__).with_name("texts.md").read_text("utf-8"), flags=re.M
)
TEXTS = {key: text.strip() for key, text in zip(_SECTIONS[1::2], _SECTIONS[2::2], strict=True)}
"""The fixed paragraphs of the reports, from the ``## <key>`` sections of ``texts.md``."""
SELECTION_RULE = TEXTS["selection-rule"]

RUNS_CSV_COLUMNS: tuple[str, ...] = (
    *("run_id", "mechanism", "epsilon", "d", "dropout", "clients", "gamma", "seed", "global_lr"),
    *("lambda_selected", "test_accuracy", "val_accuracy", "selected_round", "selected_by"),
    *("final_test_accuracy", "final_val_accuracy", "num_rounds", "eps_p", "eps_update"),
    *("delta_update", "eps_run", "delta_run", "pair_eps_update", "pair_delta_lower_bound"),
    *("server_eps_parameter", "uplink_bytes", "seconds"),
)
"""Fixed columns of ``runs.csv``; other swept run-config keys are appended after them."""

_COLUMN_OF_KEY = {"dropout-prob": "dropout", CLIENTS_KEY: "clients"}


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (``ddof = 1``) of ``n`` values; std is NaN if n < 2;
    ``values``: the values themselves (empty for a statistic given by its summary alone).
    The group-bys aggregate with :meth:`of` (pandas' Series mean and std, numpy's sums), not
    with groupby's own mean and std, whose sums differ in the last bits."""

    mean: float
    std: float
    n: int
    values: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        """Statistics of the finite ``values`` (NaN, inf and None are skipped)."""
        s = pd.Series([v for v in values if v is not None], dtype=float)
        s = s[np.isfinite(s)]
        return cls(float(s.mean()), float(s.std(ddof=1)), int(s.size), tuple(s.tolist()))

    def sample(self) -> np.ndarray:
        """The ``n`` values, or, for a statistic given by its summary alone, ``n`` values with
        its mean and sample std (evenly spaced): a two-sample t test reads a sample only
        through its mean, variance and size."""
        if len(self.values) == self.n:
            return np.asarray(self.values, dtype=float)
        z = np.arange(self.n) - (self.n - 1) / 2
        return self.mean + self.std * z / z.std(ddof=1) if self.n > 1 else np.full(1, self.mean)

    def fmt(self, scale: float = 100.0, digits: int = 2) -> str:
        """``"mean ± std"`` scaled (accuracies as percent by default); ``"—"`` if empty."""
        if self.n == 0:
            return "—"
        mean = f"{self.mean * scale:.{digits}f}"
        return f"{mean} (n=1)" if self.n < 2 else f"{mean} ± {self.std * scale:.{digits}f}"

    @property
    def spread(self) -> float:
        """The error bar: the std, 0 for fewer than two values."""
        return self.std if self.n > 1 else 0.0


@dataclass(frozen=True)
class Selection:
    """The validation-selected checkpoint of one run (``selected_by``: the metric that picks it)."""

    round: int
    val_accuracy: float
    test_accuracy: float
    selected_by: str = "val_accuracy"


def finite(value: Any, default: float | None = None) -> float | None:
    """``value`` as a float if it is a finite number (not a bool), else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _or_nan(value: Any) -> float:
    return finite(value, math.nan)  # type: ignore[return-value]


def select_round(rows: Sequence[Mapping[str, Any]]) -> Selection:
    """The checkpoint of a run from its ``metrics.jsonl`` rows: ``argmax_t val_accuracy[t]``
    (the earliest on ties) and ``test_accuracy[t]``; ``ValueError`` if no row has a finite
    ``val_accuracy`` or the chosen row no integer ``round``.

    The ServerApp's ``best_val_round`` in ``summary.json`` (``server.strategy``'s checkpoint
    rule, strict improvement, so also the earliest on ties) starts from round 0, the initial
    model evaluated before training; the rows, and so this choice, are the trained rounds 1..T.
    The two differ only when no trained round beats the initial model (no committed run), so
    the experiments compute the round here rather than read the server's.
    """
    vals = pd.Series([_or_nan(row.get("val_accuracy")) for row in rows], dtype=float)
    if vals.isna().all():
        raise ValueError("no row has a finite val_accuracy")
    best = rows[int(vals.idxmax())]  # the first maximum, NaN skipped
    if not isinstance(rnd := best.get("round"), int) or isinstance(rnd, bool):
        raise ValueError(f"metrics row has no integer 'round': {dict(best)!r}")
    return Selection(rnd, float(vals.max()), _or_nan(best.get("test_accuracy")))


def privacy_view(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """``summary["privacy"]`` (one entry per threat model, or an ``error``), or ``None``
    (logged) if it has neither."""
    if not isinstance(raw := summary.get("privacy"), Mapping):
        return None
    if "threat_models" in raw or "error" in raw:
        return dict(raw)
    logger.warning("privacy report without threat_models (not read): %s", dict(raw))
    return None


_PRIVACY_FIELDS = {  # field: (its path in the report, the path that must be true to read it)
    "eps_p": ("eps_p", ""),
    "eps_update": ("threat_models.A.per_update.eps", "threat_models.A.dp"),
    "delta_update": ("threat_models.A.per_update.delta", "threat_models.A.dp"),
    "eps_run": ("threat_models.A.all_rounds.eps", "threat_models.A.dp"),
    "delta_run": ("threat_models.A.all_rounds.delta", "threat_models.A.dp"),
    "server_eps_run": ("threat_models.B.all_rounds.eps", "threat_models.B.dp"),
    "pair_eps_update": ("threat_models.B.pair_joint.per_update.eps", ""),
    "pair_delta_lower_bound": ("threat_models.B.pair_joint.per_update.delta_lower_bound", ""),
    "server_eps_parameter": ("threat_models.B.per_parameter.eps", "threat_models.B.dp"),
}


def privacy_fields(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """A run's privacy numbers (``None`` where its report has none): ``eps_p``, threat model
    A's ``eps``/``delta`` of one update and of the run, B's ``eps`` of the run (where it gives
    DP) and per parameter beside it, and B's pair-joint view of one update. Nothing from the
    paper's eq. (5) (Theorem 3), which is not a valid bound (``theory.eq5_as_printed``)."""
    report = privacy_view(summary)

    def at(path: str) -> Any:
        obj: Any = report
        for key in path.split(".") if path else ():
            obj = obj.get(key) if isinstance(obj, Mapping) else None
        return obj

    return {
        name: finite(at(path)) if report is not None and (not when or at(when) is True) else None
        for name, (path, when) in _PRIVACY_FIELDS.items()
    }


@dataclass(frozen=True)
class RunResult:
    """A finished run, read back from ``runs/<run-id>/``. Its ``setting`` is the result config
    (the record's ``"config"``) without ``seed``/``global-lr``, plus ``clients``: runs with one
    setting differ only in seed and lambda."""

    run_id: str
    setting: Mapping[str, RunValue]
    seed: int
    global_lr: float
    rows: tuple[Mapping[str, Any], ...]
    summary: Mapping[str, Any]
    selection: Selection
    final_test_accuracy: float
    final_val_accuracy: float
    uplink_bytes: float
    seconds: float
    privacy: Mapping[str, float | None]

    @property
    def setting_key(self) -> str:
        """Canonical JSON of the setting (the group key)."""
        return sweep.canonical_json(dict(self.setting))


def load_run(run_dir: Path) -> RunResult:
    """Read a finished run folder (``summary.json`` with the runner record, ``metrics.jsonl``);
    ``ValueError`` if it is not a complete run."""
    try:
        summary = json.loads((Path(run_dir) / sweep.SUMMARY_FILE).read_text(encoding="utf-8"))
        record = summary[sweep.RUN_RECORD_KEY]
        run_config = dict(record["run_config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{run_dir}: not a finished run ({exc})") from exc
    if record.get("complete") is not True:
        raise ValueError(f"{run_dir}: the run record is not complete")
    if not (rows := read_jsonl(Path(run_dir) / sweep.METRICS_FILE)):
        raise ValueError(f"{run_dir}: {sweep.METRICS_FILE} is empty")
    if not isinstance(config := record.get("config"), Mapping):
        raise ValueError(f"{run_dir}: the run record has no result config")
    try:
        AppConfig.from_flower(config)
    except ConfigError as exc:
        raise ValueError(f"{run_dir}: the recorded result config is not valid ({exc})") from exc
    setting = {k: v for k, v in config.items() if k not in ("seed", "global-lr")}
    setting.setdefault("secure-aggregation", False)  # a run without it has no such key
    if record.get("clients") is not None:
        setting[CLIENTS_KEY] = int(record["clients"])
    uplink = [r.get("bytes_up") for r in rows]  # a number, or a per-stage dict with a total
    uplink = [b.get("total") if isinstance(b, Mapping) else b for b in uplink]
    return RunResult(
        run_id=str(record["run_id"]), setting=setting, seed=int(run_config["seed"]),
        global_lr=float(run_config["global-lr"]), rows=tuple(rows), summary=summary,
        selection=select_round(rows), final_test_accuracy=_or_nan(rows[-1].get("test_accuracy")),
        final_val_accuracy=_or_nan(rows[-1].get("val_accuracy")),
        uplink_bytes=sum(finite(b) or 0.0 for b in uplink),
        seconds=float(record.get("seconds", math.nan)), privacy=privacy_fields(summary),
    )  # fmt: skip


_OVER_SEEDS: dict[str, Callable[[RunResult], float]] = {  # a GroupResult Stat: a run's value
    "test": lambda r: r.selection.test_accuracy,
    "final_test": lambda r: r.final_test_accuracy,
    "val": lambda r: r.selection.val_accuracy,
    "selected_round": lambda r: r.selection.round,
    "uplink_bytes": lambda r: r.uplink_bytes,
    "seconds": lambda r: r.seconds,
}


def runs_frame(results: Sequence[RunResult]) -> pd.DataFrame:
    """One row per run: ``setting`` (its key), ``global_lr``, ``seed``, ``run`` (the
    :class:`RunResult`) and the values of :data:`_OVER_SEEDS`, in the order of ``results``."""
    return pd.DataFrame(
        [
            {"setting": r.setting_key, "global_lr": r.global_lr, "seed": r.seed, "run": r}
            | {name: value(r) for name, value in _OVER_SEEDS.items()}
            for r in results
        ],
        columns=["setting", "global_lr", "seed", "run", *_OVER_SEEDS],
    )


@dataclass(frozen=True)
class GroupResult:
    """One setting at its chosen lambda ``global_lr``: its runs (seeds) at that lambda, per
    lambda the :class:`Stat` of the checkpoint validation accuracy over seeds, and the
    :class:`Stat` over its runs of the test and validation accuracy and the round of the
    checkpoint, the final-round test accuracy, a run's uplink bytes and wall seconds."""

    setting: Mapping[str, RunValue]
    global_lr: float
    lambda_scores: Mapping[float, Stat]
    runs: tuple[RunResult, ...]
    test: Stat
    final_test: Stat
    val: Stat
    selected_round: Stat
    uplink_bytes: Stat
    seconds: Stat

    def privacy(self, key: str) -> float | None:
        """A privacy number of the setting (the same for every seed; the first is returned)."""
        return next((v for r in self.runs if (v := r.privacy.get(key)) is not None), None)

    def curve(self, metric: str = "test_accuracy") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-round ``(rounds, mean, std)`` of ``metric`` over the seeds (std 0 if one seed)."""
        points = [(row.get("round"), finite(row.get(metric))) for r in self.runs for row in r.rows]
        points = [(t, v) for t, v in points if isinstance(t, int) and v is not None]
        stats = pd.DataFrame(points, columns=["round", "v"]).groupby("round")["v"].agg(Stat.of)
        means, spreads = [s.mean for s in stats], [s.spread for s in stats]
        return stats.index.to_numpy(dtype=int), np.array(means), np.array(spreads)


def seeds_text(seeds: Sequence[int]) -> str:
    """``"seed 0"`` or ``"seeds 1, 2"``."""
    return f"seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}"


def choose_lambda(
    runs: Sequence[RunResult], seeds: Collection[int] | None = None
) -> tuple[float, dict[float, Stat]]:
    """The lambda of one setting's ``runs`` with the highest mean checkpoint validation accuracy
    over seeds (ties: the larger), and per lambda the :class:`Stat` of those accuracies; only
    the runs on ``seeds`` count when given (a spec's ``lambda-seeds``: its other seeds ran at
    the chosen lambda alone, and counting them would favour it). ``ValueError`` without runs."""
    if seeds is not None:
        runs = [r for r in runs if r.seed in seeds]
    if not runs:
        raise ValueError("no runs to choose lambda from")
    stats = runs_frame(runs).groupby("global_lr")["val"].agg(Stat.of)
    best = stats.map(lambda s: s.mean).iloc[::-1].idxmax()  # the larger lambda on ties
    return float(best), {float(lam): stat for lam, stat in stats.items()}


LAMBDA_MAX = 1.0
"""The largest global learning rate there is: paper eq. (6), ``w_g <- (1 - lambda) w_g +
lambda w_bar``, is a convex combination, and the run config takes ``global-lr`` in (0, 1]."""


def grid_end(chosen: float, grid: Collection[float]) -> str | None:
    """``"smallest"`` or ``"largest"`` when ``chosen`` is that end of a ``grid`` of two or
    more lambdas, else ``None``. A choice at an end says only that the best lambda may lie
    beyond it: validation accuracy has not been seen to fall on that side. Nothing lies above
    :data:`LAMBDA_MAX`, so a choice of 1 is at no end that a grid could extend."""
    lams = sorted({float(lam) for lam in grid})
    if len(lams) < 2:
        return None
    if math.isclose(chosen, lams[0]):
        return "smallest"
    top = math.isclose(chosen, lams[-1]) and not math.isclose(chosen, LAMBDA_MAX)
    return "largest" if top else None


def grid_end_text(label: str, chosen: float, grid: Collection[float]) -> str | None:
    """``<label>: lambda 0.03, the smallest of its grid [0.03, 0.1]: the best may lie below
    it`` (:func:`grid_end`); ``None`` for a choice inside its grid."""
    if (end := grid_end(chosen, grid)) is None:
        return None
    beyond = "below" if end == "smallest" else "above"
    values = ", ".join(f"{lam:g}" for lam in sorted({float(v) for v in grid}))
    where = f"the {end} of its grid [{values}]"
    return f"{label}: lambda {chosen:g}, {where}: the best may lie {beyond} it"


def group_results(
    results: Sequence[RunResult], selection_seeds: Collection[int] | None = None
) -> list[GroupResult]:
    """Group runs by setting, choose lambda per group (on ``selection_seeds`` only when given,
    :func:`choose_lambda`) and keep its runs at that lambda (by seed, every seed), with their
    statistics; groups in the order of their first run. A setting none of whose runs is on
    ``selection_seeds`` has no lambda yet and is left out."""
    out: list[GroupResult] = []
    for _, members in runs_frame(results).groupby("setting", sort=False):
        pool = members["run"].tolist()
        if selection_seeds is not None and not any(r.seed in selection_seeds for r in pool):
            continue
        lam, scores = choose_lambda(pool, selection_seeds)
        chosen = members[members["global_lr"] == lam].sort_values("seed", kind="stable")
        stats = chosen[list(_OVER_SEEDS)].agg(Stat.of)
        runs = tuple(chosen["run"])
        out.append(GroupResult(dict(runs[0].setting), lam, scores, runs, **stats.to_dict()))
    return out


def varying_keys(results: Sequence[RunResult]) -> tuple[str, ...]:
    """Setting keys with more than one value across ``results``, without ``min-clients`` when
    it always equals ``clients`` (as the sweep sets it)."""
    return varying_setting_keys([r.setting for r in results])


def varying_setting_keys(settings: Sequence[Mapping[str, RunValue]]) -> tuple[str, ...]:
    """Keys with more than one value across ``settings`` (the mechanism first, then by name),
    without ``min-clients`` when it always equals ``clients``."""
    seen: dict[str, set[str]] = {}
    for setting in settings:
        for key, value in setting.items():
            seen.setdefault(key, set()).add(sweep.canonical_json(value))
    same = all(s.get("min-clients") == s.get(CLIENTS_KEY) for s in settings)
    keys = [k for k, v in seen.items() if len(v) > 1 and not (same and k == "min-clients")]
    return tuple(sorted(keys, key=lambda k: (k != "mechanism", k)))


_DEFAULTS = AppConfig().result_config()
_MECHANISM_KEYS = frozenset().union(*(m.own_keys for m in REGISTRY.values()))


def inert(key: str, setting: Mapping[str, RunValue]) -> bool:
    """``key`` is read only by other mechanisms than the setting's (``pbm-trials`` in an
    ``ldpfl`` setting, ``gamma`` outside AugCorBin; ``Mechanism.own_keys``) and has its default
    value: its runs do not read it."""
    mechanism = REGISTRY.get(str(setting.get("mechanism", "")))
    return (
        key in _MECHANISM_KEYS
        and (mechanism is None or key not in mechanism.own_keys)
        and key in _DEFAULTS
        and sweep.canonical_json(setting.get(key)) == sweep.canonical_json(_DEFAULTS[key])
    )


def reads(key: str, setting: Mapping[str, RunValue]) -> bool:
    """Whether the setting's runs read ``key``: not :func:`inert`, and for ``epsilon`` a
    mechanism with some privacy (FedAvg's runs carry an epsilon that nothing reads)."""
    if inert(key, setting):
        return False
    mechanism = REGISTRY.get(str(setting.get("mechanism", "")))
    privacy = mechanism.privacy if mechanism is not None else None
    return key != "epsilon" or privacy is None or privacy.family != "none"


def group_label(setting: Mapping[str, RunValue], keys: Sequence[str]) -> str:
    """A label such as ``"corbin, epsilon=0.5"`` from the varying ``keys``, without a key of
    another mechanism at its default (:func:`inert`)."""
    values = {key: setting.get(key, "default") for key in keys if not inert(key, setting)}
    parts = [str(v) if k == "mechanism" else f"{k}={v}" for k, v in values.items()]
    return ", ".join(parts) if parts else str(setting.get("mechanism", "run"))


def write_table(path: Path, table: pd.DataFrame) -> None:
    """Write ``table`` as CSV (``DataFrame.to_csv``), atomically: floats as Python writes them
    (``repr``, every digit), NaN, inf and None empty, booleans ``true`` / ``false``."""
    cells = table.astype(object)
    cells = cells.mask(cells.isin([math.inf, -math.inf]))  # NaN: written empty
    cells = cells.map(lambda v: str(v).lower() if isinstance(v, bool) else v)
    atomic_write_text(path, cells.to_csv(index=False, lineterminator="\n", na_rep=""))


def runs_table(results: Sequence[RunResult], groups: Sequence[GroupResult]) -> pd.DataFrame:
    """``runs.csv``: one row per run (all lambdas), :data:`RUNS_CSV_COLUMNS` (a run's fields, its
    checkpoint's, its privacy numbers and setting) then the other varying setting keys."""
    chosen = {(g.global_lr, sweep.canonical_json(dict(g.setting))) for g in groups}
    extra = [k for k in varying_keys(results) if _COLUMN_OF_KEY.get(k, k) not in RUNS_CSV_COLUMNS]
    rows = [
        {_COLUMN_OF_KEY.get(k, k): v for k, v in r.setting.items()}
        | vars(r)
        | vars(r.selection)
        | dict(r.privacy)
        | {"selected_round": r.selection.round, "num_rounds": len(r.rows)}
        | {"lambda_selected": (r.global_lr, r.setting_key) in chosen}
        for r in results
    ]
    return pd.DataFrame(rows, columns=[*RUNS_CSV_COLUMNS, *extra], dtype=object)


def groups_table(groups: Sequence[GroupResult], keys: Sequence[str]) -> pd.DataFrame:
    """``groups.csv``: one row per setting at its chosen lambda (mean and std over seeds);
    ``keys`` (the varying setting keys) are its first columns."""
    rows = []
    for g in groups:
        row = {_COLUMN_OF_KEY.get(k, k): g.setting.get(k) for k in keys}
        row |= {"global_lr": g.global_lr, "seeds": g.test.n}
        for name, stat in (("test", g.test), ("final_test", g.final_test), ("val", g.val)):
            row |= {f"{name}_mean": stat.mean, f"{name}_std": stat.std}
        row |= {"selected_round_mean": g.selected_round.mean}
        row |= {k: g.privacy(k) for k in ("eps_update", "delta_update", "eps_run", "delta_run")}
        row |= {"uplink_bytes_mean": g.uplink_bytes.mean, "seconds_mean": g.seconds.mean}
        lam_means = {repr(lam): round(s.mean, 6) for lam, s in g.lambda_scores.items()}
        rows.append(row | {"lambda_val_means": sweep.canonical_json(lam_means)})
    return pd.DataFrame(rows, dtype=object)

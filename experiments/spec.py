"""TOML experiment specs (layout in ``experiments/README.md``, "Spec format"), validated once
into frozen dataclasses. Unknown tables or keys, wrong types and out-of-range values raise
:class:`SpecError` naming the file, the table and the key. The run-config keys of ``[base]``,
``[grid]`` and ``[[extra-grid]]`` are checked by :class:`corbin_fl.app.config.AppConfig`; the
sweep owns ``seed`` and ``global-lr``, the runner ``out-dir``.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from corbin_fl import registry
from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.mechanisms import validate

RunValue: TypeAlias = bool | int | float | str
"""A value of a Flower run config entry (TOML scalar)."""
SweepGrid: TypeAlias = tuple[tuple[str, tuple[RunValue, ...]], ...]
"""A sweep ``((key, (v1, v2, ...)), ...)``, expanded as the cartesian product of the values."""

CLIENTS_KEY = "clients"
"""Experiment-level key: the number of virtual SuperNodes (not a run-config key)."""
RESERVED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "seed": "set the repetitions with the top-level `seeds = [...]`",
        "global-lr": "set the candidates with the top-level `lambda-grid = [...]` (or a "
        "grid's own `lambda-grid`)",
        "out-dir": "it is set by the runner to the run's own folder",
    }
)
FEDERATED_FIGURES = frozenset(
    {"accuracy-vs-round", "accuracy-bar", "accuracy-vs-epsilon", "accuracy-vs-d"}
    | {"accuracy-vs-dropout", "accuracy-vs-clients", "accuracy-vs-bits", "accuracy-vs-server-eps"}
)
MSE_FIGURES = frozenset({"mse-heatmap", "mse-vs-epsilon", "mse-real-weights"})
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SpecError(ValueError):
    """A spec file is malformed; the message names the file, table and key."""


@dataclass(frozen=True)
class _Opt:
    """Type and range of a spec option (``lo < v`` with ``lo_open``); ``many``: a non-empty list
    of distinct values; ``choices``: the allowed strings."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    many: bool = False
    lo_open: bool = False
    choices: tuple[str, ...] = ()

    def coerce(self, value: Any, where: str) -> Any:
        if self.many:
            if not isinstance(value, list) or not value:
                raise SpecError(f"{where}: expected a non-empty list, got {value!r}")
            one = _Opt(self.kind, self.lo, self.hi, lo_open=self.lo_open)
            return _distinct(tuple(one.coerce(v, where) for v in value), where)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.kind is str and not (isinstance(value, str) and value):
            raise SpecError(f"{where}: expected a non-empty string, got {value!r}")
        if self.kind is int and not (number and isinstance(value, int)):
            raise SpecError(f"{where}: expected an integer, got {value!r}")
        if self.kind is float and not (number and math.isfinite(value)):
            raise SpecError(f"{where}: expected a finite number, got {value!r}")
        value = float(value) if self.kind is float else value
        if (why := self.problem(value)) is not None:
            raise SpecError(f"{where}: {why}")
        return value

    def problem(self, value: Any) -> str | None:
        """Why a value of the right type is refused, or None
        (:mod:`corbin_fl.mechanisms.validate`)."""
        if self.choices:
            return validate.why_one_of(value, self.choices)
        if self.lo is not None and self.hi is not None:
            return validate.why_interval(value, self.lo, self.hi, lo_open=self.lo_open)
        if self.lo is not None:
            return (validate.why_above if self.lo_open else validate.why_at_least)(value, self.lo)
        return None if self.hi is None else validate.why_at_most(value, self.hi)


def _distinct(values: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: duplicate values in {list(values)!r}")
    return values


def _opt(kind: type, lo: float | None = None, hi: float | None = None, **kw: Any) -> Any:
    """A dataclass field that is a spec option: its ``default`` (if any) and its :class:`_Opt`
    (``kw``: ``many``, ``lo_open``, ``choices``), read by :func:`_options`."""
    default = kw.pop("default", MISSING)
    return field(default=default, metadata={"opt": _Opt(kind, lo, hi, **kw)})


_TOP_OPTIONS: Mapping[str, _Opt] = {
    "seeds": _Opt(int, 0, 2**63 - 1, many=True),
    "lambda-grid": _Opt(float, 0, 1, many=True, lo_open=True),
    "lambda-seeds": _Opt(int, 0, 2**63 - 1, many=True),
}
_TABLES = ("experiment", "base", "grid", "extra-grid", "plots", "mse", "target", "lambda-from")
TARGETS_FILE = Path(__file__).with_name("targets.toml")
"""The accuracy targets a federated report checks unless its spec declares its own."""


@dataclass(frozen=True)
class RealWeightsSpec:
    """``[mse.real-weights]``: two clients train ``model`` from one initial model on IID
    partitions 0 and 1; their weights are quantized as a pair with the per-layer range."""

    dataset: str = _opt(str, default="mnist")
    model: str = _opt(str, default="cnn")
    local_epochs: int = _opt(int, 1, default=1)
    batch_size: int = _opt(int, 1, default=64)
    num_partitions: int = _opt(int, 2, default=10)
    repeats: int = _opt(int, 1, default=20)
    data_seed: int = _opt(int, 0, default=0)


@dataclass(frozen=True)
class MSESpec:
    """``[mse]``: the pair MSE of CorBinQ and LDPQ on a ``grid_points``-square grid of
    ``(w1, w2)`` in ``[c - r, c + r]^2`` per eps, ``samples`` draws per point and seed."""

    center: float = _opt(float, default=0.0)
    radius: float = _opt(float, 0, lo_open=True, default=0.5)
    epsilons: tuple[float, ...] = _opt(
        float, 0, lo_open=True, many=True, default=(0.1, 0.5, 1.0, 3.0)
    )
    d: int = _opt(int, 1, 30, default=5)
    grid_points: int = _opt(int, 2, 201, default=11)
    samples: int = _opt(int, 100, default=20000)
    heatmap_epsilons: tuple[float, ...] = _opt(float, 0, lo_open=True, many=True, default=(0.5,))
    real_weights: RealWeightsSpec | None = None


@dataclass(frozen=True)
class TargetSpec:
    """One ``[[target]]``: a claim on the difference of two lambda-selected mean test accuracies
    (percentage points), checked by ``experiments/report.py`` on the groups that agree on every
    setting but the mechanism (and eps_p, when :attr:`reference` has no DP).

    ``claim = "above"``: ``mechanism - reference > margin``; ``"within"``: ``reference -
    mechanism < margin``. At one eps_p (:attr:`eps`) or at each eps_p ``<=`` :attr:`eps_max`
    (exactly one of the two).
    """

    name: str = _opt(str)
    mechanism: str = _opt(str)
    reference: str = _opt(str)
    claim: Literal["above", "within"] = _opt(str, choices=("above", "within"))
    margin: float = _opt(float, 0, default=0.0)
    eps: float | None = _opt(float, 0, lo_open=True, default=None)
    eps_max: float | None = _opt(float, 0, lo_open=True, default=None)
    label: str = _opt(str, default="")
    """The mechanism's name in the report (default: its title, :attr:`Mechanism.title`)."""
    reference_label: str = _opt(str, default="")
    """The reference's name in the report (default: its title)."""
    missing: str = _opt(str, default="no matching groups")
    """Why the target is N/A when no two groups match."""

    @property
    def mechanism_label(self) -> str:
        """:attr:`label`, else the mechanism's title."""
        return self.label or _title(self.mechanism)

    @property
    def reference_name(self) -> str:
        """:attr:`reference_label`, else the reference's title."""
        return self.reference_label or _title(self.reference)

    def covers(self, eps_p: float) -> bool:
        """Whether the target compares at ``eps_p``: its :attr:`eps`, else any eps_p up to
        :attr:`eps_max`."""
        if self.eps is not None:
            return math.isclose(eps_p, self.eps)
        if self.eps_max is None:
            raise ValueError(f"target {self.name!r}: give one of eps and eps_max")
        return eps_p <= self.eps_max

    @property
    def any_epsilon(self) -> bool:
        """The reference has no DP (privacy family ``"none"``): matched at any eps_p."""
        return registry.get(self.reference).category.family == "none"


def _title(mechanism: str) -> str:
    return registry.get(mechanism).title or mechanism


def _parse_targets(raw: Any, source: str) -> tuple[TargetSpec, ...]:
    """The ``[[target]]`` tables of a spec (or of :data:`TARGETS_FILE`), checked: known keys,
    registered mechanisms, exactly one of ``eps`` and ``eps-max``, distinct names."""
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise SpecError(f"{source}: target: expected an array of tables [[target]]")
    out = []
    for i, table in enumerate(raw):
        name = f"target[{i}]"
        options = _options(table, TargetSpec, source, name)
        for key in ("name", "mechanism", "reference", "claim"):
            if key not in options:
                raise SpecError(f"{_where(source, name, key)}: missing")
        for key in ("mechanism", "reference"):
            if options[key] not in registry.REGISTRY:
                raise SpecError(
                    f"{_where(source, name, key)}: {options[key]!r} is not a registered "
                    f"mechanism; choose from {', '.join(registry.REGISTRY)}"
                )
        if ("eps" in options) == ("eps_max" in options):
            raise SpecError(
                f"{_where(source, name)}: give exactly one of eps (one eps_p) and eps-max "
                "(every eps_p up to it)"
            )
        out.append(TargetSpec(**options))
    _distinct(tuple(t.name for t in out), f"{source}: target names")
    return tuple(out)


@functools.cache
def default_targets() -> tuple[TargetSpec, ...]:
    """The targets of :data:`TARGETS_FILE` (read once)."""
    raw = tomllib.loads(TARGETS_FILE.read_text(encoding="utf-8"))
    if unknown := sorted(set(raw) - {"target"}):
        raise SpecError(f"{TARGETS_FILE}: unknown key(s) {', '.join(unknown)}; allowed: target")
    return _parse_targets(raw.get("target", []), str(TARGETS_FILE))


@dataclass(frozen=True)
class LambdaFrom:
    """``[lambda-from]``: a setting of a grid without its own ``lambda-grid`` runs only at the
    lambda chosen for its counterpart in :attr:`spec` (that spec's rule and seeds), and waits
    until that choice is made. Its counterpart is the other spec's one setting that agrees with
    it on every result-config key but those in :attr:`ignore`, its mechanism named by
    :attr:`mechanism` (the same mechanism when not named), with the same number of clients.
    It saves the lambda grid's runs where the update's distribution is the same (a mechanism
    and its secure-aggregation variant) or the step a mechanism tolerates is (a
    reparametrisation); which one is a claim of the spec, stated in its report."""

    spec: ExperimentSpec
    path: str
    """:attr:`spec`'s file as this spec names it (reports quote it)."""
    mechanism: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ignore: tuple[str, ...] = ()

    def counterpart_mechanism(self, mechanism: str) -> str:
        """The mechanism of the counterpart of a setting of ``mechanism``."""
        return self.mechanism.get(mechanism, mechanism)


def _parse_lambda_from(table: Mapping[str, Any], source: str) -> LambdaFrom:
    """``[lambda-from]``: ``spec`` (a federated spec file, relative to this one's folder, itself
    without ``[lambda-from]``), ``mechanism`` (a table: this spec's mechanism -> its
    counterpart's, both registered) and ``ignore`` (run-config keys)."""
    name = "lambda-from"
    if not isinstance(table, Mapping):
        raise SpecError(f"{_where(source, name)}: expected a table [{name}], got {table!r}")
    schema = {"spec": _Opt(str), "ignore": _Opt(str, many=True)}
    options = _options(table, schema, source, name, "mechanism")
    if "spec" not in options:
        raise SpecError(f"{_where(source, name, 'spec')}: missing (the spec whose choices to use)")
    if not isinstance(mapping := table.get("mechanism", {}), Mapping):
        raise SpecError(f"{_where(source, name, 'mechanism')}: expected a table, got {mapping!r}")
    for key, value in mapping.items():
        if not isinstance(value, str):
            raise SpecError(
                f"{_where(source, name, 'mechanism', key)}: expected a mechanism's name, got "
                f"{value!r}"
            )
        for mech in (key, value):
            if mech not in registry.REGISTRY:
                raise SpecError(
                    f"{_where(source, name, 'mechanism')}: {mech!r} is not a registered "
                    f"mechanism; choose from {', '.join(registry.REGISTRY)}"
                )
    known = set(AppConfig.defaults())
    if bad := [k for k in options.get("ignore", ()) if k not in known or k in RESERVED_KEYS]:
        raise SpecError(f"{_where(source, name, 'ignore')}: {bad} are not run-config keys")
    if "mechanism" in options.get("ignore", ()):
        raise SpecError(
            f"{_where(source, name, 'ignore')}: the mechanism is matched through the "
            "`mechanism` table (this spec's mechanism -> its counterpart's), not ignored"
        )
    folder = Path(source).parent if source != "<spec>" else Path()
    path = folder / options["spec"]
    if path.resolve() == Path(source).resolve():
        raise SpecError(f"{_where(source, name, 'spec')}: a spec cannot borrow from itself")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise SpecError(f"{_where(source, name, 'spec')}: {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: invalid TOML: {exc}") from exc
    refused = SpecError(
        f"{_where(source, name, 'spec')}: {path} must be a federated spec that chooses its own "
        "lambdas (without [lambda-from])"
    )
    if "lambda-from" in raw:  # before parsing it: two specs naming each other would recurse
        raise refused
    if (other := parse_spec(raw, source=str(path))).kind != "federated":
        raise refused
    return LambdaFrom(
        other, options["spec"], MappingProxyType(dict(mapping)), options.get("ignore", ())
    )


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated spec: ``base`` the run config of every run (without ``clients``, which is
    ``clients`` unless a grid sweeps it), ``grid`` and ``extra_grids`` the sweeps in file order."""

    name: str = _opt(str)
    description: str = _opt(str, default="")
    kind: Literal["federated", "mse"] = _opt(str, choices=("federated", "mse"), default="federated")
    base: Mapping[str, RunValue] = field(default_factory=lambda: MappingProxyType({}))
    grid: SweepGrid = ()
    extra_grids: tuple[SweepGrid, ...] = ()
    seeds: tuple[int, ...] = (0,)
    lambda_grid: tuple[float, ...] = (1.0,)
    grid_lambdas: tuple[tuple[float, ...] | None, ...] = ()
    """Per grid (``[grid]``, then each ``[[extra-grid]]``): its own ``lambda-grid``, or None
    for the top-level :attr:`lambda_grid`; empty when no grid has its own."""
    lambda_seeds: tuple[int, ...] | None = None
    """The seeds lambda is chosen on (top-level ``lambda-seeds``, a subset of ``seeds``): a
    setting runs every lambda of the grid on these seeds, then its other seeds only at the
    lambda chosen from them (:attr:`selection_seeds`); ``None``: every seed runs every lambda."""
    figures: tuple[str, ...] = ()
    clients: int | None = None
    run_timeout_s: float = _opt(float, 1, default=3600.0)
    retries: int = _opt(int, 0, 10, default=1)
    retry_delay_s: float = _opt(float, 0, 3600, default=15.0)
    num_cpus_per_client: int = _opt(int, 1, default=1)
    num_gpus_per_client: float = _opt(float, 0, default=0.0)
    round_seconds: float | None = _opt(float, 0, lo_open=True, default=None)
    """Seconds one round of the base setting took where the spec is meant to run (measured;
    the spec's comments say how): ``plan`` estimates the runs' time from it until runs of the
    kind (with secure aggregation or without) are done, then from their median round."""
    mse: MSESpec | None = None
    lambda_from: LambdaFrom | None = None
    """``[lambda-from]``: the grids without their own ``lambda-grid`` take each setting's lambda
    from its counterpart in another spec (:meth:`borrows`)."""
    own_targets: tuple[TargetSpec, ...] | None = None
    """The spec's ``[[target]]`` tables; None: :func:`default_targets`."""
    source: Path | None = field(default=None, compare=False)

    @property
    def targets(self) -> tuple[TargetSpec, ...]:
        """The accuracy targets its report checks: its own, else :func:`default_targets`."""
        return default_targets() if self.own_targets is None else self.own_targets

    @property
    def selection_seeds(self) -> tuple[int, ...]:
        """The seeds on which each setting's lambda is chosen (all seeds unless
        ``lambda-seeds`` names fewer)."""
        return self.lambda_seeds if self.lambda_seeds is not None else self.seeds

    def lambdas(self, grid: int) -> tuple[float, ...]:
        """The lambda candidates of the settings of grid ``grid`` (0: ``[grid]``, then each
        ``[[extra-grid]]``): its own ``lambda-grid``, else the top-level one (a grid that
        :meth:`borrows` runs at its counterparts' candidates instead)."""
        own = self._own_lambdas(grid)
        return own if own is not None else self.lambda_grid

    def _own_lambdas(self, grid: int) -> tuple[float, ...] | None:
        """Grid ``grid``'s own ``lambda-grid``, or None."""
        return self.grid_lambdas[grid] if grid < len(self.grid_lambdas) else None

    def borrows(self, grid: int) -> bool:
        """Whether grid ``grid``'s settings take their lambda from their counterparts in
        :attr:`lambda_from` (a spec with ``[lambda-from]``, the grid without its own
        ``lambda-grid``) instead of choosing it."""
        return self.lambda_from is not None and self._own_lambdas(grid) is None

    @property
    def all_lambdas(self) -> tuple[float, ...]:
        """Every lambda some setting may run at, ascending (a borrowing grid's: any of the
        other spec's)."""
        grids = range(1 + len(self.extra_grids))
        out = {lam for i in grids if not self.borrows(i) for lam in self.lambdas(i)}
        if self.lambda_from is not None and any(self.borrows(i) for i in grids):
            out |= set(self.lambda_from.spec.all_lambdas)
        return tuple(sorted(out))

    @property
    def confirmation_seeds(self) -> tuple[int, ...]:
        """The seeds that run only at each setting's chosen lambda (the others)."""
        return tuple(s for s in self.seeds if s not in self.selection_seeds)


def _where(source: str, *parts: str) -> str:
    path = ".".join(p for p in parts if p)
    return f"{source}: {path}" if path else source


def _table(raw: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    if not isinstance(value := raw.get(key, {}), Mapping):
        raise SpecError(f"{_where(source, key)}: expected a table [{key}], got {value!r}")
    return value


def _options(
    table: Mapping[str, Any], schema: Any, source: str, name: str, *tables: str
) -> dict[str, Any]:
    """The options of table ``name`` present, checked, snake_case; a key neither an option of
    ``schema`` (a mapping, or a dataclass with :func:`_opt` fields) nor a sub-table of
    ``tables`` is an error."""
    if is_dataclass(schema):
        schema = {f.name.replace("_", "-"): f.metadata["opt"] for f in fields(schema) if f.metadata}
    if unknown := sorted(set(table) - {*schema, *tables}):
        raise SpecError(
            f"{_where(source, name)}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted({*schema, *tables}))}"
        )
    return {
        key.replace("-", "_"): opt.coerce(table[key], _where(source, name, key))
        for key, opt in schema.items()
        if key in table
    }


def _run_value(key: str, value: Any, where: str) -> RunValue:
    """One run-config value, checked alone by :meth:`AppConfig.from_flower` (and converted as
    it converts it); an error it reports on another key is a combination with that key's
    default, checked per run by :func:`experiments.sweep.expand_runs`."""
    if key in RESERVED_KEYS:
        raise SpecError(f"{where}: `{key}` cannot be set here; {RESERVED_KEYS[key]}")
    if key == CLIENTS_KEY:
        return _Opt(int, 2).coerce(value, where)
    try:
        return AppConfig.from_flower({key: value}).to_flower()[key]
    except ConfigError as exc:
        if key in exc.errors:
            raise SpecError(f"{where}: {exc.errors[key]}") from exc
    return value


def _parse_grid(table: Mapping[str, Any], source: str, name: str) -> SweepGrid:
    """``[base]`` holds one value a key, a grid a list of distinct values (or one value)."""
    out: list[tuple[str, tuple[RunValue, ...]]] = []
    for key, raw_values in table.items():
        where = _where(source, name, key)
        if name == "base" and isinstance(raw_values, list):
            raise SpecError(f"{where}: lists go in [grid], not [base]")
        if not (values := raw_values if isinstance(raw_values, list) else [raw_values]):
            raise SpecError(f"{where}: the list of values is empty")
        out.append((key, _distinct(tuple(_run_value(key, v, where) for v in values), where)))
    return tuple(out)


def _parse_mse(table: Mapping[str, Any], source: str) -> MSESpec:
    options = _options(table, MSESpec, source, "mse", "real-weights")
    eps = options.setdefault("epsilons", MSESpec.epsilons)
    default_heat = tuple(e for e in MSESpec.heatmap_epsilons if e in eps) or eps[:1]
    heat = options.setdefault("heatmap_epsilons", default_heat)
    if missing := [e for e in heat if e not in eps]:
        raise SpecError(f"{source}: mse.heatmap-epsilons: {missing} not in mse.epsilons {eps}")
    if "real-weights" in table:
        rw = _table(table, "real-weights", f"{source}: mse")
        options["real_weights"] = RealWeightsSpec(
            **_options(rw, RealWeightsSpec, source, "mse.real-weights")
        )
    return MSESpec(**options)


def _parse_sweep(raw: Mapping[str, Any], source: str, kind: str) -> dict[str, Any]:
    """``base``, ``grid`` and ``extra_grids`` of a federated spec (checked per key by
    :func:`_run_value`), or the ``mse`` table of an mse spec."""
    base_raw, grid_raw = _table(raw, "base", source), _table(raw, "grid", source)
    extra_raw = raw.get("extra-grid", [])
    if not isinstance(extra_raw, list) or not all(isinstance(t, Mapping) for t in extra_raw):
        raise SpecError(f"{source}: extra-grid: expected an array of tables [[extra-grid]]")
    if kind == "mse":
        if base_raw or grid_raw or extra_raw:
            raise SpecError(
                f'{source}: [base], [grid] and [[extra-grid]] are for kind = "federated"; '
                "the mse experiment is configured in [mse]"
            )
        if "lambda-grid" in raw:
            raise SpecError(f'{source}: lambda-grid: not used by kind = "mse"')
        return {"mse": _parse_mse(_table(raw, "mse", source), source)}
    if "mse" in raw:
        raise SpecError(f'{source}: [mse]: only used with kind = "mse"')
    base = {k: v for k, (v,) in _parse_grid(base_raw, source, "base")}
    named = [(grid_name(i), t) for i, t in enumerate([grid_raw, *extra_raw])]
    lambdas = tuple(_grid_lambdas(table, source, name) for name, table in named)
    grid_raw, *extra_raw = ({k: v for k, v in t.items() if k != "lambda-grid"} for _, t in named)
    grid = _parse_grid(grid_raw, source, "grid")
    extras = tuple(_parse_grid(t, source, grid_name(i + 1)) for i, t in enumerate(extra_raw))
    if () in extras:
        raise SpecError(f"{source}: {grid_name(extras.index(()) + 1)}: empty table")
    keys = {*base, *(k for g in (grid, *extras) for k, _ in g)}
    if "mechanism" not in keys:
        raise SpecError(f"{source}: set `mechanism` in [base] or sweep it in [grid]")
    if "num-rounds" not in keys:
        raise SpecError(f"{source}: base.num-rounds: missing (rounds of every run)")
    clients = base.pop(CLIENTS_KEY, None)  # an int >= 2 (_run_value)
    return {
        "base": MappingProxyType(base),
        "grid": grid,
        "extra_grids": extras,
        "clients": clients,
        "grid_lambdas": lambdas if any(lambdas) else (),
    }


def grid_name(index: int) -> str:
    """How errors and reports name grid ``index`` of a spec: ``grid``, then ``extra-grid[i]``
    (``[[extra-grid]]`` tables from 0)."""
    return "grid" if index == 0 else f"extra-grid[{index - 1}]"


def _grid_lambdas(table: Mapping[str, Any], source: str, name: str) -> tuple[float, ...] | None:
    """A grid's own ``lambda-grid`` (its settings' lambda candidates instead of the top-level
    grid's), checked like the top-level one; None when it has none."""
    if "lambda-grid" not in table:
        return None
    schema = {"lambda-grid": _TOP_OPTIONS["lambda-grid"]}
    return tuple(
        _options({"lambda-grid": table["lambda-grid"]}, schema, source, name)["lambda_grid"]
    )


def parse_spec(raw: Mapping[str, Any], *, source: str = "<spec>") -> ExperimentSpec:
    """Validate a TOML document (as from :func:`tomllib.loads`) into an :class:`ExperimentSpec`;
    :class:`SpecError` naming ``source``, table and key otherwise."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"raw must be a mapping, got {type(raw).__name__}")
    top = _options(raw, _TOP_OPTIONS, source, "", *_TABLES)
    if "experiment" not in raw:
        raise SpecError(f"{source}: missing the [experiment] table")
    options = _options(_table(raw, "experiment", source), ExperimentSpec, source, "experiment")
    if (name := options.get("name")) is None:
        raise SpecError(f"{source}: experiment.name: missing (it names results/<name>/)")
    if not _NAME_RE.match(name):
        raise SpecError(
            f"{source}: experiment.name: {name!r} must be 1-64 characters of letters, digits, "
            "'_', '.', '-' and start with a letter or digit (it is a folder name)"
        )
    kind = options.setdefault("kind", "federated")
    plots = _table(raw, "plots", source)
    _options(plots, {}, source, "plots", "figures")
    allowed = FEDERATED_FIGURES if kind == "federated" else MSE_FIGURES
    figures = plots.get("figures", sorted(allowed))
    if not isinstance(figures, list) or not all(isinstance(f, str) for f in figures):
        raise SpecError(f"{source}: plots.figures: expected a list of strings, got {figures!r}")
    if bad := [f for f in figures if f not in allowed]:
        raise SpecError(
            f"{source}: plots.figures: {bad} not available for kind = {kind!r}; "
            f"choose from {', '.join(sorted(allowed))}"
        )
    source_path = Path(source) if source != "<spec>" else None
    sweep = _parse_sweep(raw, source, kind)
    if "lambda_seeds" in top and kind == "mse":
        raise SpecError(f'{source}: lambda-seeds: not used by kind = "mse"')
    if stray := sorted(set(top.get("lambda_seeds", ())) - set(top.get("seeds", (0,)))):
        raise SpecError(
            f"{source}: lambda-seeds: {stray} not in seeds; lambda is chosen on some of the "
            "seeds the runs use"
        )
    if "target" in raw and kind == "mse":
        raise SpecError(f'{source}: [[target]]: not used by kind = "mse" (its targets are fixed)')
    targets = _parse_targets(raw["target"], source) if "target" in raw else None
    if "lambda-from" in raw:
        if kind != "federated":
            raise SpecError(f'{source}: [lambda-from]: only used with kind = "federated"')
        top["lambda_from"] = _parse_lambda_from(raw["lambda-from"], source)
        _check_borrowing(top, sweep, source)
    return ExperimentSpec(
        **options,
        **top,
        **sweep,
        figures=tuple(figures),
        own_targets=targets,
        source=source_path,
    )


def _check_borrowing(top: Mapping[str, Any], sweep: Mapping[str, Any], source: str) -> None:
    """With ``[lambda-from]``: some grid borrows (has no ``lambda-grid`` of its own), the
    top-level ``lambda-grid`` (which no grid would use) and ``lambda-seeds`` are not given."""
    grids = 1 + len(sweep["extra_grids"])
    own = sweep["grid_lambdas"] or (None,) * grids
    if all(lams is not None for lams in own):
        raise SpecError(
            f"{source}: [lambda-from]: every grid has its own lambda-grid, so none borrows; "
            "drop [lambda-from] or a grid's lambda-grid"
        )
    for key, why in (
        ("lambda_grid", "the grids without their own lambda-grid take their counterparts'"),
        ("lambda_seeds", "not supported with [lambda-from] (borrowed settings choose nothing)"),
    ):
        if key in top:
            raise SpecError(f"{source}: {key.replace('_', '-')}: {why}")


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a TOML spec file (:func:`parse_spec`); :class:`FileNotFoundError` if
    it does not exist, :class:`SpecError` if it is not valid TOML or not a valid spec."""
    try:
        raw = tomllib.loads((p := Path(path)).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: invalid TOML: {exc}") from exc
    return parse_spec(raw, source=str(p))

"""TOML experiment specs, parsed once and validated into frozen dataclasses.

A spec describes one experiment of the paper (Section V and Appendix F of corbin-fl); the
layout, with an example, is in ``experiments/README.md`` ("Spec format"). At the top level,
``seeds`` are the repetitions (tables show mean and std over them) and ``lambda-grid`` the
candidates of the global learning rate lambda (paper eq. 6), chosen on VALIDATION accuracy only,
per (mechanism, setting). ``[experiment]`` names the results folder and sets the kind
(``"federated"``, or ``"mse"``: quantizer MSE, no federation, configured in ``[mse]``), the
backend (``"simulation"``, or ``"deployment"`` with a ``connection``) and the limits of a run.
``[base]`` is the run config shared by all runs (kebab-case keys of the app, plus ``clients``:
the number of SuperNodes), ``[grid]`` the lists to sweep (cartesian product in file order) and
each ``[[extra-grid]]`` one more product appended to the sweep; ``[plots] figures`` picks the
figures. The keys and ranges of each table are in the ``_*_OPTIONS`` schemas below.

Validation is strict: unknown tables or keys, wrong types and out-of-range values raise
:class:`SpecError` naming the file, the table and the key. The keys ``seed``, ``global-lr`` and
``out-dir`` are owned by the sweep (``seeds``, ``lambda-grid``) and the runner.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from corbin_fl.config import ConfigError, RunConfig

RunValue: TypeAlias = bool | int | float | str
"""A value of a Flower run config entry (TOML scalar)."""

CLIENTS_KEY = "clients"
"""Experiment-level key: number of (virtual) SuperNodes. Passed as ``num-supernodes`` in the
federation config of the simulation runtime, never as a run-config key."""

RESERVED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "seed": "set the repetitions with the top-level `seeds = [...]`",
        "global-lr": "set the candidates with the top-level `lambda-grid = [...]`",
        "out-dir": "it is set by the runner to the run's own folder",
    }
)

FEDERATED_FIGURES = frozenset(
    {"accuracy-vs-round", "accuracy-bar", "accuracy-vs-epsilon", "accuracy-vs-d"}
    | {"accuracy-vs-dropout", "accuracy-vs-clients", "accuracy-vs-bits"}
)
"""Figure names accepted in ``[plots] figures`` of a federated experiment."""
MSE_FIGURES = frozenset({"mse-heatmap", "mse-vs-epsilon", "mse-real-weights"})
"""Figure names accepted in ``[plots] figures`` of an mse experiment."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

SweepGrid: TypeAlias = tuple[tuple[str, tuple[RunValue, ...]], ...]
"""A sweep: ``((key, (v1, v2, ...)), ...)``, expanded as the cartesian product of the values."""

Check: TypeAlias = Callable[[Any], str | None]
"""A range check: returns an error message, or ``None`` when the value is fine."""


class SpecError(ValueError):
    """A spec file is malformed; the message names the file, table and key."""


# --------------------------------------------------------------------------- value checks


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(float(value))  # type: ignore[arg-type]


_KINDS: Mapping[str, tuple[Callable[[object], bool], str]] = {
    "int": (_is_int, "an integer"),
    "float": (_is_number, "a finite number"),
    "str": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
}


@dataclass(frozen=True)
class KeySpec:
    """Type and range of one spec value (experiment options, ``[mse]`` entries, ``clients``).

    ``kind`` is ``"int"``, ``"float"`` (an integer literal is accepted and converted) or
    ``"str"`` (non-empty); ``check`` returns an error message for an out-of-range value, shown
    with ``doc`` (what the value is). With ``many``, the value is a non-empty list of distinct
    such values, returned as a tuple.
    """

    kind: Literal["int", "float", "str"]
    check: Check | None = None
    doc: str = ""
    many: bool = False

    def coerce(self, value: object, where: str) -> Any:
        """Return ``value`` converted to this key's type, or raise :class:`SpecError`."""
        if self.many:
            if not isinstance(value, list) or not value:
                raise SpecError(f"{where}: expected a non-empty list, got {value!r}")
            one = KeySpec(self.kind, self.check, self.doc)
            return _distinct(tuple(one.coerce(v, where) for v in value), where)
        ok, expected = _KINDS[self.kind]
        if not ok(value):
            raise SpecError(f"{where}: expected {expected}, got {value!r}")
        out: RunValue = float(value) if self.kind == "float" else value  # type: ignore[arg-type,assignment]
        if self.check is not None and (problem := self.check(out)) is not None:
            raise SpecError(f"{where}: {problem} (got {out!r}; {self.doc})")
        return out


def _distinct(values: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: duplicate values in {list(values)!r}")
    return values


def _range(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Check:
    """Check ``lo <= v <= hi`` (``lo < v`` with ``lo_open``; no upper bound if ``hi`` is None)."""

    def check(v: float) -> str | None:
        if v < lo or (lo_open and v == lo):
            return f"must be {'>' if lo_open else '>='} {lo}"
        return f"must be <= {hi}" if hi is not None and v > hi else None

    return check


def _one_of(options: Sequence[str]) -> Check:
    return lambda v: None if v in options else f"must be one of {', '.join(options)}"


_POSITIVE = _range(0, lo_open=True)
CLIENTS_SPEC = KeySpec("int", _range(2), "number of (virtual) SuperNodes")

# The options of each table, in checking order; the keys of its dataclass, kebab-case.
_EXPERIMENT_OPTIONS: Mapping[str, KeySpec] = {
    "name": KeySpec("str"),
    "description": KeySpec("str"),
    "kind": KeySpec("str", _one_of(("federated", "mse")), "experiment kind"),
    "backend": KeySpec("str", _one_of(("simulation", "deployment")), "runtime"),
    "connection": KeySpec("str"),
    "run-timeout-s": KeySpec("float", _range(1), "seconds"),
    "retries": KeySpec("int", _range(0, 10), "extra attempts of a failed run"),
    "retry-delay-s": KeySpec("float", _range(0, 3600), "seconds"),
    "num-cpus-per-client": KeySpec("int", _range(1), "CPUs"),
    "num-gpus-per-client": KeySpec("float", _range(0), "GPUs"),
}
_FEDERATED_ONLY = ("retries", "retry_delay_s", "num_cpus_per_client", "num_gpus_per_client")
_MSE_OPTIONS: Mapping[str, KeySpec] = {
    "center": KeySpec("float", None, "center c"),
    "radius": KeySpec("float", _POSITIVE, "radius r"),
    "epsilons": KeySpec("float", _POSITIVE, "epsilons", many=True),
    "heatmap-epsilons": KeySpec("float", _POSITIVE, "heatmap-epsilons", many=True),
    "d": KeySpec("int", _range(1, 30), "shared bits"),
    "grid-points": KeySpec("int", _range(2, 201), "grid size"),
    "samples": KeySpec("int", _range(100), "draws per point"),
}
_REAL_WEIGHTS_OPTIONS: Mapping[str, KeySpec] = {
    "dataset": KeySpec("str"),
    "model": KeySpec("str"),
    "local-epochs": KeySpec("int", _range(1), "epochs"),
    "batch-size": KeySpec("int", _range(1), "batch"),
    "num-partitions": KeySpec("int", _range(2), "IID partitions"),
    "repeats": KeySpec("int", _range(1), "quantizations"),
    "data-seed": KeySpec("int", _range(0), "split seed"),
}
_TOP_OPTIONS: Mapping[str, KeySpec] = {
    "seeds": KeySpec("int", _range(0, 2**63 - 1), "repetition seeds", many=True),
    "lambda-grid": KeySpec("float", _range(0, 1, lo_open=True), "global learning rates", many=True),
}
_TABLES = ("experiment", "base", "grid", "extra-grid", "plots", "mse")


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class RealWeightsSpec:
    """Quantizer MSE measured on real model weights (``[mse.real-weights]``).

    Two clients start from the same initial model, each trains ``local-epochs`` on its own
    IID partition; their weights ``w1, w2`` are quantized as a pair with per-layer center and
    radius ``c = (max + min) / 2``, ``r = (max - min) / 2`` over both clients (paper Sec. V,
    "layer-wise minimum and maximum").
    """

    dataset: str = "mnist"
    model: str = "cnn"
    local_epochs: int = 1
    batch_size: int = 64
    num_partitions: int = 10
    repeats: int = 20
    data_seed: int = 0


@dataclass(frozen=True)
class MSESpec:
    """The quantizer-MSE experiment (``[mse]``; paper Appendix F, Experiment 8 / Fig. 4).

    The pair MSE ``E[(Q1(w1) + Q2(w2) - w1 - w2)^2]`` of CorBinQ (Alg. 2) and of two
    independent LDPQ (Alg. 1) is measured by sampling the real quantizers on a
    ``grid_points x grid_points`` grid of ``(w1, w2)`` in ``[c - r, c + r]^2`` for every
    ``eps`` in ``epsilons``, with ``samples`` draws per point, next to its closed form.
    """

    center: float = 0.0
    radius: float = 0.5
    epsilons: tuple[float, ...] = (0.1, 0.5, 1.0, 3.0)
    d: int = 5
    grid_points: int = 11
    samples: int = 20000
    heatmap_epsilons: tuple[float, ...] = (0.5,)
    real_weights: RealWeightsSpec | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment spec (see ``experiments/README.md`` for the TOML layout).

    ``base`` is the run config shared by all runs (read-only, without ``clients``), ``grid`` the
    sweep in file order, ``extra_grids`` more sweeps (``[[extra-grid]]``) expanded the same way
    and appended, ``clients`` the default number of SuperNodes (``base.clients``), overridable
    per grid point.
    """

    name: str
    description: str
    kind: Literal["federated", "mse"]
    backend: Literal["simulation", "deployment"]
    connection: str | None
    base: Mapping[str, RunValue]
    grid: SweepGrid
    extra_grids: tuple[SweepGrid, ...]
    seeds: tuple[int, ...]
    lambda_grid: tuple[float, ...]
    figures: tuple[str, ...]
    clients: int | None = None
    run_timeout_s: float = 3600.0
    retries: int = 1
    retry_delay_s: float = 15.0
    num_cpus_per_client: int = 1
    num_gpus_per_client: float = 0.0
    mse: MSESpec | None = None
    source: Path | None = field(default=None, compare=False)


# --------------------------------------------------------------------------- parsing


def _where(source: str, *parts: str) -> str:
    """``"spec.toml: grid.epsilon"``; the file alone for the top level."""
    path = ".".join(p for p in parts if p)
    return f"{source}: {path}" if path else source


def _table(raw: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise SpecError(f"{_where(source, key)}: expected a table [{key}], got {value!r}")
    return value


def _options(
    table: Mapping[str, Any], schema: Mapping[str, KeySpec], source: str, name: str, *tables: str
) -> dict[str, Any]:
    """Check the options of table ``name``: a key not in ``schema`` nor ``tables`` (sub-tables,
    parsed apart) is an error. Returns those present, snake_case (as the dataclass fields)."""
    allowed = {*schema, *tables}
    if unknown := sorted(set(table) - allowed):
        raise SpecError(
            f"{_where(source, name)}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    return {
        key.replace("-", "_"): spec.coerce(table[key], _where(source, name, key))
        for key, spec in schema.items()
        if key in table
    }


def _coerce_run_value(key: str, value: object, where: str) -> RunValue:
    """Type- and range-check one run-config value against :class:`corbin_fl.config.RunConfig`.

    The value is checked alone (the other keys at their defaults), so the error names the spec
    location; combinations are checked again per run by :func:`validate_run_config`.
    """
    if key in RESERVED_KEYS:
        raise SpecError(f"{where}: `{key}` cannot be set here; {RESERVED_KEYS[key]}")
    if key == CLIENTS_KEY:
        return CLIENTS_SPEC.coerce(value, where)
    defaults = RunConfig.defaults()
    if key not in defaults:
        close = difflib.get_close_matches(key, [*defaults, CLIENTS_KEY], n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise SpecError(
            f"{where}: unknown run-config key `{key}`{hint} (the keys are the fields of "
            "corbin_fl.config.RunConfig, kebab-case, plus `clients`)"
        )
    default = defaults[key]
    # Stricter than RunConfig: no bool for a number, no 2.0 for an int, no "true" for a bool.
    out = float(value) if isinstance(default, float) and _is_int(value) else value  # type: ignore[arg-type]
    if type(out) is not type(default):
        raise SpecError(
            f"{where}: expected a {type(default).__name__}, got {type(value).__name__} {value!r}"
        )
    try:
        RunConfig.from_flower({key: out})
    except ConfigError as exc:
        # An error on another key comes from that key's default beside this value (e.g.
        # dataset = "cifar10" with the default empty data-dir): a combination, checked per run.
        if key in exc.errors:
            raise SpecError(f"{where}: {exc.errors[key]}") from exc
    return out  # type: ignore[return-value]


def validate_run_config(run_config: Mapping[str, RunValue], where: str) -> RunConfig:
    """Return the run's effective :class:`RunConfig` (the defaults overridden by ``run_config``).

    All keys are checked at once by :meth:`RunConfig.from_flower`; a :class:`SpecError` at
    ``where`` lists every bad key of the combination, e.g. ``clients-per-round < min-clients``.
    """
    try:
        return RunConfig.from_flower(dict(run_config))
    except ConfigError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def _parse_grid(table: Mapping[str, Any], source: str, name: str) -> SweepGrid:
    """Check the run-config values of table ``name``: ``[base]`` holds one value a key, a grid
    a list of distinct values (or one value, a list of one)."""
    out: list[tuple[str, tuple[RunValue, ...]]] = []
    for key, raw_values in table.items():
        where = _where(source, name, key)
        if name == "base" and isinstance(raw_values, list):
            raise SpecError(f"{where}: lists go in [grid], not [base]")
        values = raw_values if isinstance(raw_values, list) else [raw_values]
        if not values:
            raise SpecError(f"{where}: the list of values is empty")
        out.append((key, _distinct(tuple(_coerce_run_value(key, v, where) for v in values), where)))
    return tuple(out)


def _parse_mse(table: Mapping[str, Any], source: str) -> MSESpec:
    options = _options(table, _MSE_OPTIONS, source, "mse", "real-weights")
    eps = options.setdefault("epsilons", MSESpec.epsilons)
    default_heat = tuple(e for e in MSESpec.heatmap_epsilons if e in eps) or eps[:1]
    heat = options.setdefault("heatmap_epsilons", default_heat)
    if missing := [e for e in heat if e not in eps]:
        raise SpecError(f"{source}: mse.heatmap-epsilons: {missing} not in mse.epsilons {eps}")
    if "real-weights" in table:
        rw = table["real-weights"]
        if not isinstance(rw, Mapping):
            raise SpecError(f"{source}: mse.real-weights: expected a table, got {rw!r}")
        rw_options = _options(rw, _REAL_WEIGHTS_OPTIONS, source, "mse.real-weights")
        options["real_weights"] = RealWeightsSpec(**rw_options)
    return MSESpec(**options)


def parse_spec(raw: Mapping[str, Any], *, source: str = "<spec>") -> ExperimentSpec:
    """Validate a TOML document (as from :func:`tomllib.loads`) into an :class:`ExperimentSpec`.

    Raises :class:`SpecError` naming ``source`` (usually the file path), table and key for any
    unknown key, wrong type, out-of-range or inconsistent value.
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"raw must be a mapping, got {type(raw).__name__}")
    top = _options(raw, _TOP_OPTIONS, source, "", *_TABLES)

    exp = _table(raw, "experiment", source)
    if "experiment" not in raw:
        raise SpecError(f"{source}: missing the [experiment] table")
    options = _options(exp, _EXPERIMENT_OPTIONS, source, "experiment")
    where = f"{source}: experiment"
    if (name := options.pop("name", None)) is None:
        raise SpecError(f"{where}.name: missing (it names results/<name>/)")
    if not _NAME_RE.match(name):
        raise SpecError(
            f"{where}.name: {name!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit (it is a folder name)"
        )
    defaults = {"description": "", "kind": "federated", "backend": "simulation", "connection": None}
    options = defaults | options
    kind, backend, connection = options["kind"], options["backend"], options["connection"]
    if backend == "deployment" and connection is None:
        raise SpecError(f'{where}.connection: required with backend = "deployment"')
    if backend == "simulation" and connection is not None:
        raise SpecError(
            f'{where}.connection: only used with backend = "deployment"; the simulation '
            "backend makes its own local connection"
        )

    plots = _table(raw, "plots", source)
    _options(plots, {}, source, "plots", "figures")
    allowed_figs = FEDERATED_FIGURES if kind == "federated" else MSE_FIGURES
    figures_raw = plots.get("figures", sorted(allowed_figs))
    if not isinstance(figures_raw, list) or not all(isinstance(f, str) for f in figures_raw):
        raise SpecError(f"{source}: plots.figures: expected a list of strings, got {figures_raw!r}")
    if bad := [f for f in figures_raw if f not in allowed_figs]:
        raise SpecError(
            f"{source}: plots.figures: {bad} not available for kind = {kind!r}; "
            f"choose from {', '.join(sorted(allowed_figs))}"
        )

    base_raw = _table(raw, "base", source)
    grid_raw = _table(raw, "grid", source)
    extra_raw = raw.get("extra-grid", [])
    if not isinstance(extra_raw, list) or not all(isinstance(t, Mapping) for t in extra_raw):
        raise SpecError(f"{source}: extra-grid: expected an array of tables [[extra-grid]]")
    mse: MSESpec | None = None
    if kind == "federated":
        if "mse" in raw:
            raise SpecError(f'{source}: [mse]: only used with kind = "mse"')
        base = {k: v for k, (v,) in _parse_grid(base_raw, source, "base")}
        grid = _parse_grid(grid_raw, source, "grid")
        extras = tuple(_parse_grid(t, source, f"extra-grid[{i}]") for i, t in enumerate(extra_raw))
        if () in extras:
            raise SpecError(f"{source}: extra-grid[{extras.index(())}]: empty table")
        swept = {k for g in (grid, *extras) for k, _ in g}
        if backend == "deployment" and CLIENTS_KEY in swept:
            raise SpecError(
                f'{source}: `clients` cannot be swept with backend = "deployment": the number of '
                "clients is the number of SuperNodes connected to the SuperLink"
            )
        if "mechanism" not in base and "mechanism" not in swept:
            raise SpecError(f"{source}: set `mechanism` in [base] or sweep it in [grid]")
        if "num-rounds" not in base and "num-rounds" not in swept:
            raise SpecError(f"{source}: base.num-rounds: missing (rounds of every run)")
    else:
        if base_raw or grid_raw or extra_raw:
            raise SpecError(
                f'{source}: [base], [grid] and [[extra-grid]] are for kind = "federated"; '
                "the mse experiment is configured in [mse]"
            )
        if "lambda-grid" in raw:
            raise SpecError(f'{source}: lambda-grid: not used by kind = "mse"')
        mse = _parse_mse(_table(raw, "mse", source), source)
        base, grid, extras = {}, (), ()
        # not used by the mse experiment: kept at their defaults
        options = {k: v for k, v in options.items() if k not in _FEDERATED_ONLY}
    clients = base.pop(CLIENTS_KEY, None)
    return ExperimentSpec(
        name=name,
        **options,
        base=MappingProxyType(base),
        grid=grid,
        extra_grids=extras,
        seeds=top.get("seeds", (0,)),
        lambda_grid=top.get("lambda_grid", (1.0,)),
        figures=tuple(figures_raw),
        clients=int(clients) if clients is not None else None,
        mse=mse,
        source=Path(source) if source != "<spec>" else None,
    )


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a TOML spec file (see :func:`parse_spec`).

    Raises :class:`FileNotFoundError` if ``path`` does not exist, :class:`SpecError` if the
    file is not valid TOML or fails validation.
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: invalid TOML: {exc}") from exc
    return parse_spec(raw, source=str(p))

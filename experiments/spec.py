"""TOML experiment specs, parsed once and validated into frozen dataclasses.

A spec describes one experiment of the paper (Section V and Appendix F of corbin-fl):

.. code-block:: toml

    seeds = [0, 1, 2]                 # repetitions; every table shows mean and std over them
    lambda-grid = [0.5, 1.0]          # global learning rate lambda (paper eq. 6), chosen on
                                      # VALIDATION accuracy only, per (mechanism, setting)

    [experiment]
    name = "epsilon"                  # results go to results/<name>/
    description = "Accuracy vs eps_p (paper Exp. 6 / Fig. 3b)"
    kind = "federated"                # or "mse" (quantizer MSE, no federation; see [mse])
    backend = "simulation"            # or "deployment" with connection = "<name>"
    run-timeout-s = 3600              # wall-clock limit of one run
    retries = 1                       # extra attempts of a failed run (e.g. Ray start-up)
    retry-delay-s = 15                # pause before a retry (lets a load spike pass)

    [base]                            # run config (kebab-case keys of the app) shared by all runs
    dataset = "mnist"
    num-rounds = 10
    clients = 10                      # number of (virtual) SuperNodes, not a run-config key

    [grid]                            # lists to sweep, cartesian product in this order
    mechanism = ["ldpfl", "corbin"]
    epsilon = [0.1, 0.5, 1.0]

    [[extra-grid]]                    # optional extra products appended to the sweep,
    mechanism = ["fedavg"]            # e.g. a reference that does not depend on epsilon

    [plots]
    figures = ["accuracy-vs-epsilon", "accuracy-vs-round"]

Validation is strict: unknown tables or keys, wrong types and out-of-range values raise
:class:`SpecError` naming the file, the table and the key. The keys ``seed``, ``global-lr`` and
``out-dir`` are owned by the sweep (``seeds``, ``lambda-grid``) and the runner.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from corbin_fl.config import ConfigError, RunConfig

logger = logging.getLogger(__name__)

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

FIGURES: tuple[str, ...] = (
    "accuracy-vs-round",
    "accuracy-bar",
    "accuracy-vs-epsilon",
    "accuracy-vs-d",
    "accuracy-vs-dropout",
    "accuracy-vs-clients",
    "accuracy-vs-bits",
    "mse-heatmap",
    "mse-vs-epsilon",
    "mse-real-weights",
)
"""Figure names accepted in ``[plots] figures``."""

FEDERATED_FIGURES = frozenset(f for f in FIGURES if f.startswith("accuracy"))
MSE_FIGURES = frozenset(f for f in FIGURES if f.startswith("mse"))

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


Check: TypeAlias = Callable[[Any], str | None]
"""A range check: returns an error message, or ``None`` when the value is fine."""


class SpecError(ValueError):
    """A spec file is malformed; the message names the file, table and key."""


# --------------------------------------------------------------------------- value checks


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(float(value))  # type: ignore[arg-type]


@dataclass(frozen=True)
class KeySpec:
    """Type and range of one spec value (experiment options, ``[mse]`` entries, ``clients``).

    Attributes
    ----------
    kind
        ``"int"``, ``"float"`` (an integer literal is accepted and converted), ``"str"`` or
        ``"bool"``.
    check
        Returns an error message for an out-of-range value, or ``None``.
    doc
        What the value is, shown in range errors.
    """

    kind: Literal["int", "float", "str", "bool"]
    check: Check | None
    doc: str

    def coerce(self, value: object, where: str) -> RunValue:
        """Return ``value`` converted to this key's type, or raise :class:`SpecError`."""
        if self.kind == "int":
            if not _is_int(value):
                raise SpecError(f"{where}: expected an integer, got {value!r}")
            out: RunValue = int(value)  # type: ignore[arg-type]
        elif self.kind == "float":
            if not _is_number(value):
                raise SpecError(f"{where}: expected a finite number, got {value!r}")
            out = float(value)  # type: ignore[arg-type]
        elif self.kind == "str":
            if not isinstance(value, str) or not value:
                raise SpecError(f"{where}: expected a non-empty string, got {value!r}")
            out = value
        else:
            if not isinstance(value, bool):
                raise SpecError(f"{where}: expected true or false, got {value!r}")
            out = value
        if self.check is not None:
            problem = self.check(out)
            if problem is not None:
                raise SpecError(f"{where}: {problem} (got {out!r}; {self.doc})")
        return out


def _range(
    lo: float | None, hi: float | None, *, lo_open: bool = False, hi_open: bool = False
) -> Check:
    def check(v: float) -> str | None:
        if lo is not None and (v < lo or (lo_open and v == lo)):
            return f"must be {'>' if lo_open else '>='} {lo}"
        if hi is not None and (v > hi or (hi_open and v == hi)):
            return f"must be {'<' if hi_open else '<='} {hi}"
        return None

    return check


def _one_of(options: Sequence[str]) -> Check:
    def check(v: str) -> str | None:
        return None if v in options else f"must be one of {', '.join(options)}"

    return check


CLIENTS_SPEC = KeySpec("int", _range(2, None), "number of (virtual) SuperNodes")


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
    """A validated experiment spec (see the module docstring for the TOML layout).

    Attributes
    ----------
    base
        Run config shared by all runs (read-only mapping), without ``clients``.
    grid
        ``((key, (v1, v2, ...)), ...)`` in file order; the sweep is their cartesian product.
    extra_grids
        More grids (``[[extra-grid]]``), each expanded the same way and appended.
    clients
        Default number of SuperNodes (``base.clients``), overridable per grid point.
    """

    name: str
    description: str
    kind: Literal["federated", "mse"]
    backend: Literal["simulation", "deployment"]
    connection: str | None
    base: Mapping[str, RunValue]
    grid: tuple[tuple[str, tuple[RunValue, ...]], ...]
    extra_grids: tuple[tuple[tuple[str, tuple[RunValue, ...]], ...], ...]
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


_TOP_KEYS = {"seeds", "lambda-grid", "experiment", "base", "grid", "extra-grid", "plots", "mse"}
_EXPERIMENT_KEYS = {
    "name",
    "description",
    "kind",
    "backend",
    "connection",
    "run-timeout-s",
    "retries",
    "retry-delay-s",
    "num-cpus-per-client",
    "num-gpus-per-client",
}
_MSE_KEYS = {
    "center",
    "radius",
    "epsilons",
    "d",
    "grid-points",
    "samples",
    "heatmap-epsilons",
    "real-weights",
}
_REAL_KEYS = {
    "dataset",
    "model",
    "local-epochs",
    "batch-size",
    "num-partitions",
    "repeats",
    "data-seed",
}


def _where(source: str, *parts: str) -> str:
    return f"{source}: " + ".".join(p for p in parts if p)


def _table(raw: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise SpecError(f"{_where(source, key)}: expected a table [{key}], got {value!r}")
    return value


def _reject_unknown(table: Mapping[str, Any], allowed: set[str], source: str, name: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SpecError(
            f"{_where(source, name)}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


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
    if isinstance(value, bool) != isinstance(default, bool) or isinstance(value, list | dict):
        raise SpecError(
            f"{where}: expected a {type(default).__name__}, got {type(value).__name__} {value!r}"
        )
    if isinstance(default, float) and _is_int(value):
        value = float(value)  # type: ignore[arg-type]
    if type(value) is not type(default):
        raise SpecError(
            f"{where}: expected a {type(default).__name__}, got {type(value).__name__} {value!r}"
        )
    try:
        RunConfig.from_flower({key: value})
    except ConfigError as exc:
        # An error on another key comes from that key's default beside this value (e.g.
        # dataset = "cifar10" with the default empty data-dir): a combination, checked per run.
        if key in exc.errors:
            raise SpecError(f"{where}: {exc.errors[key]}") from exc
    return value  # type: ignore[return-value]


def validate_run_config(run_config: Mapping[str, RunValue], where: str) -> RunConfig:
    """Validate a complete run config with :meth:`RunConfig.from_flower` (all keys at once).

    Returns
    -------
    RunConfig
        The run's effective configuration (the defaults overridden by ``run_config``).

    Raises
    ------
    SpecError
        With every bad key of the combination, e.g. ``clients-per-round < min-clients``.
    """
    try:
        return RunConfig.from_flower(dict(run_config))
    except ConfigError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def _parse_grid(
    table: Mapping[str, Any], source: str, name: str
) -> tuple[tuple[str, tuple[RunValue, ...]], ...]:
    out: list[tuple[str, tuple[RunValue, ...]]] = []
    for key, raw_values in table.items():
        where = _where(source, name, key)
        values = raw_values if isinstance(raw_values, list) else [raw_values]
        if not values:
            raise SpecError(f"{where}: the list of values is empty")
        coerced = tuple(_coerce_run_value(key, v, where) for v in values)
        if len(set(coerced)) != len(coerced):
            raise SpecError(f"{where}: duplicate values in {list(coerced)!r}")
        out.append((key, coerced))
    return tuple(out)


def _number_list(
    raw: object, where: str, *, kind: Literal["int", "float"], check: Check | None = None
) -> tuple[Any, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{where}: expected a non-empty list, got {raw!r}")
    spec = KeySpec(kind, check, where.rsplit(".", 1)[-1])
    values = tuple(spec.coerce(v, where) for v in raw)
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: duplicate values in {list(values)!r}")
    return values


def _scalar(table: Mapping[str, Any], key: str, spec: KeySpec, where: str, default: Any) -> Any:
    if key not in table:
        return default
    return spec.coerce(table[key], f"{where}.{key}")


def _parse_mse(table: Mapping[str, Any], source: str) -> MSESpec:
    _reject_unknown(table, _MSE_KEYS, source, "mse")
    where = f"{source}: mse"
    dflt = MSESpec()
    center = _scalar(table, "center", KeySpec("float", None, "center c"), where, dflt.center)
    radius = _scalar(
        table,
        "radius",
        KeySpec("float", _range(0, None, lo_open=True), "radius r"),
        where,
        dflt.radius,
    )
    positive = _range(0, None, lo_open=True)
    epsilons = (
        _number_list(table["epsilons"], f"{where}.epsilons", kind="float", check=positive)
        if "epsilons" in table
        else dflt.epsilons
    )
    heat = (
        _number_list(
            table["heatmap-epsilons"], f"{where}.heatmap-epsilons", kind="float", check=positive
        )
        if "heatmap-epsilons" in table
        else tuple(e for e in dflt.heatmap_epsilons if e in epsilons) or epsilons[:1]
    )
    missing = [e for e in heat if e not in epsilons]
    if missing:
        raise SpecError(f"{where}.heatmap-epsilons: {missing} not in mse.epsilons {epsilons}")
    d = _scalar(table, "d", KeySpec("int", _range(1, 30), "shared bits"), where, dflt.d)
    points = _scalar(
        table, "grid-points", KeySpec("int", _range(2, 201), "grid size"), where, dflt.grid_points
    )
    samples = _scalar(
        table,
        "samples",
        KeySpec("int", _range(100, None), "draws per point"),
        where,
        dflt.samples,
    )
    real: RealWeightsSpec | None = None
    if "real-weights" in table:
        rw = table["real-weights"]
        if not isinstance(rw, Mapping):
            raise SpecError(f"{where}.real-weights: expected a table, got {rw!r}")
        _reject_unknown(rw, _REAL_KEYS, source, "mse.real-weights")
        rwh = f"{where}.real-weights"
        rd = RealWeightsSpec()
        pos = _range(1, None)
        real = RealWeightsSpec(
            dataset=_scalar(rw, "dataset", KeySpec("str", None, "dataset"), rwh, rd.dataset),
            model=_scalar(rw, "model", KeySpec("str", None, "model"), rwh, rd.model),
            local_epochs=_scalar(
                rw, "local-epochs", KeySpec("int", pos, "epochs"), rwh, rd.local_epochs
            ),
            batch_size=_scalar(rw, "batch-size", KeySpec("int", pos, "batch"), rwh, rd.batch_size),
            num_partitions=_scalar(
                rw,
                "num-partitions",
                KeySpec("int", _range(2, None), "IID partitions"),
                rwh,
                rd.num_partitions,
            ),
            repeats=_scalar(rw, "repeats", KeySpec("int", pos, "quantizations"), rwh, rd.repeats),
            data_seed=_scalar(
                rw, "data-seed", KeySpec("int", _range(0, None), "split seed"), rwh, rd.data_seed
            ),
        )
    return MSESpec(
        center=center,
        radius=radius,
        epsilons=epsilons,
        d=d,
        grid_points=points,
        samples=samples,
        heatmap_epsilons=heat,
        real_weights=real,
    )


def parse_spec(
    raw: Mapping[str, Any],
    *,
    source: str = "<spec>",
) -> ExperimentSpec:
    """Validate a parsed TOML document and return the :class:`ExperimentSpec`.

    Parameters
    ----------
    raw
        The document as returned by :func:`tomllib.loads`.
    source
        Name used in error messages (usually the file path).

    Raises
    ------
    SpecError
        For any unknown key, wrong type, out-of-range or inconsistent value.
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"raw must be a mapping, got {type(raw).__name__}")
    _reject_unknown(raw, _TOP_KEYS, source, "")

    exp = _table(raw, "experiment", source)
    if "experiment" not in raw:
        raise SpecError(f"{source}: missing the [experiment] table")
    _reject_unknown(exp, _EXPERIMENT_KEYS, source, "experiment")
    where = f"{source}: experiment"
    if "name" not in exp:
        raise SpecError(f"{where}.name: missing (it names results/<name>/)")
    name = KeySpec("str", None, "experiment name").coerce(exp["name"], f"{where}.name")
    if not _NAME_RE.match(name):
        raise SpecError(
            f"{where}.name: {name!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit (it is a folder name)"
        )
    description = _scalar(exp, "description", KeySpec("str", None, "description"), where, "")
    kind = _scalar(
        exp,
        "kind",
        KeySpec("str", _one_of(("federated", "mse")), "experiment kind"),
        where,
        "federated",
    )
    backend = _scalar(
        exp,
        "backend",
        KeySpec("str", _one_of(("simulation", "deployment")), "runtime"),
        where,
        "simulation",
    )
    connection = _scalar(exp, "connection", KeySpec("str", None, "connection"), where, None)
    if backend == "deployment" and connection is None:
        raise SpecError(f'{where}.connection: required with backend = "deployment"')
    if backend == "simulation" and connection is not None:
        raise SpecError(
            f'{where}.connection: only used with backend = "deployment"; the simulation '
            "backend makes its own local connection"
        )
    timeout = _scalar(
        exp, "run-timeout-s", KeySpec("float", _range(1, None), "seconds"), where, 3600.0
    )
    retries = _scalar(
        exp, "retries", KeySpec("int", _range(0, 10), "extra attempts of a failed run"), where, 1
    )
    retry_delay = _scalar(
        exp, "retry-delay-s", KeySpec("float", _range(0, 3600), "seconds"), where, 15.0
    )
    cpus = _scalar(exp, "num-cpus-per-client", KeySpec("int", _range(1, None), "CPUs"), where, 1)
    gpus = _scalar(
        exp, "num-gpus-per-client", KeySpec("float", _range(0, None), "GPUs"), where, 0.0
    )

    seeds_raw = raw.get("seeds", [0])
    seeds = _number_list(seeds_raw, f"{source}: seeds", kind="int", check=_range(0, 2**63 - 1))
    lambdas_raw = raw.get("lambda-grid", [1.0])
    lambdas = _number_list(
        lambdas_raw, f"{source}: lambda-grid", kind="float", check=_range(0, 1, lo_open=True)
    )

    plots = _table(raw, "plots", source)
    _reject_unknown(plots, {"figures"}, source, "plots")
    allowed_figs = FEDERATED_FIGURES if kind == "federated" else MSE_FIGURES
    figures_raw = plots.get("figures", sorted(allowed_figs))
    if not isinstance(figures_raw, list) or not all(isinstance(f, str) for f in figures_raw):
        raise SpecError(f"{source}: plots.figures: expected a list of strings, got {figures_raw!r}")
    bad = [f for f in figures_raw if f not in allowed_figs]
    if bad:
        raise SpecError(
            f"{source}: plots.figures: {bad} not available for kind = {kind!r}; "
            f"choose from {', '.join(sorted(allowed_figs))}"
        )

    base_raw = _table(raw, "base", source)
    grid_raw = _table(raw, "grid", source)
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
        mse = _parse_mse(_table(raw, "mse", source), source)
        return ExperimentSpec(
            name=name,
            description=description,
            kind="mse",
            backend=backend,
            connection=connection,
            base=MappingProxyType({}),
            grid=(),
            extra_grids=(),
            seeds=seeds,
            lambda_grid=lambdas,
            figures=tuple(figures_raw),
            run_timeout_s=timeout,
            mse=mse,
            source=Path(source) if source != "<spec>" else None,
        )
    if "mse" in raw:
        raise SpecError(f'{source}: [mse]: only used with kind = "mse"')

    base: dict[str, RunValue] = {}
    for key, value in base_raw.items():
        if isinstance(value, list):
            raise SpecError(f"{_where(source, 'base', key)}: lists go in [grid], not [base]")
        base[key] = _coerce_run_value(key, value, _where(source, "base", key))
    grid = _parse_grid(grid_raw, source, "grid")
    extras = tuple(_parse_grid(t, source, f"extra-grid[{i}]") for i, t in enumerate(extra_raw))
    for i, eg in enumerate(extras):
        if not eg:
            raise SpecError(f"{source}: extra-grid[{i}]: empty table")
    clients_val = base.pop(CLIENTS_KEY, None)
    clients = int(clients_val) if clients_val is not None else None
    swept_clients = any(k == CLIENTS_KEY for g in (grid, *extras) for k, _ in g)
    if backend == "deployment" and swept_clients:
        raise SpecError(
            f'{source}: `clients` cannot be swept with backend = "deployment": the number of '
            "clients is the number of SuperNodes connected to the SuperLink"
        )
    mechanism_set = "mechanism" in base or any(
        k == "mechanism" for g in (grid, *extras) for k, _ in g
    )
    if not mechanism_set:
        raise SpecError(f"{source}: set `mechanism` in [base] or sweep it in [grid]")
    if "num-rounds" not in base and not any(
        k == "num-rounds" for g in (grid, *extras) for k, _ in g
    ):
        raise SpecError(f"{source}: base.num-rounds: missing (rounds of every run)")
    return ExperimentSpec(
        name=name,
        description=description,
        kind="federated",
        backend=backend,
        connection=connection,
        base=MappingProxyType(base),
        grid=grid,
        extra_grids=extras,
        seeds=seeds,
        lambda_grid=lambdas,
        figures=tuple(figures_raw),
        clients=clients,
        run_timeout_s=timeout,
        retries=retries,
        retry_delay_s=retry_delay,
        num_cpus_per_client=cpus,
        num_gpus_per_client=gpus,
        source=Path(source) if source != "<spec>" else None,
    )


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a TOML spec file (see :func:`parse_spec`).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    SpecError
        If the file is not valid TOML or fails validation.
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: invalid TOML: {exc}") from exc
    return parse_spec(raw, source=str(p))

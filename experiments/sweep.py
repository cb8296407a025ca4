"""A spec expanded into runs, run ids from what a run computes, a run folder's state, and the
execution of one run.

A federated spec expands to ``settings x lambda-grid x seeds`` runs; the settings are the
cartesian products of ``[grid]`` and then of each ``[[extra-grid]]`` over ``[base]``, a repeated
setting expanded once. With ``lambda-seeds`` (a subset of the seeds), every setting's runs on
those seeds come first (they choose its lambda), then its runs on the other seeds, of which only
those at the chosen lambda are needed (:func:`needed_runs`). A run is addressed by its result config
(:meth:`corbin_fl.app.config.AppConfig.result_config`) and its number of clients: its id is
``<mechanism>-eps<e>-d<d>-p<p>-n<clients>-lr<lambda>-s<seed>-<hash>`` (the first 10 hex digits
of SHA-256 over their canonical JSON) and it lives in the pool ``<results>/runs/<run-id>/``.
A run is done when ``summary.json`` carries the runner's complete ``"run"`` record with this id
and hash (written last, atomically) and ``metrics.jsonl`` has one finite row per round. A run
executes on Flower's simulation runtime (:func:`execute_run`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import enum
import hashlib
import itertools
import json
import logging
import math
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import corbin_fl
from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.deploy import flower, processes
from corbin_fl.deploy.follow import read_jsonl
from corbin_fl.deploy.run import LocalRunOptions, run_simulation
from corbin_fl.experiments.host import host_record
from corbin_fl.experiments.spec import CLIENTS_KEY, ExperimentSpec, RunValue, SpecError
from corbin_fl.fsio import atomic_write_json

logger = logging.getLogger(__name__)

POOL_DIR = "runs"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
RUN_RECORD_KEY = "run"
"""Key of the runner's record in a run's ``summary.json``."""
APP_OUT_DIR = "app"
FAILED_FILE = "failed.json"
READY_TIMEOUT_S = 120.0
"""Seconds a simulation SuperLink has to start."""
PATH_KEYS: tuple[str, ...] = ("data-dir",)
"""Run-config keys holding a path; a relative one is resolved where the command runs."""
_ID_PARTS = (
    *(("mechanism", ""), ("epsilon", "eps"), ("d", "d"), ("dropout-prob", "p")),
    *((CLIENTS_KEY, "n"), ("global-lr", "lr"), ("seed", "s")),
)


@dataclass(frozen=True)
class Run:
    """One federated run: ``run_config`` the keys the spec sets (with ``seed`` and
    ``global-lr``), ``config`` its result config, ``clients`` the number of SuperNodes."""

    run_id: str
    run_config: Mapping[str, RunValue]
    clients: int
    config_hash: str
    config: Mapping[str, RunValue]
    selects: bool = True
    """Whether this run's seed is one lambda is chosen on (``lambda-seeds``; all by default)."""
    counterpart: str | None = None
    """The setting key of its counterpart in the spec of ``[lambda-from]`` when its grid
    borrows lambda (then it does not select, and runs only at the lambda chosen there)."""

    @property
    def setting_key(self) -> str:
        """Canonical JSON of the setting: the result config without seed and lambda, with the
        number of clients (the runs that share it differ only in seed and lambda)."""
        setting = {k: v for k, v in self.config.items() if k not in ("seed", "global-lr")}
        return canonical_json({"config": setting, "clients": self.clients})


def canonical_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, floats by ``repr``) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, RunValue], clients: int) -> str:
    """SHA-256 hex digest of a result config on ``clients`` clients."""
    payload = canonical_json({"config": dict(config), "clients": clients})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def make_run_id(config: Mapping[str, RunValue], clients: int) -> str:
    """The run id of a result config on ``clients`` clients (see the module docstring)."""

    def part(value: RunValue) -> str:
        text = repr(value).removesuffix(".0") if isinstance(value, float) else str(value)
        return re.sub(r"[^A-Za-z0-9.]+", "_", text)

    merged = {**config, CLIENTS_KEY: clients}
    parts = [f"{prefix}{part(merged[key])}" for key, prefix in _ID_PARTS if key in merged]
    return "-".join([*parts, config_hash(config, clients)[:10]])


def expand_runs(spec: ExperimentSpec) -> list[Run]:
    """The runs of a federated spec, every run's whole configuration validated by
    :class:`AppConfig` before anything runs (:class:`SpecError` otherwise). With ``clients``
    virtual SuperNodes, ``min-clients`` defaults to ``clients`` (every round waits for all)."""
    if spec.kind != "federated":
        raise ValueError(f"only federated specs expand into runs, got kind={spec.kind!r}")
    seen: set[str] = set()
    runs: list[Run] = []
    later: list[Run] = []  # the runs on the seeds that do not choose lambda, or borrow it
    counterparts = _Counterparts(spec)
    for index, grid in enumerate((spec.grid, *spec.extra_grids)):
        keys = [k for k, _ in grid]
        for combo in itertools.product(*(values for _, values in grid)):
            cfg: dict[str, RunValue] = {**spec.base, **dict(zip(keys, combo, strict=True))}
            n = cfg.pop(CLIENTS_KEY, spec.clients)
            if (key := canonical_json({"c": cfg, "n": n})) in seen:
                continue
            seen.add(key)
            if n is None:
                raise SpecError(
                    f"{spec.source or spec.name}: base.clients: required (the number of virtual "
                    "SuperNodes), or sweep it in [grid]"
                )
            cfg.setdefault("min-clients", n := int(n))
            lambdas, counterpart = spec.lambdas(index), None
            if spec.borrows(index):
                counterpart, lambdas = counterparts.find(cfg, n)
            for lam, seed in itertools.product(lambdas, spec.seeds):
                run_config = {**cfg, "global-lr": float(lam), "seed": int(seed)}
                where = f"{spec.name}: setting {canonical_json(run_config)}"
                config = MappingProxyType(_result_config(run_config, where))
                run_id, digest = make_run_id(config, n), config_hash(config, n)
                selects = counterpart is None and int(seed) in spec.selection_seeds
                run = Run(
                    run_id, MappingProxyType(run_config), n, digest, config, selects, counterpart
                )
                (runs if selects else later).append(run)
    counterparts.check_used(later)
    return runs + later


def _result_config(run_config: Mapping[str, RunValue], where: str) -> Mapping[str, RunValue]:
    try:
        return AppConfig.from_flower(run_config).result_config()
    except ConfigError as exc:
        raise SpecError(f"{where}: {exc}") from exc


class _Counterparts:
    """The settings of a spec's ``[lambda-from]`` spec, found by what a borrowing setting must
    share with its counterpart (:class:`corbin_fl.experiments.spec.LambdaFrom`)."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec, self.where = spec, spec.source or spec.name
        self.index: dict[str, list[tuple[str, float]]] = {}
        if (borrow := spec.lambda_from) is None:
            return
        for r in expand_runs(borrow.spec):
            key = self.match(r.config, r.clients, lambda m: m)
            self.index.setdefault(key, []).append((r.setting_key, float(r.run_config["global-lr"])))

    def check_used(self, runs: Sequence[Run]) -> None:
        """:class:`SpecError` for a ``mechanism`` entry no borrowing setting has (a typo)."""
        if (borrow := self.spec.lambda_from) is None:
            return
        used = {str(r.config["mechanism"]) for r in runs if r.counterpart is not None}
        if unused := sorted(set(borrow.mechanism) - used):
            raise SpecError(
                f"{self.where}: lambda-from.mechanism: {unused} name no mechanism of a grid that "
                "borrows lambda"
            )

    def match(self, config: Mapping[str, RunValue], clients: int, rename: Any) -> str:
        """What a setting and its counterpart agree on: the result config without seed,
        lambda and the ignored keys, the mechanism renamed by ``rename``, and the clients."""
        assert self.spec.lambda_from is not None
        skip = {"seed", "global-lr", *self.spec.lambda_from.ignore}
        setting = {k: v for k, v in config.items() if k not in skip}
        setting["mechanism"] = rename(setting["mechanism"])
        return canonical_json({"config": setting, "clients": clients})

    def find(self, cfg: Mapping[str, RunValue], clients: int) -> tuple[str, tuple[float, ...]]:
        """The counterpart's setting key and lambda candidates of the setting ``cfg`` on
        ``clients`` clients; :class:`SpecError` if the other spec has none, or several."""
        borrow = self.spec.lambda_from
        assert borrow is not None
        where = f"{self.where}: setting {canonical_json(cfg)}"
        config = _result_config({**cfg, "global-lr": 1.0, "seed": 0}, where)
        found = self.index.get(self.match(config, clients, borrow.counterpart_mechanism), [])
        if len(keys := {key for key, _ in found}) != 1:
            what = "no setting that agrees" if not keys else f"{len(keys)} settings that agree"
            raise SpecError(
                f"{where}: [lambda-from]: {borrow.path} has {what} with it on every "
                f"key but {['seed', 'global-lr', *borrow.ignore]} (its mechanism as "
                f"{borrow.counterpart_mechanism(str(cfg['mechanism']))!r}); exactly one is needed"
            )
        return keys.pop(), tuple(sorted({lam for _, lam in found}))


def choosing_runs(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Setting key -> the runs of that setting that choose its lambda (``Run.selects``), in
    ``runs``' order: its lambda grid on the selection seeds."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        if r.selects:
            out.setdefault(r.setting_key, []).append(r)
    return out


def needed_runs(runs: Sequence[Run], chosen: Mapping[str, float]) -> list[Run]:
    """The runs a table needs: every run that chooses lambda, and of the others those at their
    setting's chosen lambda (``chosen``: setting key -> lambda, for the settings whose lambda
    is chosen); a setting not in ``chosen`` keeps all its runs (not yet known which)."""
    return [
        r
        for r in runs
        if r.selects
        or r.setting_key not in chosen
        or math.isclose(float(r.run_config["global-lr"]), chosen[r.setting_key])
    ]


def table_size(spec: ExperimentSpec, runs: Sequence[Run]) -> int:
    """How many runs the table needs in all: the lambda-choosing runs, plus each setting's
    other seeds at its one chosen lambda, plus each borrowing setting's seeds at the lambda of
    its counterpart."""
    settings = {r.setting_key for r in runs if r.counterpart is None}
    borrowed = {(r.setting_key, r.run_config["seed"]) for r in runs if r.counterpart is not None}
    return (
        sum(r.selects for r in runs) + len(settings) * len(spec.confirmation_seeds) + len(borrowed)
    )


class RunState(enum.Enum):
    """Resume state of a run folder."""

    MISSING = "missing"
    PARTIAL = "partial"
    DONE = "done"
    WAITING = "waiting"
    """(a plan's state, never a folder's) a run on a seed that does not choose lambda, while its
    setting's lambda is not chosen yet: it runs if the lambda chosen is its own."""


def run_state(run_dir: Path, run: Run) -> RunState:
    """Whether ``run`` is done, partial or missing in ``run_dir`` (the module docstring)."""
    if not Path(run_dir).exists():
        return RunState.MISSING
    try:
        record = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))[RUN_RECORD_KEY]
        ok = (record["run_id"], record["config_hash"]) == (run.run_id, run.config_hash)
        ok = ok and record["complete"] is True
        rows = read_jsonl(run_dir / METRICS_FILE)
    except (OSError, ValueError, KeyError, TypeError):
        return RunState.PARTIAL
    finite = all(
        isinstance(v := row.get(key), int | float) and math.isfinite(v)
        for row in rows
        for key in ("test_accuracy", "val_accuracy")
    )
    done = ok and finite and len(rows) == int(run.config["num-rounds"])
    return RunState.DONE if done else RunState.PARTIAL


class RunFailedError(RuntimeError):
    """A run ended without complete outputs; the message says why (with a log tail)."""


def find_app_dir() -> Path:
    """This checkout's Flower app (``pyproject.toml`` with ``[tool.flwr.app.config]``);
    ``FileNotFoundError`` outside a source checkout (pass ``--app`` then)."""
    if flower.app_config(root := Path(corbin_fl.__file__).resolve().parents[1]):
        return root
    raise FileNotFoundError(
        f"no Flower app found at {root} (expected pyproject.toml with [tool.flwr.app]); "
        "run from a source checkout or pass --app <folder>"
    )


def check_app_accepts(app_dir: Path, keys: set[str]) -> None:
    """``ValueError`` unless the app's ``[tool.flwr.app.config]`` declares every key of
    ``keys`` (``flwr run --run-config`` overrides only declared keys)."""
    if missing := sorted(keys - set(flower.app_config(app_dir))):
        raise ValueError(
            f"{Path(app_dir) / 'pyproject.toml'}: [tool.flwr.app.config] does not declare "
            f"{', '.join(missing)}; flwr run --run-config can only override declared keys"
        )


@dataclass(frozen=True)
class Submission:
    """How one ``flwr run`` ended: ``ok`` (exit 0 and ``finished:completed``), ``reason``
    ("completed" or why not), Flower's run id and final status when known."""

    ok: bool
    reason: str
    flwr_run_id: int | None
    status: str | None


Backend = Callable[..., Submission]
"""Executes one run of the app: ``backend(run, run_config, out_dir, timeout_s=...,
on_round=...)`` runs ``run_config`` (plus ``out-dir = out_dir``), blocks until the run ends and
calls ``on_round(rounds_done)`` as it goes."""


def simulation_backend(app_dir: Path, spec: ExperimentSpec) -> Backend:
    """Flower's simulation runtime through :func:`deploy.run.run_simulation`: a private
    SuperLink per run, ``run.clients`` virtual SuperNodes, each with the spec's CPUs and GPUs
    of Ray."""
    federation: dict[str, Any] = {"client-resources-num-cpus": spec.num_cpus_per_client}
    if spec.num_gpus_per_client > 0:
        federation["client-resources-num-gpus"] = float(spec.num_gpus_per_client)

    def execute(
        run: Run, config: Mapping[str, Any], out: Path, *, timeout_s: float, on_round: Any
    ) -> Submission:
        options = LocalRunOptions(
            app_dir=Path(app_dir).resolve(), out_dir=Path(out), num_clients=int(run.clients),
            run_config=dict(config), timeout=timeout_s, ready_timeout=READY_TIMEOUT_S,
            federation_config=federation,
        )  # fmt: skip
        result = run_simulation(options, lambda state: on_round(len(state.metrics)))
        return Submission(result.ok, result.reason, result.run_id, result.status)

    return execute


def app_run_config(run_config: Mapping[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The run config handed to the app, :data:`PATH_KEYS` resolved against ``cwd`` (the app's
    processes run elsewhere); the run's id keeps the value as the spec wrote it."""
    out = dict(run_config)
    for key in PATH_KEYS:
        if isinstance(value := out.get(key), str) and value:
            path = Path(value).expanduser()
            out[key] = str(
                path if path.is_absolute() else (Path(cwd or Path.cwd()) / path).resolve()
            )
    return out


def execute_run(
    run: Run,
    backend: Backend,
    run_dir: Path,
    *,
    experiment: str,
    timeout_s: float,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Execute ``run`` from scratch in ``run_dir`` (the app gets the whole result config and
    ``out-dir = run_dir/app``), copy its ``metrics.jsonl`` and return its ``summary.json``,
    written last, atomically, with the runner's ``"run"`` record (the machine it ran on
    included, :func:`~corbin_fl.experiments.host.host_record`); ``RunFailedError`` (and
    ``failed.json``) if it left no complete outputs."""
    run_dir = Path(run_dir).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (out_dir := run_dir / APP_OUT_DIR).mkdir(parents=True)
    started, t0 = _dt.datetime.now(_dt.UTC), time.monotonic()
    config = app_run_config({**run.config, **run.run_config})
    sub = backend(run, config, out_dir, timeout_s=timeout_s, on_round=on_round or (lambda _: None))
    seconds = time.monotonic() - t0

    def fail(reason: str) -> RunFailedError:
        log = out_dir / "logs" / "flwr-run.log"
        try:  # the last non-empty lines of the log, ANSI colours stripped
            text = processes.ANSI_RE.sub("", log.read_text(encoding="utf-8", errors="replace"))
            tail = "\n".join([ln for ln in text.splitlines() if ln.strip()][-15:])
        except OSError:
            tail = ""
        atomic_write_json(
            run_dir / FAILED_FILE,
            {"run_id": run.run_id, "reason": reason, "flwr_run_id": sub.flwr_run_id}
            | {"status": sub.status, "seconds": seconds, "log_tail": tail},
        )
        more = f"\n--- last lines of {log} ---\n{tail}" if tail else ""
        return RunFailedError(f"run {run.run_id}: {reason}{more}")

    if not sub.ok:
        raise fail(sub.reason)
    try:
        rows = read_jsonl(out_dir / METRICS_FILE)
        app_summary = json.loads((out_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise fail(f"no readable {APP_OUT_DIR}/ outputs: {exc}") from None
    if len(rows) != (num_rounds := int(run.run_config["num-rounds"])):
        raise fail(f"{APP_OUT_DIR}/{METRICS_FILE} has {len(rows)} rows, expected {num_rounds}")
    if not isinstance(app_summary, dict):
        raise fail(f"{APP_OUT_DIR}/{SUMMARY_FILE} is not a JSON object")
    shutil.copyfile(out_dir / METRICS_FILE, run_dir / METRICS_FILE)
    record: dict[str, Any] = {"run_id": run.run_id, "config_hash": run.config_hash}
    record |= {"experiment": experiment, "run_config": dict(run.run_config)}
    record |= {"config": dict(run.config), "clients": run.clients}
    record |= {"flwr_run_id": sub.flwr_run_id, "status": sub.status}
    record |= {"started_at": started.isoformat(), "seconds": seconds, "complete": True}
    record |= {"host": host_record()}
    atomic_write_json(run_dir / SUMMARY_FILE, summary := {**app_summary, RUN_RECORD_KEY: record})
    with contextlib.suppress(FileNotFoundError):
        (run_dir / FAILED_FILE).unlink()
    return summary

"""``corbin-fl local`` and ``corbin-fl simulate``: start a deployment, submit one run with
``flwr run``, follow it, inject faults on schedule, stop everything.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from corbin_fl import registry
from corbin_fl.app.config import AppConfig
from corbin_fl.client.policy import Policy, PolicyError
from corbin_fl.config import ConfigError
from corbin_fl.deploy.flower import (
    COMPLETED_STATUS,
    RUN_ID_RE,
    MissingDependencyError,
    app_config,
    simulation_extra_missing,
)
from corbin_fl.deploy.follow import RUN_FILES, JsonlTail, RunProgress, RunResult, as_int, read_json
from corbin_fl.deploy.local import LocalDeployment
from corbin_fl.deploy.pace import PACE_FACTOR, PACE_SLACK_S, QuietStream, derived_deadline
from corbin_fl.deploy.processes import (
    LauncherError,
    ManagedProcess,
    ProcessRef,
    cmdline,
    descendants,
    has_proc,
    process_ref,
    signal_ref,
    terminate_as_interrupt,
)
from corbin_fl.mechanisms.validate import require, why_at_least, why_positive

logger = logging.getLogger(__name__)


# ====================================================================== small value types
@dataclass(frozen=True)
class KillSpec:
    """A fault to inject: SIGKILL the SuperNode of ``partition`` during ``round``.

    Attributes
    ----------
    partition : int
        ``partition-id`` of the SuperNode (its node config), ``0 <= partition < N``.
    round : int
        Round (1-based) during which it is killed: ``delay`` seconds after the ServerApp's
        ``round_start`` event of that round.
    """

    partition: int
    round: int

    def __post_init__(self) -> None:
        for name in ("partition", "round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"KillSpec.{name} must be an int, got {type(value).__name__}")
        require("KillSpec.partition", why_at_least(self.partition, 0))
        require("KillSpec.round", why_at_least(self.round, 1))

    @classmethod
    def parse(cls, text: str) -> KillSpec:
        """Parse ``"PARTITION@ROUND"`` (e.g. ``"1@2"``).

        Raises
        ------
        ValueError
            If ``text`` is not two non-negative integers separated by ``@``.
        """
        if not isinstance(text, str):
            raise TypeError(f"kill spec must be a str, got {type(text).__name__}")
        match = re.fullmatch(r"\s*(\d+)\s*@\s*(\d+)\s*", text)
        if match is None:
            raise ValueError(f"kill spec must look like PARTITION@ROUND (e.g. 1@2), got {text!r}")
        return cls(partition=int(match.group(1)), round=int(match.group(2)))


@dataclass(frozen=True)
class LocalRunOptions:
    """Everything :func:`run_local` needs.

    Attributes
    ----------
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    out_dir : Path
        Output folder; becomes the run config's ``out_key`` (absolute) and holds ``logs/``.
    num_clients : int
        SuperNodes (deployment) or virtual SuperNodes (simulation).
    run_config : Mapping[str, Any]
        Run-config overrides (already merged); ``out_key`` is set here.
    kills : tuple[KillSpec, ...]
        Faults to inject (deployment only).
    kill_delay : float
        Seconds after a ``round_start`` event before the kill.
    timeout : float or None
        Seconds the run may take from ``flwr run`` to its end (all rounds); after that it is
        stopped (``flwr stop``) and counted as failed. ``None`` (the default): no fixed limit;
        once a round has ended the limit derives from the run's own pace
        (:func:`derived_deadline`), and before that the ServerApp's stage timeouts apply.
    ready_timeout : float
        Seconds for start-up (SuperLink health, all SuperNodes online), on top of ``timeout``.
    keep_logs : bool
        Keep ``out_dir/logs`` after a successful run (always kept after a failure).
    node_config : Mapping[str, Any]
        Extra node config for every SuperNode.
    federation_config : Mapping[str, Any]
        Extra ``--federation-config`` entries (simulation only).
    flwr_home : Path | None
        ``FLWR_HOME`` to use (a fresh temporary folder, removed at the end, when None).
    out_key : str
        Run-config key that tells the ServerApp where to write its files.
    require_summary : bool
        Count a run without ``summary.json`` as failed.
    """

    app_dir: Path
    out_dir: Path
    num_clients: int = 4
    run_config: Mapping[str, Any] = field(default_factory=dict)
    kills: tuple[KillSpec, ...] = ()
    kill_delay: float = 1.0
    timeout: float | None = None
    ready_timeout: float = 120.0
    keep_logs: bool = False
    node_config: Mapping[str, Any] = field(default_factory=dict)
    federation_config: Mapping[str, Any] = field(default_factory=dict)
    flwr_home: Path | None = None
    out_key: str = "out-dir"
    require_summary: bool = True

    def validate(self, *, simulation: bool = False) -> None:
        """Raise ValueError/TypeError on an inconsistent option set."""
        if not (Path(self.app_dir) / "pyproject.toml").is_file():
            raise ValueError(f"app_dir has no pyproject.toml: {self.app_dir}")
        if isinstance(self.num_clients, bool) or not isinstance(self.num_clients, int):
            raise TypeError(f"num_clients must be an int, got {type(self.num_clients).__name__}")
        require("num_clients", why_at_least(self.num_clients, 1))
        for name in ("timeout", "ready_timeout"):
            value = getattr(self, name)
            if not (value is None and name == "timeout"):
                require(name, why_positive(value))
        require("kill_delay", why_at_least(self.kill_delay, 0))
        for kill in self.kills:
            if not isinstance(kill, KillSpec):
                raise TypeError(f"kills must be KillSpec, got {type(kill).__name__}")
            if kill.partition >= self.num_clients:
                raise ValueError(
                    f"cannot kill partition {kill.partition}: only {self.num_clients} clients "
                    f"(partitions 0..{self.num_clients - 1})"
                )
        out = Path(self.out_dir).expanduser()
        reused = [n for n in RUN_FILES if (out / n).exists()]
        if reused:
            raise ValueError(
                f"out_dir {out} already holds a run ({', '.join(reused)}); choose a new folder"
            )
        if simulation and self.kills:
            raise ValueError("--kill-client needs real SuperNodes (use `local`, not `simulate`)")
        if self.out_key in self.run_config and str(self.run_config[self.out_key]) != str(
            Path(self.out_dir).resolve()
        ):
            raise ValueError(f"run_config[{self.out_key!r}] conflicts with out_dir")
        self._check_feasible(simulation=simulation)
        if simulation and (missing := simulation_extra_missing()) is not None:
            raise MissingDependencyError(missing)

    def nodes(self, *, simulation: bool = False) -> int:
        """SuperNodes the run gets: ``num_clients``, or the simulation's ``num-supernodes``."""
        if simulation:
            value = as_int(self.federation_config.get("num-supernodes"))
            if value is not None:
                return value
        return self.num_clients

    def _check_feasible(self, *, simulation: bool) -> None:
        """Refuse settings no run can satisfy, before anything starts.

        The effective run config is the app's ``[tool.flwr.app.config]`` overridden by
        ``run_config``. Where the app declares them, ``min-clients`` (nodes the ServerApp waits
        for), ``clients-per-round`` (nodes sampled per round, 0 = all) and ``num-rounds`` are
        checked against the ``N`` SuperNodes and the ``--kill-client`` rounds.

        Raises
        ------
        ValueError
            Naming the setting, the number it conflicts with and the fix.
        """
        flag = "--federation-config num-supernodes" if simulation else "--clients"
        n = self.nodes(simulation=simulation)
        require(flag, why_at_least(n, 1))
        effective = {**app_config(self.app_dir), **self.run_config}
        min_clients = as_int(effective.get("min-clients"))
        if min_clients is not None and n < min_clients:
            raise ValueError(
                f"{flag} {n} is fewer than min-clients = {min_clients}: the ServerApp would wait "
                f"for nodes that never come; use {flag} {min_clients} or more, or "
                f'--run-config "min-clients={n}"'
            )
        if effective.get("secure-aggregation") is True and n < 3:
            raise ValueError(
                f"secure aggregation needs at least 3 clients, got {flag} {n}: with 2, each "
                f"client's update is the sum minus the other's; use {flag} 3 or more, or "
                '--run-config "secure-aggregation=false"'
            )
        per_round = as_int(effective.get("clients-per-round"))
        if per_round is not None and per_round > n:
            raise ValueError(
                f"clients-per-round = {per_round} but only {n} SuperNodes ({flag} {n}): use "
                f"{flag} {per_round} or more, or clients-per-round <= {n} (0 = all of them)"
            )
        rounds = as_int(effective.get("num-rounds"))
        late = [k for k in self.kills if rounds is not None and k.round > rounds]
        if late:
            raise ValueError(
                f"--kill-client {late[0].partition}@{late[0].round}: the run has only {rounds} "
                f"round(s), so this kill would never happen; use a round in 1..{rounds}"
            )
        self._check_policy(effective)

    def _check_policy(self, effective: Mapping[str, Any]) -> None:
        """Refuse a run that the nodes this launcher starts would refuse by their privacy policy
        (``--node-config`` may set a stricter ``corbin-max-epsilon`` than the run's ``epsilon``):
        every round would be refused, so nothing starts.

        Raises
        ------
        ValueError
            The node's reason, which names the run's setting and the node's limit.
        """
        if "mechanism" not in effective:  # another app: its nodes' policy is its own business
            return
        try:
            cfg = AppConfig.from_flower(
                {k: effective[k] for k in registry.PARAM_KEYS if k in effective}
            )
            Policy.from_node({**node_policy(effective), **self.node_config}).check(cfg)
        except ConfigError:
            return  # a bad run config is reported by its own check, with every bad key
        except PolicyError as exc:
            raise ValueError(
                f"the SuperNodes this command starts would refuse the run: {exc}"
            ) from exc


def node_policy(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The privacy policy of the SuperNodes this launcher starts (``client/policy.py``).

    The user who runs ``corbin-fl local`` / ``simulate`` operates the server and every node at
    once, so the nodes admit exactly the run's mechanism, ``epsilon`` and ``delta`` and nothing
    weaker; ``--node-config`` entries override these. Nodes started by anyone else (compose
    files, separate machines) keep their own policy.
    """
    out: dict[str, Any] = {}
    if "mechanism" in run_config:
        out["corbin-mechanisms"] = str(run_config["mechanism"])
    if "epsilon" in run_config:
        out["corbin-max-epsilon"] = float(run_config["epsilon"])
    if "delta" in run_config:
        out["corbin-max-delta"] = float(run_config["delta"])
    if run_config.get("secure-aggregation") is True:  # and nothing weaker (client/policy.py)
        out["corbin-require-secure-aggregation"] = True
    return out


def policy_env(node_config: Mapping[str, Any]) -> dict[str, str]:
    """The ``CORBIN_*`` environment variables of the ``corbin-*`` keys of ``node_config``."""
    return {
        key.upper().replace("-", "_"): str(value)
        for key, value in node_config.items()
        if key.startswith("corbin-")
    }


def run_local(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None = None,
) -> RunResult:
    """Deploy the app on loopback with real SuperLink/SuperNode processes and run it once.

    Steps: start the SuperLink on a free port (``/health`` readiness), start one SuperNode per
    client (each on its own free Runtime API port, ``partition-id=i num-partitions=N``), wait
    until all are ``online``, write the ``FLWR_HOME`` connection, ``flwr run <app> <conn>
    --stream --run-config <out_dir>/run-config.toml``, follow ``events.jsonl``/``metrics.jsonl``
    (calling ``progress`` about four times a second), SIGKILL the scheduled SuperNodes, and stop
    every process at the end.

    Returns
    -------
    RunResult
        ``ok`` is True iff ``flwr run`` exited 0, Flower reports ``finished:completed`` and (with
        ``require_summary``) ``summary.json`` exists. Never raises for a failed run, only for
        invalid options or an interrupt (KeyboardInterrupt propagates after cleanup).
    """
    options.validate()
    return _run(options, progress, simulation=False)


def run_simulation(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None = None,
) -> RunResult:
    """Run the app on Flower's simulation runtime (Ray) with ``num_clients`` virtual SuperNodes.

    The managed simulation SuperLink that ``flwr run`` would start detached for a ``:local:``
    connection is started by us instead (same flags, but on a free port announced to ``flwr``
    through ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``), so it is stopped at the end like every
    other process. ``--federation-config "num-supernodes=N ..."`` sizes the federation.
    """
    options.validate(simulation=True)
    return _run(options, progress, simulation=True)


@dataclass
class _Launch:
    """One launch's folders, files and live progress (what :func:`_run`'s jobs share).

    Attributes
    ----------
    out_dir, logs_dir : Path
        The run's output folder and its ``logs`` folder (both created).
    flwr_home : Path
        ``FLWR_HOME`` of the launch; ``own_home`` when it is a temporary folder of ours.
    run_config_path : Path
        ``<out_dir>/run-config.toml``: the run config ``flwr run`` submits.
    state : RunProgress
        The live progress, handed to ``progress`` at each change.
    progress : Callable[[RunProgress], None] or None
        The caller's display.
    """

    out_dir: Path
    logs_dir: Path
    flwr_home: Path
    own_home: bool
    run_config_path: Path
    state: RunProgress
    progress: Callable[[RunProgress], None] | None

    def notify(self) -> None:
        """Hand the progress to the display; a broken display does not break the run."""
        if self.progress is not None:
            try:
                self.progress(self.state)
            except Exception:  # a broken display must not break the run
                logger.exception("progress callback failed")

    def step(self, what: str) -> None:
        """The start-up step now waited for (shown by the display)."""
        self.state.waiting = what
        self.notify()


def _run(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None,
    *,
    simulation: bool,
) -> RunResult:
    """Shared body of :func:`run_local` and :func:`run_simulation` (cleanup in ``finally``).

    Its jobs: prepare the folders and the run config, deploy, submit and follow (with the kills
    on schedule), stop everything and judge the result."""
    t0 = time.monotonic()
    launch = _prepare(options, progress, simulation=simulation)
    deployment = _deploy(options, launch, simulation=simulation)
    reason = "completed"
    ok = False
    status: str | None = None
    interrupted = False
    try:
        reason, ok, status = _start_and_follow(deployment, options, launch, simulation=simulation)
    except KeyboardInterrupt:
        interrupted = True
        reason = "interrupted"
        ok = False
        raise
    finally:
        ok, reason, summary, processes, keep = _stop(
            deployment, options, launch, ok, reason, interrupted, simulation=simulation
        )
    state = launch.state
    return RunResult(
        ok=ok,
        reason=reason,
        out_dir=launch.out_dir,
        run_id=state.run_id,
        status=status,
        events=list(state.events),
        metrics=list(state.metrics),
        summary=summary,
        killed=list(state.killed),
        node_ids=dict(state.node_ids),
        processes=processes,
        logs_dir=launch.logs_dir if keep else None,
        wall_seconds=time.monotonic() - t0,
        exit_code=0 if ok else 1,
    )


def _prepare(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None,
    *,
    simulation: bool,
) -> _Launch:
    """The launch's folders (output, logs, ``FLWR_HOME``: a temporary one unless given), its
    progress and ``run-config.toml`` (the options' run config with the output folder)."""
    out_dir = Path(options.out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    own_home = options.flwr_home is None
    flwr_home = (
        Path(options.flwr_home)
        if options.flwr_home is not None
        else Path(tempfile.mkdtemp(prefix="corbin-fl-home-"))
    )
    rounds = options.run_config.get("num-rounds", app_config(options.app_dir).get("num-rounds"))
    state = RunProgress(num_rounds=as_int(rounds), num_clients=options.nodes(simulation=simulation))
    run_config = {**options.run_config, options.out_key: str(out_dir)}
    run_config_path = out_dir / "run-config.toml"
    run_config_path.write_text(tomli_w.dumps(run_config))
    return _Launch(out_dir, logs_dir, flwr_home, own_home, run_config_path, state, progress)


def _deploy(options: LocalRunOptions, launch: _Launch, *, simulation: bool) -> LocalDeployment:
    """The (not yet started) deployment: a SuperLink and the SuperNodes (none in simulation),
    whose privacy policy admits exactly this run (:func:`node_policy`, then ``--node-config``)."""
    policy = node_policy({**app_config(options.app_dir, strict=False), **options.run_config})
    deployment = LocalDeployment(
        0 if simulation else options.num_clients,
        launch.logs_dir,
        launch.flwr_home,
        ready_timeout=options.ready_timeout,
        node_config={**policy, **options.node_config},
        simulation=simulation,
    )
    if simulation:  # the simulation's virtual nodes have no node config: the environment
        deployment.registry.env.update(policy_env({**policy, **options.node_config}))
    return deployment


def _start_and_follow(
    deployment: LocalDeployment, options: LocalRunOptions, launch: _Launch, *, simulation: bool
) -> tuple[str, bool, str | None]:
    """Start the deployment, then submit the run and follow it to its end.

    Returns ``(reason, ok, status)`` as :func:`_submit_and_follow`; a failed start-up is
    ``("start-up failed: ...", False, None)``. A SIGTERM arrives as KeyboardInterrupt."""
    state = launch.state
    try:
        with terminate_as_interrupt():
            launch.notify()
            try:
                deployment.start(on_step=launch.step)
            except LauncherError as exc:
                raise _StartupError(f"start-up failed: {exc}") from exc
            state.node_ids = dict(deployment.node_ids)
            state.phase, state.waiting = "ready", ""
            launch.notify()
            return _submit_and_follow(
                deployment,
                options,
                state,
                launch.run_config_path,
                launch.notify,
                simulation=simulation,
            )
    except _StartupError as exc:
        return str(exc), False, None


def _stop(
    deployment: LocalDeployment,
    options: LocalRunOptions,
    launch: _Launch,
    ok: bool,
    reason: str,
    interrupted: bool,
    *,
    simulation: bool,
) -> tuple[bool, str, dict[str, Any] | None, list[ProcessRef], bool]:
    """Stop every process of the launch and judge the result.

    Returns ``(ok, reason, summary, processes, keep)``: a run without the required
    ``summary.json`` fails; ``keep`` tells whether the process logs are kept (asked for, a failed
    or an interrupted run); a temporary ``FLWR_HOME`` is removed."""
    state = launch.state
    state.phase = "stopping"
    launch.notify()
    deployment.registry.snapshot()
    deployment.close()
    processes = deployment.registry.all_seen()
    if simulation:
        _stop_stray_simulation_superlinks(launch.flwr_home)
    summary = read_json(launch.out_dir / "summary.json")
    if ok and options.require_summary and summary is None:
        ok, reason = False, "the ServerApp wrote no summary.json"
    state.phase = "finished" if ok else "failed"
    state.message = reason
    launch.notify()
    if launch.own_home:
        shutil.rmtree(launch.flwr_home, ignore_errors=True)
    keep = options.keep_logs or not ok or interrupted
    if not keep:
        shutil.rmtree(launch.logs_dir, ignore_errors=True)
    else:
        logger.info("process logs kept in %s", launch.logs_dir)
    return ok, reason, summary, processes, keep


class _StartupError(Exception):
    """Internal: start-up failed, the reason is already recorded."""


class _KillSchedule:
    """The kills of a run: each is armed when its round starts and due ``delay`` seconds later."""

    def __init__(self, kills: Sequence[KillSpec], delay: float) -> None:
        self.pending: dict[KillSpec, float | None] = dict.fromkeys(kills)
        self.delay = delay

    def round_started(self, rnd: int, at: float) -> None:
        for spec, due in self.pending.items():
            if spec.round == rnd and due is None:
                self.pending[spec] = at + self.delay

    def due(self, now: float) -> list[KillSpec]:
        out = [spec for spec, at in self.pending.items() if at is not None and now >= at]
        for spec in out:
            del self.pending[spec]
        return out


class _RunFiles:
    """The new lines of the ServerApp's ``events.jsonl`` and ``metrics.jsonl``, read into the
    progress ``state`` (rounds, stages, drops) and the kill schedule."""

    def __init__(self, out_dir: Path, state: RunProgress, kills: _KillSchedule) -> None:
        self.events = JsonlTail(out_dir / "events.jsonl")
        self.metrics = JsonlTail(out_dir / "metrics.jsonl")
        self.state, self.kills = state, kills

    def poll(self) -> None:
        """Read the new events, then the new rows (a row is written before its ``round_end``
        event, so the rows read here cover every ``round_end`` read before them)."""
        state = self.state
        for ev in self.events.read_new():
            state.apply_event(ev)
            rnd = as_int(ev.get("round"))
            if ev.get("event") == "round_start" and rnd is not None:
                self.kills.round_started(rnd, float(ev.get("time", time.time())))
        state.add_rows(self.metrics.read_new())


def _log_size(proc: ManagedProcess) -> int:
    try:
        return proc.log_path.stat().st_size
    except OSError:
        return 0


def _follow(
    deployment: LocalDeployment,
    flwr_run: ManagedProcess,
    files: _RunFiles,
    notify: Callable[[], None],
    timeout: float | None,
    quiet: QuietStream | None = None,
) -> tuple[str | None, bool]:
    """Follow ``flwr run`` until it exits or its run is over; return ``(reason, left_open)``.

    ``reason`` is None when the run ended by itself, else why following stopped early (a
    timeout, a dead SuperLink). ``left_open`` is True when the run finished (the SuperLink says
    ``finished:*``) while ``flwr run --stream`` was still open: the caller stops the stream."""
    state, last_snapshot = files.state, 0.0
    deadline = time.monotonic() + timeout if timeout is not None else math.inf
    rows_seen = 0
    quiet = quiet if quiet is not None else QuietStream()
    while True:
        rc = flwr_run.popen.poll()
        if state.run_id is None and (m := RUN_ID_RE.search(flwr_run.log_text())):
            state.run_id = int(m.group(1))
            logger.info("run %d submitted", state.run_id)
        files.poll()
        for spec in files.kills.due(time.time()):
            if spec.partition in deployment.supernodes:
                state.killed.append(deployment.kill_supernode(spec.partition, spec.round))
        if time.monotonic() - last_snapshot > 1.0:
            deployment.registry.snapshot()
            last_snapshot = time.monotonic()
        notify()
        if rc is not None:
            return None, False
        if (failure := deployment.infrastructure_failure()) is not None:
            return failure, False
        activity = (_log_size(flwr_run), len(state.events), len(state.metrics))
        if state.run_id is not None and quiet.due(activity, state.metrics):
            status, details = deployment.cli.run_status(state.run_id)
            logger.debug("`flwr run` quiet: run %d is %s", state.run_id, status)
            if status is not None and status.startswith("finished"):
                logger.warning(
                    "run %d is %s (%s) but `flwr run --stream` stayed open; stopping the stream",
                    state.run_id,
                    status,
                    details,
                )
                return None, True
        if timeout is None and len(state.metrics) != rows_seen:
            rows_seen = len(state.metrics)
            deadline = derived_deadline(time.monotonic(), state.metrics, state.num_rounds)
        if time.monotonic() > deadline:
            if timeout is not None:
                return f"timed out after {timeout:.0f} s", False
            return (
                f"timed out: {len(state.metrics)} of {state.num_rounds} rounds ended, and the "
                f"rest took over {PACE_FACTOR:g} x the slowest round each plus "
                f"{PACE_SLACK_S:.0f} s (set --timeout to fix the limit)"
            ), False
        time.sleep(0.25)


def _verdict(
    reason: str | None,
    flwr_run: ManagedProcess,
    run_id: int | None,
    status: str | None,
    *,
    stream_stopped: bool = False,
) -> tuple[str, bool]:
    """``(reason, ok)`` of a followed run (``stream_stopped``: we ended a ``flwr run`` left
    open after its run finished, so its exit code says nothing)."""
    if reason is not None:
        return reason, False
    rc = flwr_run.popen.returncode
    if rc != 0 and not stream_stopped:
        return f"`flwr run` exited with code {rc}:\n{flwr_run.log_tail()}", False
    if run_id is None:
        return f"`flwr run` did not start a run:\n{flwr_run.log_tail()}", False
    if status != COMPLETED_STATUS:
        return f"run {run_id} ended with status {status}", False
    return "completed", True


def _submit_and_follow(
    deployment: LocalDeployment,
    options: LocalRunOptions,
    state: RunProgress,
    run_config_path: Path,
    notify: Callable[[], None],
    *,
    simulation: bool,
) -> tuple[str, bool, str | None]:
    """Submit ``flwr run`` and follow it until it ends; return ``(reason, ok, status)``."""
    out_dir = run_config_path.parent
    federation = (
        {"num-supernodes": options.num_clients, **options.federation_config} if simulation else None
    )
    cmd = deployment.cli.run_argv(options.app_dir, run_config_path, federation)
    flwr_run = deployment.registry.start("flwr-run", cmd, out_dir / "logs" / "flwr-run.log")
    state.phase = "running"
    files = _RunFiles(out_dir, state, _KillSchedule(options.kills, options.kill_delay))
    reason, left_open = _follow(deployment, flwr_run, files, notify, options.timeout)
    if reason is not None:  # timeout or dead SuperLink: stop the run, then `flwr run`
        superlink = deployment.superlink
        if state.run_id is not None and superlink is not None and superlink.running():
            deployment.cli.stop(state.run_id)
    if reason is not None or left_open:
        deployment.registry.stop(flwr_run, grace=5.0)
    time.sleep(0.2)
    files.poll()
    if files.kills.pending:
        logger.warning(
            "scheduled kills never happened: %s",
            ", ".join(f"{k.partition}@{k.round}" for k in files.kills.pending),
        )
    status: str | None = None
    if state.run_id is not None and deployment.infrastructure_failure() is None:
        # A run that ended by itself: its final status can lag `flwr run`'s exit, so poll for it.
        # A run we stopped: one query says how it ended; nothing waits on it.
        status, details = (
            deployment.cli.final_status(state.run_id)
            if reason is None
            else deployment.cli.run_status(state.run_id)
        )
        if status is not None and status != COMPLETED_STATUS:
            logger.warning("run %s ended with status %s (%s)", state.run_id, status, details)
    reason, ok = _verdict(reason, flwr_run, state.run_id, status, stream_stopped=left_open)
    error = next(
        (e.get("error") for e in reversed(state.events) if e.get("event") == "run_end"), None
    )
    if not ok and isinstance(error, str) and error:  # the ServerApp's own words: why it failed
        reason = f"{reason}: {error}"
    return reason, ok, status


def _stop_stray_simulation_superlinks(flwr_home: Path) -> None:
    """Kill a detached simulation SuperLink that ``flwr`` may have started for our ``FLWR_HOME``.

    ``flwr`` starts it (for a ``:local:`` connection, when nothing answers on the port) with
    ``--log-file <FLWR_HOME>/local-superlink/superlink.log``; only a ``flower-superlink`` process
    with that exact path on its command line is touched, never anything else.
    """
    if not has_proc():
        return
    marker = str(Path(flwr_home) / "local-superlink")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        cmd = cmdline(pid)
        if "flower-superlink" not in cmd or marker not in cmd:
            continue
        ref = process_ref(pid)
        if ref is None:
            continue
        logger.warning("stopping a detached simulation SuperLink (pid %d)", pid)
        for item in [ref, *descendants(pid)]:
            signal_ref(item, signal.SIGKILL)

"""``CorBin``: the CorBin-FL strategy wrapper. Any Flower Message-API strategy becomes private.

::

    from corbin_fl import CorBin

    strategy = CorBin(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), epsilon=1.0)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=10, evaluate_fn=evaluate)

Each round, :meth:`CorBin.start` runs the protocol of paper Alg. 3 itself
(:func:`server.round.run_round`): the wrapped strategy's ``configure_train`` picks the nodes and
the train config; the server pairs them, relays the X25519 keys and the encrypted
common-randomness blobs, sends the update instruction (the global model, the train config and the
mechanism's settings), and folds the one-bit replies into the decoded mean as they arrive
(streaming: the server's memory does not grow with the number of clients). Per-stage timeouts,
dropout at every stage, replay and tamper checks and ``max_inflight`` are those of
:func:`server.stages.exchange`. The clients run :func:`client.mod.corbin_mod`.

**What the wrapped strategy does.** Its ``configure_train`` picks the nodes and their train
records; a strategy that configures nodes differently (per-node ConfigRecords) has each node's
own records sent to it, and one that sends nodes different global models is refused
(:func:`node_train_records`). Then exactly what it does in Flower, on the decoded mean: its
``aggregate_train`` receives one reply whose ArrayRecord is the round's aggregate ``w_agg``, and
turns it into the next global model, so ``FedAdam``, ``FedYogi`` and ``FedAvgM`` give a
server-side optimizer with no code of ours (``FedAvg`` returns ``w_agg`` itself). Its
``train_metrics_aggr_fn`` aggregates the clients' own train metrics, and it runs federated
evaluation (``configure_evaluate`` / ``aggregate_evaluate``) as usual.

**Eq. 6's global learning rate.** ``w_agg = (1 - lambda) w_g + lambda w_bar``, with ``w_bar`` the
decoded mean local model (Alg. 3 line 23; ``w_g + `` the decoded mean update in
``range_mode = "update"``). With ``FedAvg`` this is eq. 6 exactly. With a server optimizer the
pseudo-gradient it sees is ``w_g - w_agg = lambda (w_g - w_bar)``: ``lambda`` scales it, like a
server learning rate in front of the optimizer's own.

Privacy is stated per threat model in ``summary.json`` (``out_dir``); the clients enforce their
own limits (:class:`client.policy.Policy`), whatever this object is told.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Final

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from corbin_fl import registry, wire
from corbin_fl.arrays import flatten_arrays, layout_of_arrays, unflatten_arrays
from corbin_fl.config import ConfigError, RunConfig, configure_app_logging
from corbin_fl.devices import pick_device
from corbin_fl.server.checkpoint import Checkpointer, CheckpointError, TrainingState, release_event
from corbin_fl.server.metrics import RunFiles
from corbin_fl.server.records import build_summary, round_record
from corbin_fl.server.round import ServerRuntime, run_round, skipped_round
from corbin_fl.server.round import wait_for_nodes as wait_for_connected_nodes
from corbin_fl.server.stages import collect
from corbin_fl.wrapper import StrategyWrapper

logger = logging.getLogger(__name__)

DEFAULT_UPDATE_RADIUS: Final[float] = 0.02
"""``R`` of ``range_mode = "update"`` when the app does not give one: every client's update
``w_i - w_g`` is clipped to ``[-R, R]`` per parameter. About the movement of a weight in a
round of 10-20 Adam steps at ``lr = 1e-3``; set ``update_radius`` for your app (docs/DEFAULTS.md
derives it from public settings for this project's app)."""

RadiusRule = Callable[[int], "float | dict[str, Any]"]
"""``rule(num_nodes) -> R``, called once when the run starts with the connected nodes; it may also
return ``{"value": R, "source": "how R was chosen"}``, which the run's summary records."""


class RunFailedError(RuntimeError):
    """The run cannot learn, or learned nothing: :meth:`CorBin.start` raises it, so the
    ServerApp fails and Flower reports the run ``finished:failed`` (never ``completed``)."""


class PolicyRefusedError(RunFailedError):
    """Every node sampled in a round refused the instruction by its own privacy policy
    (:class:`client.policy.Policy`): no round can run until the run's settings or the nodes'
    limits change. The message names both, as the nodes gave them."""


class CorBin(StrategyWrapper):
    """Wrap a Flower Message-API strategy so that every update is released through CorBin-FL.

    Every keyword but ``strategy``, ``update_radius`` and ``select_metric`` is the protocol
    setting of :class:`corbin_fl.config.RunConfig` of the same name (run-config key in kebab
    case), with its default and its checks (``tests/unit/test_strategy_keywords.py`` keeps the
    defaults in step); the app's task (data, model, local training) is not the building block's.

    Parameters
    ----------
    strategy : Strategy
        The wrapped strategy (``FedAvg``, ``FedAdam``, ``FedYogi``, ``FedAvgM``, ...): it samples
        the nodes, turns the decoded mean into the next global model, aggregates the clients'
        metrics and runs federated evaluation.
    mechanism : str
        Every registered mechanism (``corbin_fl.config.MECHANISMS``); ``"corbin"`` is
        CorBin-FL (Alg. 2 and 3).
    epsilon : float
        Per-parameter privacy budget ``eps_p`` of every released update (Alg. 1/2).
    delta : float
        ``delta`` of the (eps, delta) mechanisms and of the accounting.
    d : int
        Shared random bits per parameter of a pair (Alg. 3 line 15), 1 to 16.
    gamma : float
        AugCorBin-FL's fraction of clients that quantize independently, in [0, 1].
    p_x : float
        Bias of the codebook coin, in (0, 1); 0.5 is the paper's unbiased codebook.
    cr_mode : str
        How a pair gets its common randomness: ``"relay"``, ``"derived"`` or ``"exact"``.
    range_mode : str
        ``"update"``: the clients quantize ``w_i - w_g`` in ``[-R, R]``; ``"layer"``: the
        weights in the global model's layer ranges (the paper, Sec. V-2).
    update_radius : float or callable
        ``R`` of ``range_mode = "update"``: a number, or ``rule(num_nodes) -> R`` called once at
        the start of the run (a resumed run keeps its ``R``). Default
        :data:`DEFAULT_UPDATE_RADIUS`.
    global_lr : float
        ``lambda`` of eq. (6), in (0, 1].
    radius_margin, min_radius, range_quantile : float
        The layer ranges of ``range_mode = "layer"``: relative margin, smallest radius, and the
        quantile ``q`` in (0.5, 1] of each layer's range.
    seed : int
        Seed of everything public (pairing, AugCorBin split); never of keys or noise.
    num_rounds : int
        Rounds ``T`` (:meth:`start`'s ``num_rounds`` replaces it).
    min_clients : int
        Nodes the run waits for before round 1; a round with fewer sampled nodes is skipped.
    stage_timeout, first_stage_timeout : float
        Seconds a stage waits for replies; the first run of each stage waits the larger one.
    poll_interval : float
        Seconds between two pulls of replies.
    max_inflight : int
        Instructions outstanding at once per stage (0 = all nodes at once).
    wait_for_nodes : float
        Seconds to wait for ``min_clients`` nodes before the run fails.
    out_dir : str
        Where ``metrics.jsonl``, ``summary.json`` (with the privacy report) and the crash
        checkpoint go ("" = no files).
    resume : bool
        Continue the run whose checkpoint is in ``out_dir``.
    checkpoint_patience : int
        Reload the best-validation model after this many rounds without improvement (0 = off).
    device : str
        The server's compute device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
    secure_aggregation : bool
        SecAgg+ around the update stage: the server learns only the sum of the symbols
        (:mod:`corbin_fl.secure`).
    secagg_neighbours, secagg_threshold : int
        SecAgg+'s ``k`` and Shamir ``t`` (0 = the defaults).
    test_z_digest : bool
        Test only: clients report a digest of their pair's common randomness.
    select_metric : str
        Metric of ``evaluate_fn`` for the paper's checkpoint rule (``checkpoint_patience``) and
        the summary's best round; larger is better.
    **mechanism_params
        The registered mechanisms' parameters in snake case (``pbm_trials``, ``fedcad_clip``,
        ...: the registry's ``Param`` specs, :func:`corbin_fl.registry.param_specs`), with their
        registered defaults; any other keyword is refused.

    Raises
    ------
    corbin_fl.config.ConfigError
        An impossible setting, before anything starts (every bad key listed).
    TypeError
        An unknown keyword, or a wrapped object that is not a Flower ``Strategy``.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        mechanism: str = "corbin",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        d: int = 5,
        gamma: float = 0.2,
        p_x: float = 0.5,
        cr_mode: str = "relay",
        range_mode: str = "update",
        update_radius: float | RadiusRule = DEFAULT_UPDATE_RADIUS,
        global_lr: float = 1.0,
        radius_margin: float = 0.0,
        min_radius: float = 1e-3,
        range_quantile: float = 1.0,
        seed: int = 0,
        num_rounds: int = 3,
        min_clients: int = 2,
        stage_timeout: float = 120.0,
        first_stage_timeout: float = 300.0,
        poll_interval: float = 0.2,
        max_inflight: int = 0,
        wait_for_nodes: float = 120.0,
        out_dir: str = "",
        resume: bool = False,
        checkpoint_patience: int = 0,
        device: str = "auto",
        secure_aggregation: bool = False,
        secagg_neighbours: int = 0,
        secagg_threshold: int = 0,
        test_z_digest: bool = False,
        select_metric: str = "val_accuracy",
        **mechanism_params: Any,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(f"CorBin wraps a Flower Strategy, got {type(strategy).__name__}")
        parameters = {spec.field for spec in registry.param_specs().values()}
        unknown = sorted(set(mechanism_params) - parameters)
        if unknown:
            raise TypeError(f"CorBin got unknown keyword(s) {unknown}")
        rule = update_radius if callable(update_radius) else None
        fixed = None if callable(update_radius) else update_radius
        if fixed is not None and not (isinstance(fixed, int | float) and math.isfinite(fixed)):
            raise TypeError(f"update_radius must be a number or a callable, got {fixed!r}")
        protocol: dict[str, Any] = {
            "mechanism": mechanism,
            "epsilon": epsilon,
            "delta": delta,
            "d": d,
            "gamma": gamma,
            "p_x": p_x,
            "cr_mode": cr_mode,
            "range_mode": range_mode,
            "global_lr": global_lr,
            "radius_margin": radius_margin,
            "min_radius": min_radius,
            "range_quantile": range_quantile,
            "seed": seed,
            "num_rounds": num_rounds,
            "min_clients": min_clients,
            "stage_timeout": stage_timeout,
            "first_stage_timeout": first_stage_timeout,
            "poll_interval": poll_interval,
            "max_inflight": max_inflight,
            "wait_for_nodes": wait_for_nodes,
            "out_dir": out_dir,
            "resume": resume,
            "checkpoint_patience": checkpoint_patience,
            "device": device,
            "secure_aggregation": secure_aggregation,
            "secagg_neighbours": secagg_neighbours,
            "secagg_threshold": secagg_threshold,
            "test_z_digest": test_z_digest,
            **mechanism_params,
        }
        flower = {key.replace("_", "-"): value for key, value in protocol.items()}
        if fixed is not None:
            flower["update-radius"] = float(fixed)
        cfg = RunConfig.from_flower(flower)
        if cfg.quantizes_update and fixed is not None and fixed <= 0:
            raise ConfigError({"update-radius": "must be > 0 (the clip range of the updates)"})
        self._init(strategy, cfg, rule, select_metric)

    @classmethod
    def from_run_config(
        cls,
        strategy: Strategy,
        cfg: RunConfig,
        *,
        update_radius: RadiusRule | None = None,
        select_metric: str = "val_accuracy",
    ) -> CorBin:
        """A ``CorBin`` with every protocol setting of a validated ``RunConfig`` (this project's
        app); its ``summary.json`` records the whole ``cfg``.

        Raises
        ------
        corbin_fl.config.ConfigError
            ``update-radius = 0`` ("derive R") without the app's ``update_radius`` rule: the
            building block knows nothing of the app's data to derive it from.
        """
        if cfg.quantizes_update and cfg.update_radius <= 0 and update_radius is None:
            raise ConfigError(
                {
                    "update-radius": "0 (derive R) needs the app's rule: pass "
                    "update_radius=rule(num_nodes) -> R, or set update-radius > 0"
                }
            )
        self = cls.__new__(cls)
        self._init(strategy, cfg, update_radius, select_metric)
        return self

    def _init(
        self,
        strategy: Strategy,
        cfg: RunConfig,
        radius_rule: RadiusRule | None,
        select_metric: str,
    ) -> None:
        self.strategy = strategy
        self.cfg = cfg
        self.radius_rule = radius_rule
        self.select_metric = select_metric
        self.history: list[dict[str, Any]] = []
        self.summary_: dict[str, Any] | None = None

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the protocol settings, then the wrapped strategy's summary."""
        c = self.cfg
        logger.info(
            "CorBin-FL: mechanism %s, eps_p %g, d %d, cr-mode %s, range-mode %s, global-lr %g",
            c.mechanism,
            c.epsilon,
            c.d,
            c.cr_mode,
            c.range_mode,
            c.global_lr,
        )
        super().summary()

    # ------------------------------------------------------------------ the run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds of CorBin-FL (Flower's ``Strategy.start`` contract).

        Parameters
        ----------
        grid : Grid
            Flower grid.
        initial_arrays : ArrayRecord
            The initial global model (its floating-point arrays are quantized; the others are
            kept at their initial values, see :mod:`corbin_fl.arrays`).
        num_rounds : int
            Rounds ``T``.
        timeout : float
            Seconds federated evaluation waits for replies (the protocol's stages use
            ``stage_timeout`` / ``first_stage_timeout``).
        train_config, evaluate_config : ConfigRecord, optional
            Sent to the app's train / evaluate handlers, as with any strategy.
        evaluate_fn : callable, optional
            ``evaluate_fn(round, arrays) -> MetricRecord``: server-side evaluation, before the
            first round and after each round. Its metrics go into ``metrics.jsonl``.

        Returns
        -------
        Result
            Final arrays, the clients' aggregated train metrics, federated and server-side
            evaluation metrics per round.

        Raises
        ------
        server.checkpoint.CheckpointError
            ``resume`` without a usable checkpoint, or an ``out_dir`` holding another run's.
        PolicyRefusedError
            At once, when every node sampled in a round refused the round by its privacy policy.
        RunFailedError
            At the end, when no round of the run aggregated an update (``summary.json`` is
            written first): the model is the initial one, which is no success.
        """
        if logging.getLogger("corbin_fl").level == logging.NOTSET:  # the app left it to us
            configure_app_logging()  # CorBin-FL's INFO lines in the ServerApp's log, as Flower's
        self.cfg = dataclasses.replace(self.cfg, num_rounds=num_rounds)
        self.summary()
        run = _Run.open(self.cfg, grid, initial_arrays, evaluate_fn)
        try:
            train = self._begin(run)
            for rnd in range(train.round + 1, run.cfg.num_rounds + 1):
                self._round(
                    run,
                    train,
                    rnd,
                    ConfigRecord() if train_config is None else train_config,
                    ConfigRecord() if evaluate_config is None else evaluate_config,
                    timeout,
                )
            self._finish(run, train)
            return run.result
        except BaseException as exc:
            run.files.event("run_end", time=time.time(), error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            run.files.close()

    # ------------------------------------------------------------------ pieces of the run
    def _begin(self, run: _Run) -> TrainingState:
        """Resume from the checkpoint or start afresh; wait for the nodes; fix ``R``; evaluate
        the initial model; journal every accepted update from now on.

        Raises
        ------
        server.checkpoint.CheckpointError
            ``resume`` without a usable checkpoint, or an ``out_dir`` holding another run's.
        """
        cfg, rt = run.cfg, run.rt
        run.ckpt = Checkpointer(cfg.out_dir, cfg, rt.layout.m) if cfg.out_dir else None
        resumed: TrainingState | None = None
        if run.ckpt is not None and cfg.resume:
            resumed = run.ckpt.load()
            rt.weights = resumed.weights.to(rt.device)
            resumed.best_weights = resumed.best_weights.to(rt.device)
            run.files.rewrite_metrics(resumed.history)
            run.files.event(
                "resume",
                time=time.time(),
                from_round=resumed.round,
                run_ids=resumed.run_ids,
                aborted_releases=len(resumed.aborted_releases),
            )
            logger.info(
                "resuming after round %d (checkpoint of run(s) %s)",
                resumed.round,
                ", ".join(str(r) for r in resumed.run_ids),
            )
        elif run.ckpt is not None and run.ckpt.exists():
            raise CheckpointError(
                f"out-dir {cfg.out_dir} holds the checkpoint of another run "
                f"({run.ckpt.state_path}): set resume = true to continue it, or use a new out-dir"
            )

        nodes = wait_for_connected_nodes(rt.grid, cfg)
        logger.info("%d node(s) connected", len(nodes))
        run.radius = self._resolve_radius(len(nodes), resumed.history if resumed else [])
        rt.update_radius = run.radius["value"] if run.radius else 0.0
        if run.radius:
            logger.info("update radius R = %.4g (%s)", run.radius["value"], run.radius["source"])
        train = resumed or TrainingState(
            round=0,
            weights=rt.weights,
            best={"round": 0, **self._best_view(run.evaluate(0))},
            best_weights=rt.weights.clone(),
        )
        train.run_ids.append(rt.run_id)
        rt.on_release = run.journal
        return train

    def _round(
        self,
        run: _Run,
        train: TrainingState,
        rnd: int,
        train_config: ConfigRecord,
        evaluate_config: ConfigRecord,
        timeout: float,
    ) -> None:
        """Round ``rnd``: train, evaluate, the checkpoint rule, the ledger, then commit."""
        run.files.round_start(rnd)
        t0, cpu0, thread0 = time.monotonic(), time.process_time(), time.thread_time()
        state = self._train_round(run.rt, rnd, run.arrays(), train_config, run.result)
        train_cpu = time.process_time() - cpu0  # the protocol and the aggregation, not evaluation
        thread_cpu = time.thread_time() - thread0
        if state.sampled and set(state.refused) == set(state.sampled):
            raise PolicyRefusedError(policy_refusal_message(rnd, state.refused))
        arrays = run.arrays()
        self._evaluate_round(run.rt, rnd, arrays, evaluate_config, timeout, run.result)
        evals = run.evaluate(rnd, arrays)
        record = round_record(state, time.monotonic() - t0, evals, run.cfg)
        record["server_cpu_seconds"] = train_cpu
        record["server_thread_cpu_seconds"] = thread_cpu
        record["checkpoint_reloaded"] = self._select(run, train, rnd, evals)
        self._commit(run, train, rnd, state, record, evals)

    def _select(self, run: _Run, train: TrainingState, rnd: int, evals: dict[str, float]) -> bool:
        """The paper's checkpoint rule (Sec. V.3), on validation only: keep the best model so
        far; after ``checkpoint_patience`` rounds without improvement, reload it. True when it
        reloaded."""
        score = evals.get(self.select_metric)
        best = train.best.get(self.select_metric)
        if score is not None and (best is None or score > best):
            train.best = {"round": rnd, **self._best_view(evals)}
            train.best_weights = run.rt.weights.clone()
            train.since_best = 0
        else:
            train.since_best += 1
        patience = run.cfg.checkpoint_patience
        if not (patience and train.since_best >= patience):
            return False
        logger.info(
            "round %d: %s has not improved for %d rounds; reloading the model of round %d",
            rnd,
            self.select_metric,
            train.since_best,
            train.best["round"],
        )
        run.rt.weights = train.best_weights.clone()
        train.since_best = 0
        return True

    def _commit(
        self,
        run: _Run,
        train: TrainingState,
        rnd: int,
        state: Any,
        record: dict[str, Any],
        evals: dict[str, float],
    ) -> None:
        """Make round ``rnd`` durable: the ledger, the checkpoint, then its metrics row (a
        visible row is a durable round), the round's event and log line."""
        cfg, files = run.cfg, run.files
        for nid, metrics in sorted(state.client_metrics.items()):
            paired = metrics.get(wire.M_PAIRED, 0.0) > 0
            train.ledger.add(release_event(cfg, rnd, nid, run.rt.layout.m, paired=paired))
        # A node whose update the SuperLink's outage may have swallowed: its reply may have been
        # sent, so it counts as released (as paired when it had a partner: the pair-joint view).
        for nid, stage in sorted(state.unconfirmed.items()):
            if stage == wire.UPDATE and nid not in state.client_metrics:
                paired = nid in state.partner
                train.ledger.add(release_event(cfg, rnd, nid, run.rt.layout.m, paired=paired))
                logger.warning(
                    "round %d: node %d's update may have been sent before the SuperLink's "
                    "outage: the privacy ledger counts it as released",
                    rnd,
                    nid,
                )
        train.history.append(record)
        train.round, train.weights = rnd, run.rt.weights
        if run.ckpt is not None:
            run.ckpt.save(train)
            files.event("checkpoint", round=rnd, time=time.time())
        files.metrics(record)
        self.history.append(record)
        files.event(
            "round_end",
            round=rnd,
            time=time.time(),
            seconds=record["round_seconds"],
            test_accuracy=evals.get("test_accuracy"),
            participants=record["participants"],
            dropped=sorted(int(n) for n in state.dropped),
        )
        logger.info(
            "round %d/%d: %s, %d/%d clients, %d dropped, %.1f s",
            rnd,
            cfg.num_rounds,
            _metrics_text(evals),
            record["participants"],
            record["sampled"],
            len(state.dropped),
            record["round_seconds"],
        )

    def _finish(self, run: _Run, train: TrainingState) -> None:
        """The final model, ``summary.json``, and the verdict: a run in which no round
        aggregated an update fails (:class:`RunFailedError`)."""
        run.result.arrays = run.arrays()
        summary = build_summary(run.cfg, train.history, train.best, run.rt.layout.m, train=train)
        if run.radius:
            summary["update_radius"] = run.radius
        run.files.summary(summary)
        self.summary_ = summary
        if not any(row.get("participants") for row in train.history):
            raise RunFailedError(learned_nothing_message(train.history))
        run.files.event("run_end", time=time.time())

    # ------------------------------------------------------------------ pieces of a round
    def _train_round(
        self,
        rt: Any,
        rnd: int,
        arrays: ArrayRecord,
        train_config: ConfigRecord,
        result: Result,
    ) -> Any:
        """One training round: sampling by the wrapped strategy, the protocol, its aggregation."""
        connected = len(list(rt.grid.get_node_ids()))
        if connected < rt.cfg.min_clients:
            return skipped_round(rt, rnd, connected)
        messages = list(
            self.strategy.configure_train(rnd, arrays, ConfigRecord(dict(train_config)), rt.grid)
        )
        app_records = messages[0].content if messages else RecordDict()
        key = arrays_key(self.strategy, app_records)
        node_records = node_train_records(messages, key)
        sampled = sorted(node_records)
        state = run_round(rt, rnd, sampled, app_records, key, node_records)
        if state.aggregate is None:
            return state
        aggregate, state.aggregate = state.aggregate, None
        logger.info(
            "round %d: %d of %d sampled node(s) sent an update (%d dropped); their decoded mean "
            "goes to %s.aggregate_train as one result",
            rnd,
            len(state.client_metrics),
            len(state.sampled),
            len(state.dropped),
            type(self.strategy).__name__,
        )
        new_arrays, _ = self.aggregate_one(rnd, key, aggregate, {})
        if new_arrays is not None:  # its non-float arrays (cast to float by FedAvg) are ignored
            rt.weights = torch.from_numpy(flatten_arrays(new_arrays, rt.layout)).to(
                rt.weights.device
            )
        metrics = self._client_metrics(state, self.weight_key())
        if metrics is not None:
            result.train_metrics_clientapp[rnd] = metrics
        return state

    def _client_metrics(self, state: Any, weight_key: str) -> MetricRecord | None:
        """The clients' own train metrics, aggregated by the wrapped strategy's function."""
        contents = [
            RecordDict({name: rec for name, rec in records.items()})
            for _, records in sorted(state.app_records.items())
        ]
        if not contents:
            return None
        aggr = getattr(self.strategy, "train_metrics_aggr_fn", None)
        if aggr is None:
            return None
        try:
            return aggr(contents, weight_key)
        except Exception as exc:  # an app without the weight key: no aggregated metrics
            logger.warning("round %d: client metrics not aggregated: %s", state.round, exc)
            return None

    def _evaluate_round(
        self,
        rt: Any,
        rnd: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        timeout: float,
        result: Result,
    ) -> None:
        """Federated evaluation by the wrapped strategy (nothing when it samples no node),
        collected as the protocol's stages are (``server/stages.py: collect``: a SuperLink
        outage costs its bound, not ``timeout``)."""
        grid = rt.grid
        messages = list(
            self.strategy.configure_evaluate(rnd, arrays, ConfigRecord(dict(config)), grid)
        )
        if not messages:
            return
        replies = collect(
            grid,
            messages,
            rnd=rnd,
            stage="evaluate",
            timeout=timeout,
            poll_interval=rt.cfg.poll_interval,
            link=rt.link,
        )
        metrics = self.strategy.aggregate_evaluate(rnd, replies)
        if metrics is not None:
            result.evaluate_metrics_clientapp[rnd] = metrics

    def _resolve_radius(
        self, num_nodes: int, history: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The run's ``R`` (``range_mode = "update"``) and how it was chosen; a resumed run keeps
        the ``R`` of its checkpointed rounds."""
        cfg = self.cfg
        if not cfg.quantizes_update:
            return None
        if history and history[-1].get("update_radius"):
            return {"value": float(history[-1]["update_radius"]), "source": "the resumed run's R"}
        if self.radius_rule is None:
            return {"value": cfg.update_radius, "source": "update_radius (given)"}
        value = self.radius_rule(num_nodes)
        if isinstance(value, dict):
            return value
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"the update radius rule returned {value!r}; R must be > 0")
        return {"value": float(value), "source": "update_radius rule"}

    def _best_view(self, evals: dict[str, float]) -> dict[str, float]:
        """What the checkpoint rule keeps of a round's evaluation (all of it)."""
        return dict(evals)


@dataclasses.dataclass
class _Run:
    """What one :meth:`CorBin.start` holds: the server runtime, the output files, the crash
    checkpoint (``None`` without ``out_dir``, or until :meth:`CorBin._begin` opens it), Flower's
    ``Result``, the app's evaluation and the run's ``R``."""

    cfg: RunConfig
    rt: Any
    files: Any
    ckpt: Any
    template: ArrayRecord
    result: Result
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None
    radius: dict[str, Any] | None = None

    @classmethod
    def open(
        cls,
        cfg: RunConfig,
        grid: Grid,
        initial_arrays: ArrayRecord,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
    ) -> _Run:
        """The run's state from the initial model; logs and records ``run_start``."""
        layout = layout_of_arrays(initial_arrays)
        device = pick_device(cfg.device)
        files = RunFiles(cfg.out_dir)
        run_id = int(grid.run.run_id)
        rt = ServerRuntime(
            grid=grid,
            cfg=cfg,
            run_id=run_id,
            weights=torch.from_numpy(flatten_arrays(initial_arrays, layout)).to(device),
            layout=layout,
            device=device,
            files=files,
        )
        files.event(
            "run_start",
            time=time.time(),
            run_id=run_id,
            config=cfg.to_flower(),
            num_params=layout.m,
            device=str(device),
        )
        logger.info(
            "CorBin-FL run %d: mechanism %s, %d rounds, %d parameters, device %s",
            run_id,
            cfg.mechanism,
            cfg.num_rounds,
            layout.m,
            device,
        )
        return cls(cfg, rt, files, None, initial_arrays, Result(), evaluate_fn)

    def arrays(self) -> ArrayRecord:
        """The current global model in the app's layout."""
        weights = self.rt.weights.detach().cpu().numpy()
        return unflatten_arrays(weights, self.rt.layout, self.template)

    def evaluate(self, rnd: int, arrays: ArrayRecord | None = None) -> dict[str, float]:
        """The app's server-side evaluation of round ``rnd`` (its numbers), kept in ``result``."""
        if self.evaluate_fn is None:
            return {}
        res = self.evaluate_fn(rnd, self.arrays() if arrays is None else arrays)
        if res is None:
            return {}
        self.result.evaluate_metrics_serverapp[rnd] = res
        return {k: float(v) for k, v in res.items() if isinstance(v, int | float)}

    def journal(self, rnd: int, nid: int, metrics: dict[str, float]) -> None:
        """Journal an accepted update at once (a crash later in the round keeps it)."""
        if self.ckpt is None:
            return
        paired = metrics.get(wire.M_PAIRED, 0.0) > 0
        event = release_event(self.cfg, rnd, nid, self.rt.layout.m, paired=paired)
        try:
            self.ckpt.journal_release(self.rt.run_id, event)
        except OSError:  # the round's ledger events are committed from the round state
            logger.exception("round %d: could not journal the release of node %d", rnd, nid)


def node_train_records(messages: list[Message], key: str) -> dict[int, RecordDict]:
    """Each sampled node's train records from the wrapped strategy's ``configure_train``.

    A strategy may configure nodes differently (its ConfigRecords: a per-node learning rate,
    a proximal term, ...): each node's update instruction carries its own records. The global
    model under ``key`` must be the same for every node, since each update is quantized around
    it and their decoded mean is added back to it (paper eq. 6).

    Raises
    ------
    ValueError
        Two messages for one node, a message without the model, or models that differ between
        nodes, naming the nodes.
    """
    out: dict[int, RecordDict] = {}
    model: ArrayRecord | None = None
    for msg in messages:
        nid = int(msg.metadata.dst_node_id)
        if nid in out:
            raise ValueError(
                f"the wrapped strategy's configure_train sent node {nid} two train messages; "
                "CorBin-FL releases one update per node and round"
            )
        content = msg.content
        if key not in content.array_records:
            raise ValueError(
                f"the wrapped strategy's train message for node {nid} has no ArrayRecord "
                f"{key!r} (the global model)"
            )
        arrays = content.array_records[key]
        if model is None:
            model = arrays
        elif arrays is not model and not _same_arrays(arrays, model):
            raise ValueError(
                f"the wrapped strategy's configure_train sent node {nid} another global model "
                f"than node {int(messages[0].metadata.dst_node_id)}: CorBin-FL quantizes every "
                "update around one global model, so a strategy may configure nodes differently "
                "(its ConfigRecords) but must send them all the same arrays"
            )
        out[nid] = content
    return out


def _same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
    """The two records hold the same arrays (names, dtypes, shapes and bytes)."""
    if list(a) != list(b):
        return False
    return all(
        x.dtype == y.dtype and x.shape == y.shape and x.data == y.data
        for x, y in ((a[k], b[k]) for k in a)
    )


def arrays_key(strategy: Strategy, records: RecordDict) -> str:
    """Name of the model's ArrayRecord in the wrapped strategy's messages."""
    key = getattr(strategy, "arrayrecord_key", None)
    if isinstance(key, str):
        return key
    names = list(records.array_records)
    return names[0] if len(names) == 1 else "arrays"


def _metrics_text(evals: dict[str, float]) -> str:
    """``test accuracy 0.9012, val accuracy ...``: test accuracy first (what the launcher and the
    tests read from the log), then the others in order."""
    first = [k for k in ("test_accuracy", "val_accuracy") if k in evals]
    keys = first + [k for k in evals if k not in first]
    return ", ".join(f"{k.replace('_', ' ')} {evals[k]:.4f}" for k in keys) or "no evaluation"


def policy_refusal_message(rnd: int, refused: dict[int, str]) -> str:
    """Why a run stops when every sampled node refused round ``rnd`` by its privacy policy: each
    distinct reason the nodes gave (which names the run's setting and the node's limit), with
    the nodes that gave it."""
    by_reason: dict[str, list[int]] = {}
    for nid, reason in sorted(refused.items()):
        cause = reason.removeprefix(wire.POLICY_REFUSAL)
        by_reason.setdefault(cause, []).append(nid)
    lines = [
        f"  - node(s) {', '.join(str(n) for n in nodes)}: {reason}"
        for reason, nodes in sorted(by_reason.items())
    ]
    return (
        f"round {rnd}: every sampled node ({len(refused)}) refused the run's settings by its own "
        "privacy policy, so no round can run; the run stops. What each node said:\n"
        + "\n".join(lines)
    )


def learned_nothing_message(history: list[dict[str, Any]]) -> str:
    """Why a run in which no round aggregated an update failed: each round's drops."""
    if not history:
        return "the run had no round"
    lines = []
    for row in history:
        dropped = row.get("dropped") or {}
        reasons = sorted(set(dropped.values())) if isinstance(dropped, dict) else []
        why = "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else "")
        lines.append(
            f"  - round {row.get('round')}: {row.get('sampled', 0)} sampled, 0 updates"
            + (f" ({why})" if why else "")
        )
    return (
        f"no round of the run aggregated an update ({len(history)} round(s)): the global model is "
        "the initial one. Per round:\n" + "\n".join(lines)
    )

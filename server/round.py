"""The CorBin-FL round (paper Alg. 3) and the training loop around it, on Flower's Message API.

:func:`run_round` is one round, top to bottom::

    sample nodes -> [AugCorBin split] -> keygen (nodes without a fresh key) -> pairing (Alg. 3
    line 2) -> pair stage (relay/exact: encrypted Y || seed blobs, lines 6-8) -> update stage
    (model, center/radius, partner blob or key; lines 3-4, 9-21) -> aggregate (line 23) ->
    global learning rate (paper eq. 6)

Every stage is :func:`server.stages.exchange` over one :class:`server.stages.RoundState`: a node
that does not answer in time, answers with an error, or answers badly is dropped from every later
stage of the round; the round goes on with the rest. A paired node whose partner vanished before
its blob was relayed is told ``partner-gone`` and quantizes independently (``ldpq``); an update
whose partner vanished later still counts (each role's marginal is LDPQ's, Theorem 1).

:func:`run_training` is the loop over rounds: evaluation on the server's validation and test
sets, the paper's checkpoint rule (reload the best-validation model after ``P`` rounds without
improvement), the privacy ledger (one event per released update), the output files, the privacy
report, and the crash checkpoint committed after every round (:mod:`server.checkpoint`; a run with
``resume = true`` continues from it).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from corbin_fl import wire
from corbin_fl.config import RunConfig
from server.aggregation import apply_global_lr, make_aggregator
from server.metrics import RunFiles
from server.stages import RoundState, active_of, exchange

if TYPE_CHECKING:
    from server.checkpoint import TrainingState

logger = logging.getLogger(__name__)


@dataclass
class ServerRuntime:
    """What the server keeps across rounds.

    Attributes
    ----------
    grid : Grid
        Flower grid.
    cfg : RunConfig
        Run configuration.
    run_id : int
        Flower run id (bound into every pair key by the clients).
    weights : torch.Tensor
        Current global model, float32 ``[m]``.
    layout : Any
        ``corbin_fl.models.ParamLayout`` of the model.
    device : torch.device
        Where the server aggregates and evaluates.
    files : RunFiles
        Output files.
    pubkeys : dict[int, tuple[int, bytes]]
        Node -> (round the key is for, X25519 public key).
    seen_message_ids : set[str]
        Every reply message id of the run (replay check).
    stages_seen : set[str]
        Stages that have run once (the first run of a stage gets ``first-stage-timeout``).
    on_release : Callable[[int, int, dict[str, float]], None] or None
        Called as ``on_release(round, node, metrics)`` right after an update is accepted (and
        aggregated): the run journals the release for the privacy ledger before the round ends.
    update_radius : float
        ``R`` of ``range-mode = "update"`` for every round of the run (:func:`update_radius`).
    """

    grid: Grid
    cfg: RunConfig
    run_id: int
    weights: torch.Tensor
    layout: Any
    device: torch.device
    files: RunFiles
    pubkeys: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    seen_message_ids: set[str] = field(default_factory=set)
    stages_seen: set[str] = field(default_factory=set)
    on_release: Callable[[int, int, dict[str, float]], None] | None = None
    update_radius: float = 0.0

    def rng(self, rnd: int, purpose: int) -> np.random.Generator:
        """Public, reproducible generator for (run seed, round, purpose)."""
        return np.random.default_rng([self.cfg.seed, rnd, purpose])

    def timeout(self, stage: str) -> float:
        """``first-stage-timeout`` the first time a stage runs (process start-up, imports, data
        loading, Ray start-up in simulation), ``stage-timeout`` afterwards."""
        if stage in self.stages_seen:
            return self.cfg.stage_timeout
        self.stages_seen.add(stage)
        return max(self.cfg.first_stage_timeout, self.cfg.stage_timeout)


_PURPOSE_SAMPLE, _PURPOSE_SPLIT, _PURPOSE_PAIRING = 1, 2, 3


# ============================================================================ one round
def run_round(rt: ServerRuntime, rnd: int) -> RoundState:
    """Run round ``rnd`` of Alg. 3 and update ``rt.weights`` (paper eq. 6).

    Parameters
    ----------
    rt : ServerRuntime
        Server state; ``rt.weights`` is replaced by the new global model.
    rnd : int
        Round number, ``>= 1``.

    Returns
    -------
    RoundState
        The round's bookkeeping (participants, drops, pairs, bytes, stage times).
    """
    from corbin_fl.models import layer_center_radius

    cfg, grid = rt.cfg, rt.grid
    state = RoundState(
        round=rnd,
        run_id=rt.run_id,
        sampled=sample_nodes(rt, rnd),
        seen_message_ids=rt.seen_message_ids,
    )
    if len(state.sampled) < cfg.min_clients:
        logger.warning(
            "round %d: %d node(s) connected, min-clients is %d; round skipped",
            rnd,
            len(state.sampled),
            cfg.min_clients,
        )
        return state

    # 1. Roles the server may know: AugCorBin's gamma-fraction quantizes independently.
    to_pair: list[int] = []
    if cfg.paired:
        independent, to_pair = [], list(state.sampled)
        if cfg.mechanism == "augcorbin":
            from mechanisms.pairing import augcorbin_split

            independent, to_pair = augcorbin_split(
                state.sampled, cfg.gamma, rt.rng(rnd, _PURPOSE_SPLIT)
            )
        state.independent = set(independent)

    # 2. Keys (Alg. 3 line 1): fresh per round; nodes without one answer query.keygen.
    if cfg.paired:
        for nid in to_pair:
            known = rt.pubkeys.get(nid)
            if known is not None and known[0] == rnd:
                state.pubkeys[nid] = known[1]
        need = [nid for nid in to_pair if nid not in state.pubkeys]
        exchange(
            grid,
            state,
            {nid: instruction(wire.KEYGEN, nid, rnd, {}) for nid in need},
            lambda nid, reply: accept_pubkey(state, nid, reply),
            timeout=rt.timeout("keygen") if need else 0.0,
            poll_interval=cfg.poll_interval,
            max_inflight=cfg.max_inflight,
            files=rt.files,
        )

    # 3. Pairing (Alg. 3 line 2): uniform over pairings of the nodes that have a key.
    if cfg.paired:
        from mechanisms.pairing import random_pairing

        candidates = active_of(state, to_pair)
        pairs, odd = random_pairing(candidates, rt.rng(rnd, _PURPOSE_PAIRING))
        state.pairs = [(int(a), int(b)) for a, b in pairs]
        state.unpaired = [int(n) for n in odd]
        for a, b in state.pairs:
            state.partner[a], state.partner[b] = b, a

    # 4. Pair stage (relay / exact; Alg. 3 lines 6-8, 14-17): both partners send one AEAD blob.
    if cfg.paired and cfg.cr_mode != "derived" and state.pairs:
        secret_len = (
            wire.packed_len(cfg.d * rt.layout.m) if cfg.cr_mode == "exact" else wire.SEED_BYTES
        )
        exchange(
            grid,
            state,
            {nid: pair_instruction(state, nid, rt) for nid in state.partner},
            lambda nid, reply: accept_blob(state, nid, reply, wire.blob_len(secret_len)),
            timeout=rt.timeout("pair"),
            poll_interval=cfg.poll_interval,
            max_inflight=cfg.max_inflight,
            files=rt.files,
        )

    # 5. Update stage (Alg. 3 lines 3-4, 9-21): model, center/radius, partner blob or key.
    if cfg.quantizes_update:  # clients encode w_i - w_g in [-R, R]
        shape, dev = (rt.layout.num_layers,), rt.weights.device  # as layer_center_radius
        c_layer = torch.zeros(shape, dtype=torch.float32, device=dev)
        if rt.update_radius <= 0:  # not resolved by run_training (a caller of run_round alone)
            resolved = update_radius(cfg, len(list(grid.get_node_ids())), [])
            rt.update_radius = resolved["value"] if resolved else 0.0
        r_layer = torch.full(shape, rt.update_radius, dtype=torch.float32, device=dev)
    else:
        c_layer, r_layer = layer_center_radius(
            rt.weights, rt.layout, cfg.radius_margin, cfg.min_radius, cfg.range_quantile
        )
    state.max_radius = float(r_layer.max())
    model_rec = ArrayRecord(
        {
            wire.WEIGHTS: wire.to_array(rt.weights.cpu().numpy()),
            wire.CENTER: wire.to_array(c_layer.cpu().numpy()),
            wire.RADIUS: wire.to_array(r_layer.cpu().numpy()),
        }
    )
    aggregator = make_aggregator(cfg, rt.weights, c_layer, r_layer, rt.layout)
    participants = active_of(state, state.sampled)
    cq_seed = secrets.token_bytes(wire.CQ_SEED_BYTES)

    def on_update(nid: int, reply: Message) -> None:
        accept_update(state, nid, reply, aggregator, cfg)
        if rt.on_release is not None:
            rt.on_release(rnd, nid, state.client_metrics[nid])

    exchange(
        grid,
        state,
        {
            nid: update_instruction(state, nid, rt, model_rec, participants, cq_seed)
            for nid in participants
        },
        on_update,
        timeout=rt.timeout("update") if participants else 0.0,
        poll_interval=cfg.poll_interval,
        max_inflight=cfg.max_inflight,
        files=rt.files,
    )
    del model_rec  # the serialized model (one float32 model copy): not needed to aggregate
    for nid in state.dropped:
        rt.pubkeys.pop(nid, None)  # its key state is unknown now: keygen next time
    for nid, pk in state.next_pubkeys.items():
        rt.pubkeys[nid] = (rnd + 1, pk)

    # 6. Aggregate (Alg. 3 line 23) and apply the global learning rate (paper eq. 6).
    estimate = aggregator.estimate()
    if estimate is None:
        logger.warning("round %d: no valid update; the global model is kept", rnd)
    else:
        if cfg.quantizes_update:  # the decoded mean update, back on the global model
            estimate = estimate.to(rt.weights.device, torch.float32).add_(rt.weights)
        rt.weights = apply_global_lr(rt.weights, estimate, cfg.global_lr, inplace=True)
    return state


# ============================================================================ messages
def instruction(msg_type: str, nid: int, rnd: int, cfg: dict[str, Any], **records: Any) -> Message:
    """A message of ``msg_type`` to node ``nid`` for round ``rnd`` (round bound in group id and
    in the ``cfg`` record)."""
    content = RecordDict({wire.CFG: ConfigRecord({wire.ROUND: rnd, **cfg}), **records})
    return Message(content, dst_node_id=nid, message_type=msg_type, group_id=str(rnd))


def pair_instruction(state: RoundState, nid: int, rt: ServerRuntime) -> Message:
    """``query.pair``: partner id and partner public key (relay/exact)."""
    partner = state.partner[nid]
    cfg: dict[str, Any] = {
        wire.PARTNER: partner,
        wire.PARTNER_PUBKEY: state.pubkeys[partner],
        wire.CR_MODE: rt.cfg.cr_mode,
    }
    if rt.cfg.cr_mode == "exact":
        cfg[wire.NUM_PARAMS] = rt.layout.m
    return instruction(wire.PAIR, nid, state.round, cfg)


def update_instruction(
    state: RoundState,
    nid: int,
    rt: ServerRuntime,
    model_rec: ArrayRecord,
    participants: list[int],
    cq_seed: bytes,
) -> Message:
    """``train.update``: global model, center/radius, assignment and what the pair needs."""
    cfg = rt.cfg
    body: dict[str, Any] = {
        wire.MECHANISM: cfg.mechanism,
        wire.ASSIGNMENT: assignment_of(state, nid, cfg),
    }
    if body[wire.ASSIGNMENT] == wire.PAIRED:
        partner = state.partner[nid]
        body[wire.PARTNER] = partner
        if cfg.cr_mode == "derived":
            body[wire.PARTNER_PUBKEY] = state.pubkeys[partner]
        else:
            body[wire.PARTNER_BLOB] = state.blobs[partner]
    elif body[wire.ASSIGNMENT] == wire.PARTNER_GONE:
        body[wire.PARTNER] = state.partner[nid]
    if cfg.mechanism == "cq":
        from mechanisms.baselines.cq import cq_shared_randomness

        seed = int.from_bytes(cq_seed, "big")
        perm, _ = cq_shared_randomness(seed, len(participants), (0,))
        body[wire.CQ_SEED] = cq_seed
        body[wire.CQ_RANK] = int(perm[sorted(participants).index(nid)])
        body[wire.CQ_CLIENTS] = len(participants)
    return instruction(wire.UPDATE, nid, state.round, body, **{wire.MODEL: model_rec})


def assignment_of(state: RoundState, nid: int, cfg: RunConfig) -> str:
    """What node ``nid`` does in the update stage (see :data:`corbin_fl.wire.ASSIGNMENTS`)."""
    if not cfg.paired:
        return wire.SOLO
    if nid in state.independent:
        return wire.INDEPENDENT
    partner = state.partner.get(nid)
    if partner is None:
        return wire.UNPAIRED
    if partner not in state.active:
        return wire.PARTNER_GONE
    if cfg.cr_mode != "derived" and partner not in state.blobs:
        return wire.PARTNER_GONE
    return wire.PAIRED


# ============================================================================ reply checks
def accept_pubkey(state: RoundState, nid: int, reply: Message) -> None:
    """Check a ``query.keygen`` reply: ``keys{round, pubkey}`` with a valid X25519 key."""
    wire.check_records(reply.content, {wire.KEYS: ConfigRecord})
    rec = reply.content.config_records[wire.KEYS]
    wire.check_keys(rec, {wire.ROUND, wire.PUBKEY}, what="keys")
    wire.check_round(reply, rec, state.round)
    state.pubkeys[nid] = wire.check_pubkey(rec[wire.PUBKEY])


def accept_blob(state: RoundState, nid: int, reply: Message, length: int) -> None:
    """Check a ``query.pair`` reply: ``pair{round, blob}``, blob of the expected size.

    The blob is opaque to the server (AES-GCM under the pair key); it is relayed unchanged.
    """
    wire.check_records(reply.content, {wire.PAIR_REC: ConfigRecord})
    rec = reply.content.config_records[wire.PAIR_REC]
    wire.check_keys(rec, {wire.ROUND, wire.BLOB}, what="pair")
    wire.check_round(reply, rec, state.round)
    state.blobs[nid] = wire.get_bytes(rec, wire.BLOB, length)


def accept_update(
    state: RoundState, nid: int, reply: Message, aggregator: Any, cfg: RunConfig
) -> None:
    """Check a ``train.update`` reply and fold its update into ``aggregator``.

    ``reply{round[, next-pubkey][, z-digest]}``, ``update{bits|values}`` of the mechanism's dtype
    and length (finite for floats), ``metrics`` with the known keys and finite values.
    """
    wire.check_records(
        reply.content,
        {wire.REPLY: ConfigRecord, wire.UPDATE_REC: ArrayRecord, wire.METRICS: MetricRecord},
    )
    head = reply.content.config_records[wire.REPLY]
    required = {wire.ROUND} | ({wire.NEXT_PUBKEY} if cfg.paired else set())
    optional = {wire.Z_DIGEST} if cfg.paired and cfg.test_z_digest else set()
    wire.check_keys(head, required, optional, what="reply")
    wire.check_round(reply, head, state.round)
    next_pk = wire.check_pubkey(head[wire.NEXT_PUBKEY], "next-pubkey") if cfg.paired else None
    digest = wire.get_bytes(head, wire.Z_DIGEST, 32) if wire.Z_DIGEST in head else None
    metrics = reply.content.metric_records[wire.METRICS]
    wire.check_keys(metrics, wire.METRIC_KEYS, what="metrics")
    for key, value in metrics.items():
        if not wire.finite_metric(value):
            raise wire.WireError(f"metric {key!r} is not a finite number")
    aggregator.add(reply.content.array_records[wire.UPDATE_REC])  # validates, then counts
    state.client_metrics[nid] = {k: float(v) for k, v in metrics.items()}  # type: ignore[arg-type]
    if next_pk is not None:
        state.next_pubkeys[nid] = next_pk
    if digest is not None:
        state.z_digests[nid] = digest


# ============================================================================ sampling
def sample_nodes(rt: ServerRuntime, rnd: int) -> list[int]:
    """Connected nodes, or ``clients-per-round`` of them chosen uniformly (seeded)."""
    nodes = sorted(int(n) for n in rt.grid.get_node_ids())
    k = rt.cfg.clients_per_round
    if k == 0 or k >= len(nodes):
        return nodes
    picked = rt.rng(rnd, _PURPOSE_SAMPLE).choice(len(nodes), size=k, replace=False)
    return [nodes[i] for i in sorted(picked)]


def wait_for_nodes(grid: Grid, cfg: RunConfig) -> list[int]:
    """Block until ``min-clients`` nodes are connected (at most ``wait-for-nodes`` seconds)."""
    deadline = time.monotonic() + cfg.wait_for_nodes
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= cfg.min_clients:
            return nodes
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"only {len(nodes)} node(s) connected after {cfg.wait_for_nodes:g} s; "
                f"min-clients is {cfg.min_clients}"
            )
        time.sleep(min(1.0, cfg.poll_interval))


def update_radius(
    cfg: RunConfig, num_nodes: int, history: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The run's ``R`` of ``range-mode = "update"`` and how it was chosen (``None`` otherwise).

    ``update-radius > 0`` is taken as given. ``0`` derives ``R = S * lr`` from public settings
    (:func:`corbin_fl.training.step_bound`: Adam's per-step bound times the steps of a round,
    with ``N = num_nodes``, the nodes connected at the start of the run, and the size of the
    public training split). ``R`` is fixed for the run; a resumed run keeps the ``R`` its
    checkpointed rounds used (``history[-1]["update_radius"]``), so nodes that connect or
    vanish across the crash do not change it.
    """
    if not cfg.quantizes_update:
        return None
    if cfg.update_radius > 0:
        return {"value": cfg.update_radius, "source": "update-radius (run config)"}
    if history and history[-1].get("update_radius"):
        return {"value": float(history[-1]["update_radius"]), "source": "the resumed run's R"}
    from corbin_fl.data import train_size
    from corbin_fl.training import step_bound

    bound = step_bound(
        lr=cfg.lr,
        local_epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        max_steps=cfg.max_steps,
        train_size=train_size(
            cfg.dataset,
            data_seed=cfg.data_seed,
            data_dir=cfg.data_dir or None,
            use_official_test=cfg.use_official_test,
        ),
        num_clients=max(num_nodes, 1),
    )
    return {
        "value": bound.radius,
        "source": f"steps x lr = {bound.steps} x {cfg.lr:g}; steps = {bound.source}",
        "steps": bound.steps,
    }


# ============================================================================ the run
def round_record(
    state: RoundState, seconds: float, evals: dict[str, float], cfg: RunConfig
) -> dict[str, Any]:
    """One line of ``metrics.jsonl`` (the launcher contract)."""
    accepted = set(state.client_metrics)
    fallbacks = sum(1 for m in state.client_metrics.values() if m.get(wire.M_FALLBACK, 0.0) > 0)
    record: dict[str, Any] = {
        "round": state.round,
        **evals,
        "sampled": len(state.sampled),
        "participants": len(accepted),
        "dropped": {str(n): why for n, why in sorted(state.dropped.items())},
        "pairs": len(state.pairs),
        "unpaired": len(state.unpaired),
        "independent": len(state.independent),
        "fallbacks": fallbacks,
        "paired_updates": sum(
            1 for m in state.client_metrics.values() if m.get(wire.M_PAIRED, 0.0) > 0
        ),
        "round_trips": state.round_trips,
        "bytes_up": {**state.bytes_up, "total": sum(state.bytes_up.values())},
        "bytes_down": {**state.bytes_down, "total": sum(state.bytes_down.values())},
        "stage_seconds": dict(state.stage_seconds),
        "round_seconds": seconds,
        "max_radius": state.max_radius,
        "update_radius": state.max_radius if cfg.quantizes_update else None,
        "train_loss": _mean(m.get(wire.M_TRAIN_LOSS) for m in state.client_metrics.values()),
        "clip_fraction": _mean(m.get(wire.M_CLIP_FRACTION) for m in state.client_metrics.values()),
    }
    if cfg.paired and cfg.test_z_digest:
        matched = mismatched = 0
        for a, b in state.pairs:
            da, db = state.z_digests.get(a), state.z_digests.get(b)
            if da is not None and db is not None:
                matched += da == db
                mismatched += da != db
        record["z_matched_pairs"] = matched
        record["z_mismatched_pairs"] = mismatched
    return record


def _mean(values: Any) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def run_training(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """The whole run: ``num-rounds`` rounds of :func:`run_round` with evaluation and outputs.

    After every round the server evaluates the global model, applies the paper's checkpoint
    rule (Sec. V.3), records one privacy-ledger event per accepted update, commits the crash
    checkpoint (:class:`server.checkpoint.Checkpointer`, when ``out-dir`` is set) and only then
    appends the round's ``metrics.jsonl`` row. With ``resume = true`` the run starts from that
    checkpoint: ``metrics.jsonl`` is rewritten atomically to the checkpoint's rows ``1..t``
    (dropping the row of a round that was in flight) and the loop goes on with round ``t + 1``.

    Parameters
    ----------
    grid : Grid
        Flower grid.
    cfg : RunConfig
        Validated run configuration.

    Returns
    -------
    dict
        The summary (also written to ``summary.json`` when ``out-dir`` is set).

    Raises
    ------
    server.checkpoint.CheckpointError
        ``resume = true`` without a usable checkpoint (missing, corrupt, other configuration),
        or ``resume = false`` in an ``out-dir`` that holds the checkpoint of another run.
    """
    from corbin_fl.data import dataset_info, server_datasets
    from corbin_fl.models import build_model, flatten, layout_of, load_flat
    from corbin_fl.training import evaluate, pick_device
    from server.checkpoint import Checkpointer, CheckpointError, TrainingState, release_event

    files = RunFiles(cfg.out_dir)
    device = pick_device(cfg.device)
    run_id = int(grid.run.run_id)
    info = dataset_info(cfg.dataset, cfg.data_dir or None)
    model = build_model(cfg.model, info.in_channels, info.num_classes, seed=cfg.seed)
    layout = layout_of(model)
    val, test = server_datasets(
        cfg.dataset,
        data_seed=cfg.data_seed,
        data_dir=cfg.data_dir or None,
        use_official_test=cfg.use_official_test,
    )
    rt = ServerRuntime(
        grid=grid,
        cfg=cfg,
        run_id=run_id,
        weights=flatten(model).to(device),
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
    try:
        ckpt = Checkpointer(cfg.out_dir, cfg, layout.m) if cfg.out_dir else None
        resumed: TrainingState | None = None
        if ckpt is not None and cfg.resume:
            resumed = ckpt.load()
            rt.weights = resumed.weights.to(device)
            resumed.best_weights = resumed.best_weights.to(device)
            files.rewrite_metrics(resumed.history)
            files.event(
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
        elif ckpt is not None and ckpt.exists():
            raise CheckpointError(
                f"out-dir {cfg.out_dir} holds the checkpoint of another run "
                f"({ckpt.state_path}): set resume = true to continue it, or use a new out-dir"
            )

        nodes = wait_for_nodes(grid, cfg)
        logger.info("%d node(s) connected", len(nodes))
        radius = update_radius(cfg, len(nodes), resumed.history if resumed else [])
        rt.update_radius = radius["value"] if radius else 0.0
        if radius:
            logger.info("update radius R = %.4g (%s)", radius["value"], radius["source"])

        def evaluate_now() -> dict[str, float]:
            load_flat(model, rt.weights)
            v = evaluate(model, val, batch_size=cfg.eval_batch_size, device=device)
            t = evaluate(model, test, batch_size=cfg.eval_batch_size, device=device)
            return {
                "val_accuracy": v.accuracy,
                "val_loss": v.loss,
                "test_accuracy": t.accuracy,
                "test_loss": t.loss,
            }

        train = resumed or TrainingState(
            round=0,
            weights=rt.weights,
            best={"round": 0, **evaluate_now()},
            best_weights=rt.weights.clone(),
        )
        train.run_ids.append(run_id)

        def journal(rnd: int, nid: int, metrics: dict[str, float]) -> None:
            """Journal an accepted update at once (a crash later in the round keeps it)."""
            if ckpt is None:
                return
            paired = metrics.get(wire.M_PAIRED, 0.0) > 0
            try:
                ckpt.journal_release(run_id, release_event(cfg, rnd, nid, layout.m, paired=paired))
            except OSError:  # the round's ledger events are committed from the round state
                logger.exception("round %d: could not journal the release of node %d", rnd, nid)

        rt.on_release = journal
        for rnd in range(train.round + 1, cfg.num_rounds + 1):
            files.round_start(rnd)
            t0 = time.monotonic()
            state = run_round(rt, rnd)
            evals = evaluate_now()
            record = round_record(state, time.monotonic() - t0, evals, cfg)
            # Checkpoints (paper Sec. V.3): model selection on validation only.
            if evals["val_accuracy"] > train.best["val_accuracy"]:
                train.best = {"round": rnd, **evals}
                train.best_weights = rt.weights.clone()
                train.since_best = 0
            else:
                train.since_best += 1
            record["checkpoint_reloaded"] = False
            if cfg.checkpoint_patience and train.since_best >= cfg.checkpoint_patience:
                logger.info(
                    "round %d: validation accuracy has not improved for %d rounds; "
                    "reloading the model of round %d",
                    rnd,
                    train.since_best,
                    train.best["round"],
                )
                rt.weights = train.best_weights.clone()
                train.since_best = 0
                record["checkpoint_reloaded"] = True
            for nid, metrics in sorted(state.client_metrics.items()):
                paired = metrics.get(wire.M_PAIRED, 0.0) > 0
                train.ledger.add(release_event(cfg, rnd, nid, layout.m, paired=paired))
            train.history.append(record)
            train.round, train.weights = rnd, rt.weights
            if ckpt is not None:  # commit before the row: a visible row is a durable round
                ckpt.save(train)
                files.event("checkpoint", round=rnd, time=time.time())
            files.metrics(record)
            files.event(
                "round_end",
                round=rnd,
                time=time.time(),
                seconds=record["round_seconds"],
                test_accuracy=evals["test_accuracy"],
                participants=record["participants"],
                dropped=sorted(int(n) for n in state.dropped),
            )
            logger.info(
                "round %d/%d: test accuracy %.4f, val accuracy %.4f, %d/%d clients, "
                "%d dropped, %.1f s",
                rnd,
                cfg.num_rounds,
                evals["test_accuracy"],
                evals["val_accuracy"],
                record["participants"],
                record["sampled"],
                len(state.dropped),
                record["round_seconds"],
            )
        summary = build_summary(cfg, train.history, train.best, layout.m, train=train)
        if radius:
            summary["update_radius"] = radius
        files.summary(summary)
        files.event("run_end", time=time.time())
        return summary
    except BaseException as exc:
        files.event("run_end", time=time.time(), error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        files.close()


def build_summary(
    cfg: RunConfig,
    history: list[dict[str, Any]],
    best: dict[str, Any],
    num_params: int,
    *,
    train: TrainingState | None = None,
) -> dict[str, Any]:
    """``summary.json``: config, final and best-validation accuracies, round trips, privacy.

    With ``train`` (a :class:`server.checkpoint.TrainingState`) the summary also counts the
    privacy ledger's releases (per node), the releases of rounds a crash aborted, and lists the
    Flower run ids that contributed rounds (more than one after a resume).
    """
    final = history[-1] if history else {}
    participation = [int(r["participants"]) for r in history]
    summary: dict[str, Any] = {
        "config": cfg.to_flower(),
        "num_params": num_params,
        "rounds": len(history),
        "final_test_accuracy": final.get("test_accuracy"),
        "final_test_loss": final.get("test_loss"),
        "final_val_accuracy": final.get("val_accuracy"),
        "best_val_round": best["round"],
        "best_val_accuracy": best["val_accuracy"],
        "best_val_test_accuracy": best["test_accuracy"],
        "round_trips_per_round": [int(r["round_trips"]) for r in history],
        "participants_per_round": participation,
        "bytes_up_total": sum(int(r["bytes_up"]["total"]) for r in history),
        "bytes_down_total": sum(int(r["bytes_down"]["total"]) for r in history),
        "clip_fraction": clip_summary(history),
        "privacy": privacy_summary(
            cfg,
            len(history),
            num_params,
            max(participation, default=0),
            max((float(r["max_radius"]) for r in history), default=None),
        ),
    }
    if train is not None:
        from server.checkpoint import ledger_counts

        summary["privacy_ledger"] = {
            **ledger_counts(train.ledger),
            "aborted_releases": len(train.aborted_releases),
        }
        summary["run_ids"] = list(train.run_ids)
    return summary


def clip_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Fraction of coordinates the mechanism clipped into its range (mean over the clients of a
    round, as the clients report it): per round, the run's mean and its largest round."""
    per_round = [r.get("clip_fraction") for r in history]
    known = [float(v) for v in per_round if v is not None]
    return {
        "per_round": per_round,
        "mean": sum(known) / len(known) if known else None,
        "max": max(known, default=None),
    }


def privacy_summary(
    cfg: RunConfig, rounds: int, num_params: int, clients: int | None, r_max: float | None
) -> dict[str, Any]:
    """The run's privacy report, from ``mechanisms.accounting.privacy_report``.

    One entry per threat model (``threat_models``: A an eavesdropper on one uplink, B the
    server, which sees every bit, C a malicious client, D a malicious server), each with a
    ``dp`` flag and a plain-language ``guarantee``: ``eps_p`` per parameter and the per-update
    and ``T``-round (eps, delta) against A (worst case: a client takes part in every round),
    "no DP" against the server for the paired mechanisms (with the pair-joint lower bounds on
    delta), and no ``delta`` anywhere for a mechanism without DP. On a failure the report is
    ``{"mechanism", "eps_p", "error"}`` and the failure is logged.
    """
    from mechanisms.accounting import privacy_report

    try:
        return privacy_report(
            cfg.mechanism,
            cfg.epsilon,
            cfg.delta,
            num_params,
            max(rounds, 1),
            d=cfg.d if cfg.paired else None,
            gamma=cfg.gamma if cfg.mechanism == "augcorbin" else None,
            n=clients or None,
            r=r_max,
        )
    except (ValueError, TypeError, ArithmeticError) as exc:
        logger.exception("privacy report failed")
        return {"mechanism": cfg.mechanism, "eps_p": cfg.epsilon, "error": str(exc)}

"""The CorBin-FL protocol without network: server stages and client handlers in one process
(the harness: ``harness.py``; its fixtures: ``conftest.py``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    RecordDict,
)
from harness import (
    RUN_ID,
    InProcessGrid,
    capture_metrics,
    keygen_instruction,
    make_cfg,
    make_instruction,
    mechanism_params,
    node_context,
    payload_blobs,
    rebuild,
    reply_hook,
    run,
    runtime,
)
from wire_helpers import is_stage, run_plain_round

from corbin_fl import registry, wire
from corbin_fl.app import client_app
from corbin_fl.app.config import AppConfig
from corbin_fl.client import handlers, pair_crypto
from corbin_fl.mechanisms.baselines import ternary
from corbin_fl.server import round as server_round
from corbin_fl.server.aggregation import apply_global_lr, make_aggregator
from corbin_fl.server.metrics import RunFiles
from corbin_fl.server.stages import RoundState, exchange


# ============================================================================ full rounds
def test_real_training_and_evaluation_in_process(tmp_path: Any) -> None:
    """Real local training on MNIST partitions and real server evaluation, 2 nodes, 1 round."""
    import json

    grid = InProcessGrid(make_cfg(num_rounds=1, out_dir=str(tmp_path), test_z_digest=True), 2)
    summary = run(grid)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["participants"] == 2 and row["pairs"] == 1 and row["z_matched_pairs"] == 1
    assert 0.0 <= row["test_accuracy"] <= 1.0 and row["test_loss"] > 0
    assert summary["final_test_accuracy"] == row["test_accuracy"]
    assert row["train_loss"] > 0 and 0.0 <= row["clip_fraction"] <= 1.0


def test_relay_run_no_secret_in_the_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Relay mode, 5 nodes (one odd): z matches in every pair and no seed, key or Y leaks."""
    secrets_drawn: list[bytes] = []
    real_seed, real_y = pair_crypto.draw_seed, pair_crypto.draw_y
    ys: list[int] = []

    def spy_seed() -> bytes:
        secrets_drawn.append(real_seed())
        return secrets_drawn[-1]

    def spy_y() -> int:
        ys.append(real_y())
        return ys[-1]

    monkeypatch.setattr(handlers, "draw_seed", spy_seed)
    monkeypatch.setattr(handlers, "draw_y", spy_y)
    grid = InProcessGrid(make_cfg(test_z_digest=True, num_rounds=2, out_dir=str(tmp_path)), 5)
    summary = run(grid)

    # round 1: keygen -> pair -> update; round 2: update only (its blobs came with round 1's
    # update replies: the relay is pipelined one round ahead)
    assert summary["round_trips_per_round"] == [3, 1]
    assert summary["participants_per_round"] == [5, 5]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    import json

    rows = [json.loads(line) for line in lines]
    for row in rows:
        assert row["pairs"] == 2 and row["unpaired"] == 1
        assert row["z_matched_pairs"] == 2 and row["z_mismatched_pairs"] == 0
        assert row["fallbacks"] == 0 and row["dropped"] == {}
        assert row["paired_updates"] == 4
    assert [row["carried_pairs"] for row in rows] == [0, 2]
    # nothing secret in any message: seeds, private keys, pair keys
    secret_values = list(secrets_drawn)
    for ctx in grid.contexts.values():
        key_rec = ctx.state.config_records.get(handlers.STATE_KEY)
        assert key_rec is not None
        secret_values.append(key_rec["sk"])  # type: ignore[arg-type]
    # 2 pairs x 2 nodes x 2 rounds: round 1's in its pair stage, round 2's with round 1's
    # update replies; none with round 2's (the last round)
    assert len(secrets_drawn) == 8 and len(ys) == 8
    everything = [p for m in grid.sent + grid.received for p in payload_blobs(m)]
    for secret in secret_values:
        assert not any(secret in blob for blob in everything)
    # the two blobs of every pair have the same size; no role-like key anywhere
    pair_replies = [m for m in grid.received if is_stage(m, wire.PAIR)]
    blob_sizes = {len(m.content.config_records[wire.PAIR_REC][wire.BLOB]) for m in pair_replies}
    next_blobs = [
        m.content.config_records[wire.REPLY][wire.NEXT_BLOB]
        for m in grid.received
        if is_stage(m, wire.UPDATE) and wire.NEXT_BLOB in m.content.config_records[wire.REPLY]
    ]
    assert len(next_blobs) == 4  # round 1's update replies: both nodes of round 2's 2 pairs
    blob_sizes |= {len(blob) for blob in next_blobs}  # type: ignore[arg-type]
    assert blob_sizes == {wire.blob_len(wire.SEED_BYTES)}
    for msg in grid.sent + grid.received:
        if msg.has_content():
            for rec in msg.content.values():
                assert not any(k in ("y", "lead", "is-lead", "seed", "role") for k in rec)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run_start" and events[-1]["event"] == "run_end"
    assert [e["stage"] for e in events if e["event"] == "stage_end"] == [
        "keygen",
        "pair",
        "update",
        "update",
    ]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["privacy"]["eps_p"] == pytest.approx(1.0)
    assert saved["best_val_round"] in (0, 1, 2)


@pytest.mark.parametrize(("mode", "trips"), [("derived", [2, 1]), ("exact", [3, 2])])
def test_derived_and_exact_modes_share_z(mode: str, trips: list[int]) -> None:
    grid = InProcessGrid(make_cfg(test_z_digest=True, num_rounds=2, cr_mode=mode), 4)
    records: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunFiles, "metrics", lambda self, rec: records.append(rec))
        summary = run(grid)
    assert summary["round_trips_per_round"] == trips
    assert all(r["z_matched_pairs"] == 2 and r["z_mismatched_pairs"] == 0 for r in records)
    if mode == "exact":
        m = summary["num_params"]
        blobs = [
            m_.content.config_records[wire.PAIR_REC][wire.BLOB]
            for m_ in grid.received
            if is_stage(m_, wire.PAIR)
        ]
        assert {len(b) for b in blobs} == {wire.blob_len(wire.packed_len(5 * m))}


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        *((m, {}) for m in ("ldpfl", "gaussian", "laplace", "fedavg", "cq", "ternary", "fedcad")),
        ("augcorbin", {}),
        ("pbm", {"pbm_trials": 2}),
        ("rqm", {"rqm_levels": 3}),
        ("imvu", {"imvu_bits": 4}),
        ("signsgd", {}),
        ("central-gaussian", {"central_clip": 0.5}),
    ],
)
def test_every_mechanism_runs_through_the_same_loop(mechanism: str, params: dict[str, Any]) -> None:
    grid = InProcessGrid(make_cfg(mechanism=mechanism, num_rounds=2, gamma=0.5, **params), 4)
    summary = run(grid)
    assert summary["participants_per_round"] == [4, 4]
    expected = {"augcorbin": [3, 2]}.get(mechanism, [1, 1])
    assert summary["round_trips_per_round"] == expected
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
    if mechanism == "fedcad":  # the FedCAD state survives across rounds in context.state
        assert all("corbin.fedcad" in c.state.config_records for c in grid.contexts.values())


# ============================================================================ dropout
def test_partner_silent_in_pair_stage_gets_partner_gone(caplog: pytest.LogCaptureFixture) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1), 4)
    victim = grid.node_ids[0]
    grid.hooks.append(reply_hook(wire.PAIR, victim, lambda i, r: []))  # never answers
    records = capture_metrics(grid)
    row = records[0]
    assert set(row["dropped"]) == {str(victim)}
    assert "no reply" in row["dropped"][str(victim)]
    assert row["participants"] == 3
    assert row["fallbacks"] == 1  # the victim's partner used ldpq (partner-gone)
    assert any(f"node {victim} dropped" in rec.message for rec in caplog.records)


def test_update_lost_after_pairing_partner_still_counts() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, test_z_digest=True), 4)
    victim = grid.node_ids[1]
    grid.hooks.append(
        reply_hook(wire.UPDATE, victim, lambda i, r: [Message(Error(5, "node gone"), reply_to=i)])
    )
    row = capture_metrics(grid)[0]
    assert row["participants"] == 3 and row["fallbacks"] == 0
    assert "error reply (code 5)" in row["dropped"][str(victim)]
    assert row["paired_updates"] == 3  # the victim's partner used corbinq and counted


def test_superlink_error_replies_without_message_id_are_not_replays() -> None:
    """Errors the SuperLink makes up for unavailable nodes all carry an empty message id."""
    grid = InProcessGrid(make_cfg(num_rounds=1, mechanism="ldpfl"), 3)

    def unavailable(i: Message, r: Message) -> list[Message]:
        err = Message(Error(5, "Node unavailable"), reply_to=i)
        err.__dict__["_keep_empty_id"] = True
        return [err]

    for nid in grid.node_ids[:2]:
        grid.hooks.append(reply_hook(wire.UPDATE, nid, unavailable))
    row = capture_metrics(grid)[0]
    assert row["participants"] == 1
    assert all("error reply (code 5): Node unavailable" in why for why in row["dropped"].values())


def test_simulated_dropout_raises_and_the_round_goes_on() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, dropout_prob=0.5, seed=3), 6)
    records = capture_metrics(grid)
    dropped = [len(r["dropped"]) for r in records]
    assert sum(dropped) > 0
    for r in records:
        assert r["participants"] == 6 - len(r["dropped"])
        assert all("SimulatedDropoutError" in why for why in r["dropped"].values())


def test_round_without_any_valid_update_keeps_the_model() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, mechanism="ldpfl"), 2)
    for nid in grid.node_ids:
        grid.hooks.append(reply_hook(wire.UPDATE, nid, lambda i, r: []))
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    before = rt.weights.clone()
    state = run_plain_round(rt, 1)
    assert len(state.dropped) == 2 and not state.client_metrics
    assert torch.equal(rt.weights, before)


# ============================================================================ bad replies
def _mutate_update(
    mutate: Callable[[RecordDict], None],
) -> Callable[[Message, Message], list[Message]]:
    return lambda i, r: [rebuild(r, i, mutate)]


def _set_array(key: str, arr: np.ndarray) -> Callable[[RecordDict], None]:
    def f(c: RecordDict) -> None:
        c.array_records[wire.UPDATE_REC] = ArrayRecord({key: Array(arr)})

    return f


BAD_UPDATES: dict[str, tuple[Callable[[RecordDict], None], str]] = {
    "extra record": (
        lambda c: c.__setitem__("corbin.junk", ConfigRecord({"a": 1})),
        "unexpected ['corbin.junk']",
    ),
    "app arrays": (
        lambda c: c.__setitem__("arrays", ArrayRecord({"w": Array(np.zeros(3, np.float32))})),
        "app record 'arrays' is a ArrayRecord",
    ),
    "missing record": (lambda c: c.__delitem__(wire.METRICS), "missing ['corbin.metrics']"),
    "wrong array key": (_set_array("values", np.zeros(10, np.uint8)), "update keys"),
    "wrong length": (_set_array(wire.BITS, np.zeros(3, np.uint8)), "must be uint8"),
    "wrong dtype": (_set_array(wire.BITS, np.zeros(3, np.float32)), "must be uint8"),
    "other round": (
        lambda c: c.config_records[wire.REPLY].__setitem__(wire.ROUND, 9),
        "round 9 in the record",
    ),
    "bad next key": (
        lambda c: c.config_records[wire.REPLY].__setitem__(wire.NEXT_PUBKEY, bytes(32)),
        "not a valid X25519 key",
    ),
    "short next key": (
        lambda c: c.config_records[wire.REPLY].__setitem__(wire.NEXT_PUBKEY, b"k"),
        "32 bytes",
    ),
    "nan metric": (
        lambda c: c.metric_records[wire.METRICS].__setitem__(wire.M_CLIP_FRACTION, float("nan")),
        "not a finite number",
    ),
    "nan app metric": (
        lambda c: c.metric_records["metrics"].__setitem__(wire.M_TRAIN_LOSS, float("nan")),
        "app metric 'train-loss' is not a finite number",
    ),
    "extra metric": (
        lambda c: c.metric_records[wire.METRICS].__setitem__("is-lead", 1.0),
        "unexpected ['is-lead']",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_update_reply_is_dropped_with_reason(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    mutate, reason = BAD_UPDATES[case]
    grid = InProcessGrid(make_cfg(num_rounds=1), 4)
    victim = grid.node_ids[2]
    grid.hooks.append(reply_hook(wire.UPDATE, victim, _mutate_update(mutate)))
    row = capture_metrics(grid)[0]
    assert list(row["dropped"]) == [str(victim)]
    assert reason in row["dropped"][str(victim)]
    assert row["participants"] == 3
    lines = [r.message for r in caplog.records if f"node {victim} dropped" in r.message]
    assert len(lines) == 1 and reason in lines[0]


def test_nan_in_float_update_is_dropped() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, mechanism="gaussian"), 3)
    victim = grid.node_ids[0]

    def poison(c: RecordDict) -> None:
        arr = c.array_records[wire.UPDATE_REC][wire.VALUES].numpy().copy()
        arr[5] = np.inf
        c.array_records[wire.UPDATE_REC] = ArrayRecord({wire.VALUES: Array(arr)})

    grid.hooks.append(reply_hook(wire.UPDATE, victim, _mutate_update(poison)))
    row = capture_metrics(grid)[0]
    assert "NaN or inf" in row["dropped"][str(victim)]
    assert row["participants"] == 2


def test_wrong_message_type_and_replay_and_duplicate() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, mechanism="ldpfl"), 4)
    a, b, c = grid.node_ids[:3]

    def wrong_type(i: Message, r: Message) -> list[Message]:
        fake = Message(copy.deepcopy(r.content), reply_to=i)
        fake.metadata.__dict__["_message_type"] = "query.other"
        return [fake]

    grid.hooks.append(reply_hook(wire.UPDATE, a, wrong_type))
    grid.hooks.append(reply_hook(wire.UPDATE, b, lambda i, r: [r, r]))  # same message id twice
    second = {}

    def two_replies(i: Message, r: Message) -> list[Message]:
        second["msg"] = rebuild(r, i, lambda content: None)
        return [r, second["msg"]]

    grid.hooks.append(reply_hook(wire.UPDATE, c, two_replies))
    row = capture_metrics(grid)[0]
    assert "wrong message type" in row["dropped"][str(a)]
    assert "replayed reply" in row["dropped"][str(b)]
    assert "more than one reply" in row["dropped"][str(c)]
    assert row["participants"] == 1


def test_reply_replayed_from_an_earlier_round_is_rejected() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, mechanism="ldpfl"), 3)
    victim = grid.node_ids[0]
    old: dict[str, Message] = {}

    def replay(i: Message, r: Message) -> list[Message]:
        if i.metadata.group_id == "1":
            old["reply"] = r
            return [r]
        stale = old["reply"]  # same content, same message id, answers round 1
        stale.metadata.__dict__["_reply_to_message_id"] = i.metadata.message_id
        return [stale]

    grid.hooks.append(reply_hook(wire.UPDATE, victim, replay))
    rows = capture_metrics(grid)
    assert rows[0]["dropped"] == {}
    assert "replayed reply" in rows[1]["dropped"][str(victim)]


def test_bad_keygen_and_pair_replies() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1), 6)
    a, b = grid.node_ids[:2]

    def low_order_key(c: RecordDict) -> None:
        c.config_records[wire.KEYS][wire.PUBKEY] = bytes(32)

    def short_blob(c: RecordDict) -> None:
        c.config_records[wire.PAIR_REC][wire.BLOB] = b"x" * 10

    grid.hooks.append(reply_hook(wire.KEYGEN, a, lambda i, r: [rebuild(r, i, low_order_key)]))
    grid.hooks.append(reply_hook(wire.PAIR, b, lambda i, r: [rebuild(r, i, short_blob)]))
    row = capture_metrics(grid)[0]
    assert "keygen" in row["dropped"][str(a)] and "X25519" in row["dropped"][str(a)]
    assert "pair" in row["dropped"][str(b)] and "bytes" in row["dropped"][str(b)]
    assert row["participants"] == 4
    # b's partner was told "partner gone": one fall-back
    assert row["fallbacks"] == 1


# ============================================================================ client side
def test_tampered_or_misbound_blob_makes_the_client_fall_back() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, test_z_digest=True), 4)

    def tamper(nid: int, msg: Message) -> Message | None:
        if not is_stage(msg, wire.UPDATE) or nid != grid.node_ids[0]:
            return None
        content = copy.deepcopy(msg.content)
        blob = bytearray(content.config_records[wire.CFG][wire.PARTNER_BLOB])  # type: ignore[arg-type]
        blob[-1] ^= 1
        content.config_records[wire.CFG][wire.PARTNER_BLOB] = bytes(blob)
        out = Message(content, dst_node_id=nid, message_type=wire.TRAIN, group_id="1")
        out.metadata.__dict__["_message_id"] = msg.metadata.message_id
        return out

    grid.instruction_hooks.append(tamper)
    row = capture_metrics(grid)[0]
    assert row["participants"] == 4 and row["dropped"] == {}
    assert row["fallbacks"] == 1
    assert row["z_matched_pairs"] == 1  # the intact pair still matched


def test_blob_of_another_pair_fails_authentication() -> None:
    """The server swaps the blobs of two pairs: all four clients detect it and use ldpq."""
    grid = InProcessGrid(make_cfg(num_rounds=1), 4)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    real = server_round.update_instruction

    def swapped(state: RoundState, nid: int, *args: Any) -> Message:
        (a, b), (c, d) = state.pairs
        if not state.__dict__.get("_swapped"):
            state.blobs[a], state.blobs[c] = state.blobs[c], state.blobs[a]
            state.blobs[b], state.blobs[d] = state.blobs[d], state.blobs[b]
            state.__dict__["_swapped"] = True
        return real(state, nid, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server_round, "update_instruction", swapped)
        state = run_plain_round(rt, 1)
    codes = {m[wire.M_FALLBACK_CODE] for m in state.client_metrics.values()}
    assert codes == {float(wire.FALLBACK_REASONS.index("blob-auth-failed"))}
    assert len(state.client_metrics) == 4


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"group": "2"}, "round 1 in the record but 2 in group_id"),
        ({"extra": 1}, "unexpected ['extra']"),
        ({"group": "x"}, "not a round number"),
    ],
)
def test_client_answers_bad_instructions_with_an_error(kwargs: dict[str, Any], reason: str) -> None:
    reply = client_app.app(keygen_instruction(**kwargs), node_context(make_cfg()))
    assert reply.has_error() and reply.error.code == wire.ERROR_CODE_REJECTED
    assert reason in (reply.error.reason or "")


def test_client_rejects_pair_without_key_and_bad_partner_key() -> None:
    ctx = node_context(make_cfg())
    _sk, pk = pair_crypto.generate_keypair()

    def pair_msg(partner_pk: bytes, rnd: int = 1) -> Message:
        return make_instruction(
            wire.PAIR, rnd, **{wire.PARTNER: 9, wire.PARTNER_PUBKEY: partner_pk}
        )

    reply = client_app.app(pair_msg(pk), ctx)
    assert reply.has_error() and "no private key for round 1" in (reply.error.reason or "")
    assert not client_app.app(keygen_instruction(), ctx).has_error()
    reply = client_app.app(pair_msg(bytes(32)), ctx)
    assert reply.has_error() and "invalid partner public key" in (reply.error.reason or "")
    first = pair_msg(pk)
    answered = client_app.app(first, ctx)
    assert not answered.has_error()
    # The same instruction again (a re-send after a SuperLink outage, or a replay): the same
    # reply, byte for byte, and no new secret (client/replay.py) ...
    again = Message(first.content, dst_node_id=5, message_type=wire.TRAIN, group_id="1")
    assert client_app.app(again, ctx).content.object_id == answered.content.object_id
    # ... but another pair instruction of the round is refused.
    _sk2, pk2 = pair_crypto.generate_keypair()
    reply = client_app.app(pair_msg(pk2), ctx)  # the same stage again, another partner key
    assert reply.has_error() and "already answered" in (reply.error.reason or "")


def test_client_rejects_bad_settings_and_a_stage_the_mechanism_lacks() -> None:
    """Bad mechanism settings in the instruction (the run config is never read) and a keygen
    for a mechanism that does not pair are refused, naming the cause."""
    bad = {**mechanism_params(), "epsilon": -1.0}
    reply = client_app.app(make_instruction(wire.KEYGEN, params=bad), node_context(make_cfg()))
    assert reply.has_error() and "epsilon" in (reply.error.reason or "")
    ctx = node_context({}, nid=5)
    ctx.node_config.update({"corbin-mechanisms": "all"})
    reply = client_app.app(
        make_instruction(wire.KEYGEN, params=mechanism_params(mechanism="fedavg")), ctx
    )
    assert reply.has_error() and "does not pair" in (reply.error.reason or "")
    reply = client_app.app(make_instruction("shuffle"), node_context(make_cfg()))
    assert reply.has_error() and "unknown stage 'shuffle'" in (reply.error.reason or "")


# ============================================================================ aggregation
def test_bits_aggregation_matches_the_mean_of_decoded_updates() -> None:
    from corbin_fl.mechanisms.packing import pack_bits
    from corbin_fl.mechanisms.quantizers import decode, ldpq

    cfg = AppConfig(mechanism="ldpfl", epsilon=2.0)
    gen = torch.Generator().manual_seed(0)
    m = 37
    w_g = torch.randn(m, generator=gen)
    c = torch.full((m,), 0.1)
    r = torch.full((m,), 2.0)
    agg = make_aggregator(cfg, w_g, c, r)
    decoded = []
    for _ in range(5):
        bits = ldpq(torch.randn(m, generator=gen), c, r, cfg.epsilon, generator=gen)
        decoded.append(decode(bits, c, r, cfg.epsilon))
        agg.add(ArrayRecord({wire.BITS: Array(pack_bits(bits))}))
    est = agg.estimate()
    assert est is not None and agg.n == 5
    torch.testing.assert_close(est, torch.stack(decoded).mean(0), rtol=0, atol=1e-5)
    new = apply_global_lr(w_g, est, 0.3)
    torch.testing.assert_close(new, 0.7 * w_g + 0.3 * est)


@pytest.mark.parametrize("mechanism", ["corbin", "ldpfl", "laplace", "fedavg"])
def test_range_mode_update_quantizes_the_local_update_around_the_global_model(
    mechanism: str,
) -> None:
    """``range-mode = "update"``: every client sees c = 0 and r = R in every layer, encodes
    ``w_i - w_g``, and the server adds the decoded mean back: with lambda = 1 no weight moves by
    more than ``R alpha`` (the extreme one-bit level), whatever the layer ranges. FedAvg gives
    the same model in both modes (it does not clip)."""
    from corbin_fl.mechanisms.quantizers import alpha

    radius = 0.004
    models = {}
    for mode in ("layer", "update"):
        grid = InProcessGrid(
            make_cfg(mechanism=mechanism, range_mode=mode, update_radius=radius, num_rounds=1), 4
        )
        rt = runtime(grid, AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config))
        before = rt.weights.clone()
        state = run_plain_round(rt, 1)
        assert len(state.client_metrics) == 4 and not state.dropped
        sent = [m for m in grid.sent if is_stage(m, wire.UPDATE)]
        rec = sent[0].content.array_records[wire.RANGE]
        center = rec[wire.CENTER].numpy()
        spread = float((rt.weights - before).abs().max())
        models[mode] = rt.weights
        if mode == "update":
            assert (center == 0).all() and (rec[wire.RADIUS].numpy() == radius).all()
            assert state.max_radius == pytest.approx(radius)
            if mechanism in ("corbin", "ldpfl"):
                assert 0 < spread <= radius * alpha(1.0) * (1 + 1e-5)
        else:
            assert state.max_radius > 10 * radius  # the layer ranges of the 0.05-scale model
    if mechanism == "fedavg":
        torch.testing.assert_close(models["update"], models["layer"], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "mechanism", ["corbin", "cq", "ternary", "gaussian", "laplace", "fedavg", "fedcad", "pbm"]
)
@pytest.mark.parametrize("lam", [1.0, 0.4])
def test_per_layer_ranges_aggregate_exactly_like_expanded_ones(mechanism: str, lam: float) -> None:
    """The server keeps c, r per layer (no model-sized expansion); same estimate and model."""
    from corbin_fl.layout import ParamLayout, expand_per_element

    layout = ParamLayout(
        names=("a", "b", "c"),
        shapes=((3, 4), (5,), (2, 2)),
        offsets=(0, 12, 17),
        sizes=(12, 5, 4),
        m=21,
    )
    m = layout.m
    cfg = AppConfig(mechanism=mechanism, epsilon=1.5, global_lr=lam)
    gen = np.random.default_rng(5)
    w_g = torch.from_numpy(gen.normal(0, 0.3, m).astype(np.float32))
    c_l = torch.tensor([0.1, -0.2, 0.0])
    r_l = torch.tensor([0.5, 1.0, 0.25])
    key, dtype, length = registry.update_spec(cfg, m)
    updates = []
    for _ in range(4):
        if dtype == np.uint8 and mechanism != "ternary":
            raw = gen.integers(0, 256, length, dtype=np.uint8)
            raw[-1] &= np.uint8((0xFF << (8 * length - m)) & 0xFF)
        elif mechanism == "ternary":
            raw = ternary.encode_ternary(
                gen.integers(-1, 2, m).astype(np.int8), cfg.param("ternary-encoding")
            )
        else:
            raw = gen.normal(0, 0.1, m).astype(np.float32)
        updates.append(ArrayRecord({key: Array(raw)}))
    per_layer = make_aggregator(cfg, w_g, c_l, r_l, layout)
    per_element = make_aggregator(
        cfg, w_g, expand_per_element(c_l, layout), expand_per_element(r_l, layout)
    )
    for rec in updates:
        per_layer.add(rec)
        per_element.add(rec)
    a, b = per_layer.estimate(), per_element.estimate()
    assert a is not None and b is not None
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        apply_global_lr(w_g, a, lam, inplace=True), apply_global_lr(w_g, b, lam), rtol=0, atol=1e-6
    )
    with pytest.raises(ValueError, match="per-layer c and r"):
        make_aggregator(cfg, w_g, c_l[:2], r_l[:2], layout)


def test_client_by_block_equals_one_call_on_expanded_ranges() -> None:
    from corbin_fl.client.encode import by_block, clip_fraction
    from corbin_fl.layout import ParamLayout, expand_per_element, range_blocks
    from corbin_fl.mechanisms.quantizers import ldpq

    layout = ParamLayout(names=("a", "b"), shapes=((7,), (9,)), offsets=(0, 7), sizes=(7, 9), m=16)
    w = torch.linspace(-1.5, 1.5, layout.m)
    c_l, r_l = torch.tensor([0.0, 0.5]), torch.tensor([1.0, 0.5])
    c, r = expand_per_element(c_l, layout), expand_per_element(r_l, layout)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    blocks = by_block(
        w,
        range_blocks(c_l, r_l, layout.m, layout),
        lambda s, cb, rb: ldpq(w[s], cb, rb, 1.0, generator=g1),
        torch.bool,
    )
    assert torch.equal(blocks, ldpq(w, c, r, 1.0, generator=g2))
    outside = ((w < c - r) | (w > c + r)).float().mean().item()
    assert clip_fraction(w, c_l, r_l, layout) == pytest.approx(outside)
    assert clip_fraction(w, c, r) == pytest.approx(outside)


def test_aggregators_reject_malformed_updates() -> None:
    m = 13
    w_g, c, r = torch.zeros(m), torch.zeros(m), torch.ones(m)
    bits = make_aggregator(AppConfig(mechanism="corbin"), w_g, c, r)
    with pytest.raises(wire.WireError, match="padding"):
        bits.add(ArrayRecord({wire.BITS: Array(np.full(2, 255, np.uint8))}))
    tern = make_aggregator(AppConfig(mechanism="ternary"), w_g, c, r)
    bad = np.packbits(np.concatenate([np.zeros(m, bool), np.ones(m, bool)]))
    with pytest.raises(wire.WireError, match="zero symbol"):
        tern.add(ArrayRecord({wire.BITS: Array(bad)}))
    assert bits.estimate() is None and bits.n == 0


def test_exchange_keeps_at_most_max_inflight_instructions_outstanding() -> None:
    grid = InProcessGrid(make_cfg(mechanism="corbin"), 5)
    state = RoundState(round=1, run_id=RUN_ID, sampled=list(grid.node_ids))
    rt = runtime(grid, AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config))
    msgs = {nid: server_round.instruction(rt, wire.KEYGEN, nid, 1, {}) for nid in state.sampled}
    outstanding: set[str] = set()
    most = 0
    push, pull = grid.push_messages, grid.pull_messages

    def counting_push(batch: Any) -> list[str]:
        nonlocal most
        ids = list(push(batch))
        outstanding.update(ids)
        most = max(most, len(outstanding))
        return ids

    def counting_pull(ids: Any) -> list[Message]:
        replies = list(pull(ids))
        outstanding.difference_update(r.metadata.reply_to_message_id for r in replies)
        return replies

    grid.push_messages, grid.pull_messages = counting_push, counting_pull  # type: ignore[method-assign]
    accepted = exchange(
        grid, state, msgs, lambda n, r: None, timeout=30.0, poll_interval=0.01, max_inflight=2
    )
    assert sorted(accepted) == sorted(grid.node_ids) and not state.dropped
    assert most == 2 and len(grid.sent) == 5
    with pytest.raises(ValueError, match="max_inflight"):
        exchange(grid, state, msgs, lambda n, r: None, timeout=1, poll_interval=0, max_inflight=-1)


def test_exchange_drops_nodes_that_cannot_be_pushed() -> None:
    grid = InProcessGrid(make_cfg(mechanism="ldpfl"), 2)
    state = RoundState(round=1, run_id=RUN_ID, sampled=[999, grid.node_ids[0]])
    rt = runtime(grid, AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config))
    msgs = {nid: server_round.instruction(rt, wire.KEYGEN, nid, 1, {}) for nid in state.sampled}
    accepted = exchange(grid, state, msgs, lambda n, r: None, timeout=0.1, poll_interval=0.01)
    assert 999 in state.dropped and "could not push" in state.dropped[999]
    assert accepted == [] and grid.node_ids[0] in state.dropped  # ldpfl rejects keygen
    assert "does not pair" in state.dropped[grid.node_ids[0]]


def test_checkpoint_rule_reloads_the_best_validation_model() -> None:
    """Validation never improves on round 0 (fixed fake score): patience 2 reloads at round 2,
    so round 3 starts from the round-0 model, exactly what round 1 started from."""
    from corbin_fl.arrays import flatten_arrays, layout_of_arrays

    grid = InProcessGrid(make_cfg(num_rounds=3, mechanism="fedavg", checkpoint_patience=2), 2)
    records = capture_metrics(grid)
    assert [r["checkpoint_reloaded"] for r in records] == [False, True, False]
    sent = [m for m in grid.sent if is_stage(m, wire.UPDATE)]
    by_round: dict[int, np.ndarray] = {}
    for m in sent:
        arrays = m.content.array_records["arrays"]
        by_round[int(m.metadata.group_id)] = flatten_arrays(arrays, layout_of_arrays(arrays))
    assert not np.array_equal(by_round[2], by_round[1])  # round 1 changed the model
    np.testing.assert_array_equal(by_round[3], by_round[1])

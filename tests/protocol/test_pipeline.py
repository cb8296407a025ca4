"""The relay pipelined one round ahead: one round trip per steady round, and dropout across the
two rounds that overlap (a node that vanishes after sending its blob, is not sampled again, or
joins late; a resumed run; a blob replayed into another round or pair).

The real server round (``server.round.run_round``) and the real ClientApp run over the in-process
grid of ``test_protocol_logic``.
"""

from __future__ import annotations

from typing import Any

import pytest
from flwr.app import Context, Error, Message, RecordDict
from harness import (
    InProcessGrid,
    keygen_instruction,
    make_cfg,
    make_instruction,
    node_context,
    reply_hook,
    runtime,
)
from wire_helpers import app_records, is_stage

from corbin_fl import wire
from corbin_fl.app import client_app
from corbin_fl.app.config import AppConfig
from corbin_fl.client import handlers, pair_crypto
from corbin_fl.server.round import ServerRuntime, run_round
from corbin_fl.server.stages import RoundState


def _setup(num_nodes: int, rounds: int = 5) -> tuple[InProcessGrid, ServerRuntime]:
    grid = InProcessGrid(make_cfg(num_rounds=rounds, test_z_digest=True), num_nodes)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    return grid, runtime(grid, cfg)


def _round(rt: ServerRuntime, rnd: int, sampled: list[int]) -> RoundState:
    return run_round(rt, rnd, sampled, app_records(rt.weights, rt.layout, rnd), "arrays")


def _fallback_code(state: RoundState, nid: int) -> str:
    return wire.FALLBACK_REASONS[int(state.client_metrics[nid][wire.M_FALLBACK_CODE])]


def _z_agree(state: RoundState) -> bool:
    return all(state.z_digests[a] == state.z_digests[b] for a, b in state.pairs)


def test_steady_relay_rounds_take_one_round_trip() -> None:
    grid, rt = _setup(4)
    nodes = grid.node_ids
    first = _round(rt, 1, nodes)
    assert first.round_trips == 3 and first.carried_pairs == 0  # keygen -> pair -> update
    assert rt.pipeline is not None and rt.pipeline.round == 2
    assert set(rt.pipeline.blobs) == set(nodes)
    for rnd in (2, 3, 4):
        state = _round(rt, rnd, nodes)
        assert state.round_trips == 1, rnd  # update only
        assert state.stage_replies == {"update": 4}
        assert state.carried_pairs == 2 and not state.pipeline_broken
        assert all(m[wire.M_PAIRED] == 1.0 for m in state.client_metrics.values())
        assert _z_agree(state)  # the pipelined blobs gave both partners the same z
    pipelined_pairs = [
        sorted((int(m.metadata.dst_node_id), int(m.content[wire.CFG][wire.NEXT_PARTNER])))
        for m in grid.sent
        if is_stage(m, wire.UPDATE) and wire.NEXT_PARTNER in m.content[wire.CFG]
    ]
    assert len({tuple(p) for p in pipelined_pairs}) > 2  # the pairing is redrawn every round


def test_last_round_seals_no_blob_for_a_round_that_will_not_run() -> None:
    grid, rt = _setup(4, rounds=2)
    _round(rt, 1, grid.node_ids)
    _round(rt, 2, grid.node_ids)
    last = [m for m in grid.received if is_stage(m, wire.UPDATE)][-4:]
    assert all(wire.NEXT_BLOB not in m.content[wire.REPLY] for m in last)


def test_partner_not_sampled_again_falls_back_without_waiting() -> None:
    """clients-per-round below the federation: the lone node whose pipelined partner was not
    sampled quantizes with ldpq (partner-gone); the round is still one round trip."""
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    assert rt.pipeline is not None
    a = grid.node_ids[0]
    b = rt.pipeline.partner[a]
    state = _round(rt, 2, [n for n in grid.node_ids if n != b])
    assert state.round_trips == 1
    assert state.pipeline_broken == {"partner-not-sampled": 1}
    assert state.carried_pairs == 1 and len(state.client_metrics) == 3
    assert state.client_metrics[a][wire.M_FALLBACK] == 1.0
    assert _fallback_code(state, a) == "partner-gone"


def test_two_orphans_pair_afresh_with_a_pair_stage() -> None:
    grid, rt = _setup(6)
    _round(rt, 1, grid.node_ids)
    assert rt.pipeline is not None
    a = grid.node_ids[0]
    c = next(n for n in grid.node_ids if n not in (a, rt.pipeline.partner[a]))
    absent = {rt.pipeline.partner[a], rt.pipeline.partner[c]}
    state = _round(rt, 2, [n for n in grid.node_ids if n not in absent])
    assert state.pipeline_broken == {"partner-not-sampled": 2}
    assert state.round_trips == 2 and state.stage_replies == {"pair": 2, "update": 4}
    assert state.partner[a] == c and state.carried_pairs == 1
    assert all(m[wire.M_PAIRED] == 1.0 for m in state.client_metrics.values())
    assert _z_agree(state)


def test_node_vanishing_after_its_blob_does_not_stall_its_partner() -> None:
    """The node sent its blob for round 2 with its round-1 update, then never answers round 2:
    its partner used the blob, and its paired update counts (each role's marginal is LDPQ's)."""
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    assert rt.pipeline is not None
    victim = grid.node_ids[2]
    partner = rt.pipeline.partner[victim]
    grid.hooks.append(reply_hook(wire.UPDATE, victim, lambda i, r: []))
    state = _round(rt, 2, grid.node_ids)
    assert state.round_trips == 1
    assert "no reply" in state.dropped[victim]
    assert state.client_metrics[partner][wire.M_PAIRED] == 1.0
    assert len(state.client_metrics) == 3
    assert rt.pipeline is not None and victim not in rt.pipeline.blobs


def test_partner_without_a_blob_is_paired_afresh_next_round() -> None:
    """A node's round-1 update failed, so it sent no blob for round 2: its pipelined partner and
    it (after a fresh keygen) pair again in round 2's own pair stage."""
    grid, rt = _setup(4)
    victim = grid.node_ids[1]
    hook = reply_hook(wire.UPDATE, victim, lambda i, r: [Message(Error(5, "gone"), reply_to=i)])
    grid.hooks.append(hook)
    _round(rt, 1, grid.node_ids)
    grid.hooks.remove(hook)
    assert rt.pipeline is not None
    partner = rt.pipeline.partner[victim]
    state = _round(rt, 2, grid.node_ids)
    assert state.pipeline_broken == {"no-blob": 1, "partner-no-blob": 1}
    assert state.round_trips == 3  # keygen (victim's key was dropped) -> pair -> update
    assert state.partner[victim] == partner  # the only two orphans pair again
    assert all(m[wire.M_PAIRED] == 1.0 for m in state.client_metrics.values())
    assert _z_agree(state)


def test_node_joining_between_rounds_gets_a_key_and_pairs_from_the_next_round() -> None:
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    joiner = 999
    first = grid.contexts[grid.node_ids[0]]
    grid.contexts[joiner] = Context(
        run_id=first.run_id,
        node_id=joiner,
        node_config=dict(first.node_config),
        state=RecordDict(),
        run_config=dict(first.run_config),
    )
    state = _round(rt, 2, [*grid.node_ids, joiner])
    assert state.round_trips == 2 and state.stage_replies == {"keygen": 1, "update": 5}
    assert _fallback_code(state, joiner) == "unpaired" and state.carried_pairs == 2
    assert joiner in state.next_partner  # in round 3's pairing already
    state3 = _round(rt, 3, [*grid.node_ids, joiner])
    assert state3.round_trips == 1 and state3.carried_pairs == 2


def test_a_resumed_run_bootstraps_afresh() -> None:
    """A resumed run builds a new ServerRuntime (the pipeline is never checkpointed): its first
    round runs keygen -> pair -> update again, and every pair agrees on z."""
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    _round(rt, 2, grid.node_ids)
    resumed = runtime(grid, rt.cfg)
    assert resumed.pipeline is None
    state = _round(resumed, 3, grid.node_ids)
    assert state.round_trips == 3 and state.carried_pairs == 0
    assert _z_agree(state) and len(state.z_digests) == 4


def test_a_pipeline_of_a_skipped_round_is_dropped() -> None:
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    state = _round(rt, 3, grid.node_ids)  # round 2 never ran
    assert state.carried_pairs == 0 and state.round_trips == 3  # keygen -> pair -> update
    assert _z_agree(state)


@pytest.mark.parametrize("swap", ["other-round", "other-pair"])
def test_blob_replayed_into_another_round_or_pair_fails_authentication(swap: str) -> None:
    grid, rt = _setup(4)
    _round(rt, 1, grid.node_ids)
    assert rt.pipeline is not None
    round2 = dict(rt.pipeline.blobs)
    pairs2 = dict(rt.pipeline.partner)
    _round(rt, 2, grid.node_ids)
    assert rt.pipeline is not None
    victim = grid.node_ids[0]
    partner = rt.pipeline.partner[victim]
    if swap == "other-round":  # the partner's blob for round 2 instead of its blob for round 3
        forged = round2[partner]
    else:  # the blob another node sealed for its own round-3 partner
        forged = next(
            blob for nid, blob in rt.pipeline.blobs.items() if nid not in (victim, partner)
        )
    assert forged != rt.pipeline.blobs[partner] and pairs2

    def forge(nid: int, msg: Message) -> Message | None:
        if nid == victim and is_stage(msg, wire.UPDATE):
            msg.content[wire.CFG][wire.PARTNER_BLOB] = forged
        return None

    grid.instruction_hooks.append(forge)
    state = _round(rt, 3, grid.node_ids)
    assert _fallback_code(state, victim) == "blob-auth-failed"
    assert state.client_metrics[partner][wire.M_PAIRED] == 1.0  # the partner was not touched


# ============================================================================ client side
def _update_instruction(**extra: Any) -> Message:
    grid, rt = _setup(2)
    _round(rt, 1, grid.node_ids)
    msg = next(m for m in reversed(grid.sent) if is_stage(m, wire.UPDATE))
    for key, value in extra.items():
        if value is None:
            del msg.content[wire.CFG][key]
        else:
            msg.content[wire.CFG][key] = value
    return msg


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({wire.NEXT_PARTNER: 7, wire.NEXT_PARTNER_PUBKEY: None}, "needs both"),
        ({wire.NEXT_PARTNER: 7, wire.NEXT_PARTNER_PUBKEY: b"k"}, "bytes"),
        ({wire.NEXT_PARTNER: -1, wire.NEXT_PARTNER_PUBKEY: bytes(32)}, "next-partner"),
    ],
)
def test_client_rejects_a_malformed_pipelined_pair(extra: dict[str, Any], reason: str) -> None:
    msg = _update_instruction(**extra)
    ctx = Context(
        run_id=msg.metadata.run_id,
        node_id=int(msg.metadata.dst_node_id),
        node_config=dict(_setup(2)[0].contexts[101].node_config),
        state=RecordDict(),
        run_config={},
    )
    reply = client_app.app(msg, ctx)
    assert reply.has_error() and reason in (reply.error.reason or "")


def test_client_pipelined_pair_to_itself_is_refused() -> None:
    msg = _update_instruction()
    nid = int(msg.metadata.dst_node_id)
    msg.content[wire.CFG][wire.NEXT_PARTNER] = nid
    msg.content[wire.CFG][wire.NEXT_PARTNER_PUBKEY] = bytes(32)
    ctx = Context(msg.metadata.run_id, nid, {}, RecordDict(), {})
    reply = client_app.app(msg, ctx)
    assert reply.has_error() and "not another node" in (reply.error.reason or "")


def test_pair_stage_may_replace_a_pipelined_pair_but_not_itself() -> None:
    """A node whose pipelined partner is gone is paired afresh by the pair stage (the pipelined
    state is replaced); a replayed pair instruction of that round gets the same reply, another
    pair instruction of that round is refused."""
    ctx = node_context(make_cfg())
    assert not client_app.app(keygen_instruction(rnd=2), ctx).has_error()
    _sk, pk_b = pair_crypto.generate_keypair()
    _sk, pk_c = pair_crypto.generate_keypair()
    sk = ctx.state.config_records[handlers.STATE_KEY]["sk"]
    assert isinstance(sk, bytes)
    handlers._seal_pair(  # what round 1's update reply left behind: a pipelined pair with 9
        ctx,
        AppConfig(),
        sk,
        pk_b,
        pair_crypto.PairContext(ctx.run_id, 2, ctx.node_id, 9),
        None,
        handlers.SOURCE_PIPELINE,
    )

    def pair_msg(partner: int, pk: bytes) -> Message:
        return make_instruction(wire.PAIR, 2, **{wire.PARTNER: partner, wire.PARTNER_PUBKEY: pk})

    answered = client_app.app(pair_msg(11, pk_c), ctx)
    assert not answered.has_error()
    state = ctx.state.config_records[handlers.STATE_PAIR]
    assert state[wire.PARTNER] == 11 and state["source"] == handlers.SOURCE_PAIR
    # The same instruction again (a replay, or a re-send after a SuperLink outage): the same
    # reply, byte for byte, and the pair state untouched (client/replay.py) ...
    again = client_app.app(pair_msg(11, pk_c), ctx)
    assert not again.has_error() and again.content.object_id == answered.content.object_id
    assert ctx.state.config_records[handlers.STATE_PAIR] == state
    # ... and another pair instruction of that round is refused.
    _sk, pk_d = pair_crypto.generate_keypair()
    reply = client_app.app(pair_msg(12, pk_d), ctx)
    assert reply.has_error() and "already answered" in (reply.error.reason or "")


@pytest.mark.parametrize("case", ["wrong-size", "unasked"])
def test_a_bad_next_blob_drops_only_its_sender(case: str) -> None:
    """A ``next-blob`` of the wrong size, or one the instruction did not ask for (no
    ``next-partner``: the odd one out of round 2's pairing), is a wire error: that node is
    dropped, the others count."""
    grid, rt = _setup(5)
    forged: list[int] = []

    def forge(nid: int, instruction: Message, reply: Message | None) -> list[Message] | None:
        if reply is None or not is_stage(instruction, wire.UPDATE) or reply.has_error():
            return None
        asked = wire.NEXT_PARTNER in instruction.content[wire.CFG]
        head = reply.content[wire.REPLY]
        if case == "unasked" and not asked:
            head[wire.NEXT_BLOB] = bytes(wire.blob_len(wire.SEED_BYTES))
        elif case == "wrong-size" and asked and not forged:
            head[wire.NEXT_BLOB] = b"x" * 7
        else:
            return None
        forged.append(nid)
        return [reply]

    grid.hooks.append(forge)
    state = _round(rt, 1, grid.node_ids)
    assert len(forged) == 1 and set(state.dropped) == set(forged)
    assert wire.NEXT_BLOB in state.dropped[forged[0]]
    assert len(state.client_metrics) == 4

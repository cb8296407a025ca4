"""Secure aggregation pipelined one round ahead (issue 29 item 5: round trips).

A steady secure round is 2 round trips: the update instruction asks for the node's SecAgg+ keys
of round ``t+1``, and the unmask instruction of round ``t`` carries round ``t+1``'s share
request. These tests change the sample between rounds on the real server round
(``server.round.run_round``) and the real ClientApp over the in-process grid: every sum stays
exact, bit for bit the sum of the survivors' symbols; a pipelined node not sampled counts as
dropped before masking; a sample with a node outside the pipeline re-keys every node; a node
that fails (silent or refusing) the pipelined share is dropped from the next round at
``secagg-share`` and rejoins the round after.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Message
from harness import InProcessGrid, make_cfg, rebuild, reply_hook, runtime
from wire_helpers import app_records, message_stage

from corbin_fl import secure, wire
from corbin_fl.app.config import AppConfig
from corbin_fl.secagg.client import MASKED, SecAggClient
from corbin_fl.secagg.wire import STATE_RECORD
from corbin_fl.server import secure_round
from corbin_fl.server.round import ServerRuntime, run_round
from corbin_fl.server.stages import RoundState


class Sums:
    """Each client's symbol vector as it masks it, and each round's unmasked sum."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inputs: dict[tuple[int, int], np.ndarray] = {}
        self.totals: dict[int, tuple[np.ndarray, int]] = {}
        mask, feed = SecAggClient.mask, secure_round.feed

        def record_mask(client: SecAggClient, req: Any, x: np.ndarray) -> Any:
            self.inputs[(req.server_round, client.node_id)] = np.asarray(x, dtype=np.int64)
            return mask(client, req, x)

        def record_feed(aggregator: Any, total: np.ndarray, n: int, cfg: Any) -> None:
            self.totals[aggregator.round] = (np.asarray(total, dtype=np.int64).copy(), n)
            feed(aggregator, total, n, cfg)

        monkeypatch.setattr(SecAggClient, "mask", record_mask)
        monkeypatch.setattr(secure_round, "feed", record_feed)

    def assert_exact(self, state: RoundState, nodes: list[int]) -> None:
        total, n = self.totals[state.round]
        assert n == len(nodes) == state.secure["survivors"]
        plain = sum(self.inputs[(state.round, u)] for u in nodes)
        assert np.array_equal(total, plain)


@pytest.fixture
def sums(monkeypatch: pytest.MonkeyPatch) -> Sums:
    return Sums(monkeypatch)


def _setup(num_nodes: int, rounds: int = 4) -> tuple[InProcessGrid, ServerRuntime]:
    grid = InProcessGrid(
        make_cfg(mechanism="ldpfl", num_rounds=rounds, **{"secure-aggregation": True}), num_nodes
    )
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    return grid, runtime(grid, cfg)


def _round(rt: ServerRuntime, rnd: int, sampled: list[int], monkeypatch: Any) -> RoundState:
    from corbin_fl.server import round as server_round

    make = server_round.make_aggregator

    def tagged(*args: Any, **kwargs: Any) -> Any:  # the round the sum is fed for
        agg = make(*args, **kwargs)
        agg.round = rnd
        return agg

    monkeypatch.setattr(server_round, "make_aggregator", tagged)
    return run_round(rt, rnd, sampled, app_records(rt.weights, rt.layout, rnd), "arrays")


def _trips(state: RoundState) -> tuple[int, bool]:
    return state.secure["round_trips"], state.secure["pipelined"]


def test_steady_secure_rounds_take_two_round_trips(
    sums: Sums, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid, rt = _setup(5, rounds=3)
    nodes = grid.node_ids
    states = [_round(rt, rnd, nodes, monkeypatch) for rnd in (1, 2, 3)]
    # round 1: advertise -> share -> update -> unmask (round 2's share rides the unmask)
    assert [_trips(s) for s in states] == [(4, False), (2, True), (2, True)]
    for state in states:
        sums.assert_exact(state, nodes)
        assert state.dropped == {}
    # the last round asks for no keys and no share of a round that will not run
    last = [m for m in grid.sent if m.metadata.group_id == "3"]
    assert last and all(secure.NEXT_REC not in m.content for m in last)
    assert rt.secagg_next is None
    first_unmask = [m for m in grid.sent if message_stage(m) == secure.UNMASK][:5]
    assert all(secure.NEXT_REC in m.content for m in first_unmask)


def test_a_pipelined_node_not_sampled_counts_as_dropped_before_masking(
    sums: Sums, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 samples 4 of round 1's 5: the pipelined shares serve; the fifth node masked
    nothing, so its mask key is recovered and the sum is exact over the 4."""
    grid, rt = _setup(5)
    nodes = grid.node_ids
    _round(rt, 1, nodes, monkeypatch)
    second = _round(rt, 2, nodes[:4], monkeypatch)
    assert _trips(second) == (2, True)
    sums.assert_exact(second, nodes[:4])
    assert second.dropped == {} and sorted(second.client_metrics) == nodes[:4]
    third = _round(rt, 3, nodes[:4], monkeypatch)  # round 3's graph was drawn over the 4
    assert _trips(third) == (2, True)
    sums.assert_exact(third, nodes[:4])


def test_a_subset_too_small_for_the_pipelined_graph_rekeys(
    sums: Sums, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 samples 3 of round 1's 7: in round 2's graph (drawn over the 7, t = 4) no node
    keeps t sampled holders, so the pipelined shares would abandon the round: it re-keys."""
    grid, rt = _setup(7)
    nodes = grid.node_ids
    _round(rt, 1, nodes, monkeypatch)
    assert rt.secagg_next is not None and not rt.secagg_next.serves(nodes[:3])
    second = _round(rt, 2, nodes[:3], monkeypatch)
    assert _trips(second) == (4, False) and second.secure["abandoned"] is None
    sums.assert_exact(second, nodes[:3])


def test_a_sample_outside_the_pipeline_rekeys_every_node(
    sums: Sums, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node joins in round 2: the pipelined shares (over round 1's 4) cannot cover it, so every
    node re-keys (advertise, share); round 3 is pipelined again."""
    grid, rt = _setup(5)
    nodes = grid.node_ids
    _round(rt, 1, nodes[:4], monkeypatch)
    second = _round(rt, 2, nodes, monkeypatch)
    assert _trips(second) == (4, False)
    assert second.stage_replies[secure.ADVERTISE] == 5  # the 4 that had shared re-key too
    sums.assert_exact(second, nodes)
    third = _round(rt, 3, nodes, monkeypatch)
    assert _trips(third) == (2, True)
    sums.assert_exact(third, nodes)


@pytest.mark.parametrize("how", ["silent", "refuses"])
def test_a_node_failing_the_pipelined_share_rejoins_a_round_later(
    how: str, sums: Sums, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node X's round-1 unmask reply (with its round-2 shares) is lost, or X refuses it (a
    share request it cannot accept). Round 1's sum is exact over all 5 (X masked; its self-mask
    seed comes from its holders); round 2 drops X at secagg-share; round 3 re-keys and X is back.
    A refusal changes nothing of X's state: it is still at round 1's mask stage."""
    grid, rt = _setup(5)
    nodes = grid.node_ids
    x = nodes[2]

    if how == "silent":

        def hook(nid: int, instruction: Message, reply: Message | None) -> list[Message] | None:
            hit = nid == x and message_stage(instruction) == secure.UNMASK
            return [] if hit and instruction.metadata.group_id == "1" else None

        grid.hooks.append(hook)
    else:

        def corrupt(nid: int, msg: Message) -> Message | None:
            if nid == x and message_stage(msg) == secure.UNMASK and msg.metadata.group_id == "1":
                msg.content.config_records[secure.NEXT_REC]["threshold"] = 1  # t <= |N| / 2
            return None

        grid.instruction_hooks.append(corrupt)
    first = _round(rt, 1, nodes, monkeypatch)
    sums.assert_exact(first, nodes)
    assert str(x) in first.secure["faulty"] and first.secure["next_shared"] == 4
    if how == "refuses":
        state = grid.contexts[x].state.config_records[STATE_RECORD]
        assert (state["round"], state["stage"]) == (1, MASKED)
        refusal = next(m for m in grid.received if m.has_error() and m.metadata.src_node_id == x)
        assert "threshold 1" in refusal.error.reason
    second = _round(rt, 2, nodes, monkeypatch)
    assert _trips(second) == (2, True)
    assert second.dropped[x].startswith(secure.SHARE)
    sums.assert_exact(second, [u for u in nodes if u != x])
    third = _round(rt, 3, nodes, monkeypatch)
    assert _trips(third) == (4, False)
    sums.assert_exact(third, nodes)


def test_a_next_record_naming_another_round_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipelined records must name round t+1: an update asking for keys of round t+2 (node
    A, round 1), or an unmask carrying a share of round t (node B, round 2), is refused whole:
    A drops out of round 1, B's unmask shares are not used (its input is in the sum) and B is
    not in round 3's shares."""
    grid, rt = _setup(5)
    nodes = grid.node_ids
    a, b = nodes[0], nodes[1]

    def shift(nid: int, msg: Message) -> Message | None:
        rec = msg.content.config_records.get(secure.NEXT_REC)
        if rec is not None and (nid, message_stage(msg), msg.metadata.group_id) in {
            (a, wire.UPDATE, "1"),
            (b, secure.UNMASK, "2"),
        }:
            rec["round"] = 3 if nid == a else 2
        return None

    grid.instruction_hooks.append(shift)
    first = _round(rt, 1, nodes, monkeypatch)
    assert first.dropped[a].startswith(wire.UPDATE) and first.secure["survivors"] == 4
    second = _round(rt, 2, nodes, monkeypatch)
    assert _trips(second) == (4, False)  # A had no round-2 share: every node re-keys
    assert str(b) in second.secure["faulty"] and second.secure["survivors"] == 5
    assert second.secure["next_shared"] == 4
    third = _round(rt, 3, nodes, monkeypatch)
    assert third.dropped[b].startswith(secure.SHARE) and third.secure["pipelined"]
    reasons = [m.error.reason for m in grid.received if m.has_error()]
    assert any("names ('advertise', 3), expected ('advertise', 2)" in r for r in reasons)
    assert any("names ('share', 2), expected ('share', 3)" in r for r in reasons)


def test_keys_ahead_that_are_not_x25519_keys_drop_their_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server uses the keys ahead without an advertise stage of their own, so it checks
    them as an advertise reply's: a 31-byte key drops its sender from the round (update
    stage); the other 4 sum."""
    grid, rt = _setup(5)
    bad = grid.node_ids[0]

    def short_key(content: Any) -> None:
        content.config_records[secure.NEXT_REC]["c-pk"] = bytes(31)

    grid.hooks.append(reply_hook(wire.UPDATE, bad, lambda ins, rep: [rebuild(rep, ins, short_key)]))
    first = _round(rt, 1, grid.node_ids, monkeypatch)
    assert first.dropped[bad].startswith(wire.UPDATE) and "32 bytes" in first.dropped[bad]
    assert first.secure["survivors"] == 4 and first.secure["abandoned"] is None

"""SecAgg+ as a Flower building block (corbin_fl.secagg.mod / .strategy), in process.

A toy Message-API strategy (sums integer vectors) wrapped by ``SecAggPlus`` and a toy ClientApp
(``ClientApp(mods=[secagg_mod])`` whose train handler returns integer arrays) run through
Flower's own ``Strategy.start`` on an in-process grid (the pattern of ``harness.py``, without
the project's app): every sum is the plain sum, bit for bit, with dropouts at every stage. A
steady round is 2 round trips (mask with the next round's advertise, unmask with the next round's
share); a round whose sample does not fit the pipelined share re-keys (4).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from corbin_fl.secagg import wire
from corbin_fl.secagg.mod import secagg_mod
from corbin_fl.secagg.strategy import SecAggPlus, SecAggRound

RUN_ID = 5151
LEVELS = 3
SHAPES = {"w": (4, 5), "b": (7,)}


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TaskIdentity, "_run_id", RUN_ID)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


@pytest.fixture(autouse=True)
def _stub_training() -> None:
    """This module trains nothing: it overrides the directory's model and data stubs."""


def update_of(node: int, rnd: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([node, rnd])
    return {k: rng.integers(0, LEVELS + 1, size=s).astype(np.uint8) for k, s in SHAPES.items()}


toy = ClientApp(mods=[secagg_mod])


@toy.train()
def train(msg: Message, context: Context) -> Message:
    rnd = int(msg.content["config"]["server-round"])
    if context.node_config.get("float-updates"):
        arrays = {"w": Array(np.zeros(3, dtype=np.float32))}
    else:
        arrays = {k: Array(v) for k, v in update_of(context.node_id, rnd).items()}
    return Message(
        RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": 9})}),
        reply_to=msg,
    )


Sample = Callable[[int, list[int]], list[int]]
"""sample(round, node ids) -> the nodes the strategy trains that round."""


class SumStrategy(Strategy):
    """Sends every sampled node (default: all) the round's config; sums integer arrays."""

    def __init__(self, sample: Sample | None = None) -> None:
        self.sums: dict[int, dict[str, np.ndarray]] = {}
        self.sample = sample

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        cfg = ConfigRecord({**config, "server-round": server_round})
        return [
            Message(
                RecordDict({"arrays": arrays, "config": cfg}), dst_node_id=n, message_type="train"
            )
            for n in (
                self.sample(server_round, list(grid.get_node_ids()))
                if self.sample
                else grid.get_node_ids()
            )
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        total = {
            k: sum(r.content["arrays"][k].numpy().astype(np.int64) for r in replies) for k in SHAPES
        }
        self.sums[server_round] = total
        return ArrayRecord({k: Array(v) for k, v in total.items()}), None

    def configure_evaluate(self, *args: Any) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, *args: Any) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        pass


Hook = Callable[[int, Message, Message | None], Message | str | None]
"""hook(node, instruction, reply) -> replacement reply, None (keep), or "drop" (no reply)."""


class Grid1(Grid):
    """Flower Grid whose nodes are ``toy`` calls in this process (message ids as a SuperLink)."""

    def __init__(self, num_nodes: int, node_config: dict[int, dict] | None = None) -> None:
        self._run = Run.create_empty(RUN_ID)
        self.ids = [301 + 11 * i for i in range(num_nodes)]
        self.contexts = {
            n: Context(RUN_ID, n, (node_config or {}).get(n, {}), RecordDict(), {})
            for n in self.ids
        }
        self.hooks: list[Hook] = []
        self.before: list[Callable[[int, Message], None]] = []
        self.sent: list[Message] = []
        self.calls = 0

    @property
    def run(self) -> Run:
        return self._run

    def set_run(self, run: Run) -> None:  # pragma: no cover
        self._run = run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        self.calls += 1
        out = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            for pre in self.before:
                pre(node, msg)
            try:
                reply: Message | None = toy(msg, self.contexts[node])
            except Exception as exc:
                reply = Message(Error(code=2, reason=str(exc)), reply_to=msg)
            for hook in self.hooks:
                res = hook(node, msg, reply)
                if isinstance(res, str):
                    reply = None
                    break
                if res is not None:
                    reply = res
            if reply is not None:
                reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
                out.append(reply)
        return out


def stage(msg: Message) -> tuple[str, int] | None:
    rec = msg.content.config_records.get(wire.RECORD) if msg.has_content() else None
    return (str(rec["stage"]), int(rec["round"])) if rec else None


def next_stage(msg: Message) -> tuple[str, int] | None:
    """The next round's stage riding a message (pipelined), if any."""
    rec = msg.content.config_records.get(wire.NEXT_RECORD) if msg.has_content() else None
    return (str(rec["stage"]), int(rec["round"])) if rec else None


def drop_at(stage_name: str, nodes: set[int], rnd: int | None = None) -> Hook:
    def hook(node: int, msg: Message, reply: Message | None) -> str | None:
        st = stage(msg)
        if node in nodes and st and st[0] == stage_name and (rnd is None or st[1] == rnd):
            return "drop"
        return None

    return hook


def plain(nodes: Iterable[int], rnd: int) -> dict[str, np.ndarray]:
    ups = [update_of(n, rnd) for n in nodes]
    return {k: np.sum([u[k].astype(np.int64) for u in ups], axis=0) for k in SHAPES}


def start(
    grid: Grid1, rounds: int = 3, sample: Sample | None = None, **kw: Any
) -> tuple[SecAggPlus, SumStrategy]:
    inner = SumStrategy(sample)
    strategy = SecAggPlus(inner, levels=LEVELS, **kw)
    init = ArrayRecord({"w": Array(np.zeros(1, dtype=np.int64))})
    strategy.start(grid=grid, initial_arrays=init, num_rounds=rounds, timeout=10)
    return strategy, inner


def assert_exact(strategy: SecAggPlus, inner: SumStrategy, rnd: int) -> None:
    out = strategy.outcomes[rnd]
    assert out.abandoned is None, out.abandoned
    expected = plain(out.survivors, rnd)
    for k, shape in SHAPES.items():
        got = inner.sums[rnd][k]
        assert got.shape == shape and got.dtype == np.int64
        assert np.array_equal(got, expected[k]), k


def test_strategy_start_sums_exactly_and_pipelines_the_keys() -> None:
    grid = Grid1(6)
    strategy, inner = start(grid)
    for rnd in (1, 2, 3):
        assert_exact(strategy, inner, rnd)
        assert strategy.outcomes[rnd].survivors == tuple(grid.ids)
    # Round 1: advertise, share, mask, unmask; later rounds: the next round's keys came with
    # the mask replies and its shares with the unmask replies.
    assert strategy.round_trips == {1: 4, 2: 2, 3: 2}
    assert strategy.pipelined == {1: False, 2: True, 3: True}
    assert grid.calls == 4 + 2 + 2 + 3  # + Flower's evaluate exchange (empty) each round


def test_what_the_server_receives_is_b_bit_packed_and_masked() -> None:
    """Each mask reply holds only the packed y (b = bit_width(5, 3) = 4 bits per parameter)
    and the public layout: none of the handler's arrays or metrics."""
    grid = Grid1(5)
    replies: dict[int, Message] = {}

    def capture(node: int, msg: Message, reply: Message | None) -> None:
        if stage(msg) == ("mask", 1) and reply is not None:
            replies[node] = reply

    grid.hooks.append(capture)
    strategy, inner = start(grid, rounds=1)
    assert_exact(strategy, inner, 1)
    d = sum(int(np.prod(s)) for s in SHAPES.values())
    bits = 4
    assert (5 * LEVELS).bit_length() == bits
    for node, reply in replies.items():
        assert set(reply.content) == {wire.RECORD, wire.MASKED_RECORD}
        packed = reply.content[wire.MASKED_RECORD][wire.MASKED_ARRAY].numpy()
        assert packed.dtype == np.uint8 and packed.size == (d * bits + 7) // 8
        y, layout = wire.decode_mask_reply(reply.content, bits)
        assert layout == tuple((k, s) for k, s in SHAPES.items())
        x = np.concatenate([v.reshape(-1) for v in update_of(node, 1).values()])
        assert np.mean(y.masked == x) < 0.3  # masked: agrees with x about 1/16 of the time


@pytest.mark.parametrize(
    ("stage_name", "nodes", "rnd", "trips"),
    [
        ("advertise", {301}, 1, {1: 4, 2: 4, 3: 2}),
        ("share", {312}, 1, {1: 4, 2: 4, 3: 2}),
        ("mask", {323, 356}, 2, {1: 4, 2: 2, 3: 4}),
        ("unmask", {334}, 2, {1: 4, 2: 2, 3: 2}),
    ],
    ids=["advertise", "share", "before-masking", "during-unmasking"],
)
def test_dropouts_at_every_stage_keep_the_sum_exact(
    stage_name: str, nodes: set[int], rnd: int, trips: dict[int, int]
) -> None:
    """Only round 1 has advertise and share stages of its own (later ones ride the previous
    round), so those dropouts are in round 1, the others in the pipelined round 2. A node that
    dropped before its unmask sent no keys ahead or none that were used: the next round's sample
    (all nodes) is not a subset of the pipelined set and every node re-keys (4 round trips). A
    node silent at the unmask (and the next round's share riding it) is in the round's sum and
    is dropped at the next round's share, which stays pipelined."""
    grid = Grid1(7)
    grid.hooks.append(drop_at(stage_name, nodes, rnd=rnd))
    strategy, inner = start(grid)
    for r in (1, 2, 3):
        assert_exact(strategy, inner, r)
    out = strategy.outcomes[rnd]
    if stage_name == "unmask":
        assert set(out.survivors) == set(grid.ids) and set(out.faulty) == nodes
        nxt = strategy.outcomes[rnd + 1]
        assert set(nxt.survivors) == set(grid.ids) - nodes
        assert all(nxt.dropped[n].startswith("share") for n in nodes)
    else:
        assert set(out.survivors) == set(grid.ids) - nodes
        assert all(out.dropped[n].startswith(stage_name) for n in nodes)
        assert set(strategy.outcomes[rnd + 1].survivors) == set(grid.ids)  # back, re-keyed
    assert strategy.round_trips == trips
    assert strategy.pipelined == {r: r > 1 and trips[r] == 2 for r in trips}


def test_too_many_dropouts_abandon_the_round_and_keep_the_model() -> None:
    grid = Grid1(6)  # k = 5, t = 3
    grid.hooks.append(drop_at("unmask", {301, 312, 323, 334}, rnd=2))
    strategy, inner = start(grid)
    out = strategy.outcomes[2]
    assert out.total is None and out.abandoned and out.abandoned.startswith("unmask")
    assert 2 not in inner.sums  # nothing half-applied: the wrapped strategy saw nothing
    assert_exact(strategy, inner, 3)
    # round 3's pipelined share lost the same nodes (abandoned): every node re-keys
    assert strategy.round_trips == {1: 4, 2: 2, 3: 4}


def test_a_malformed_share_drops_only_its_sender() -> None:
    grid = Grid1(6)

    def corrupt(node: int, msg: Message, reply: Message | None) -> Message | None:
        if node == 345 and stage(msg) == ("share", 1) and reply is not None:
            content = copy.deepcopy(reply.content)
            cts = list(content[wire.RECORD]["ciphertexts"])
            cts[0] = cts[0][:-1] + bytes([cts[0][-1] ^ 1])
            content[wire.RECORD]["ciphertexts"] = cts
            return Message(content, reply_to=msg)
        return None

    grid.hooks.append(corrupt)
    strategy, inner = start(grid, rounds=1)
    out = strategy.outcomes[1]
    assert set(out.dropped) == {345} and "rejected by" in out.dropped[345]
    assert_exact(strategy, inner, 1)


def test_malformed_replies_drop_only_their_senders() -> None:
    grid = Grid1(9)  # k = 8, t = 5: six are left, each with five live neighbours

    def garble(node: int, msg: Message, reply: Message | None) -> Message | None:
        st = stage(msg)
        if reply is None or st is None:
            return None
        content = copy.deepcopy(reply.content)
        if node == 301 and st[0] == "advertise":
            content[wire.RECORD]["c-pk"] = b"short"
        elif node == 312 and st[0] == "share":
            content[wire.RECORD]["extra"] = 1
        elif node == 323 and st[0] == "mask":
            content[wire.RECORD]["round"] = 99
        else:
            return None
        return Message(content, reply_to=msg)

    grid.hooks.append(garble)
    strategy, inner = start(grid, rounds=1)
    out = strategy.outcomes[1]
    assert set(out.dropped) == {301, 312, 323}
    assert_exact(strategy, inner, 1)


def test_replays_across_rounds_are_refused() -> None:
    """Round 1's share instruction and its unmask instruction (with round 2's share riding it)
    replayed to their node in round 2: error replies (state kept); round 1's mask reply
    replayed in round 2 is ignored (answers no round-2 instruction)."""
    grid = Grid1(5)
    captured: dict[str, Message] = {}

    replayed: list[str] = []

    def replay(node: int, old: Message) -> None:
        replayed.append(str(stage(old)))
        before = dict(grid.contexts[node].state.config_records[wire.STATE_RECORD])
        res = toy(old, grid.contexts[node])
        assert res.has_error() and "refused" in res.error.reason
        assert dict(grid.contexts[node].state.config_records[wire.STATE_RECORD]) == before

    def capture_and_replay(node: int, msg: Message, reply: Message | None) -> Message | None:
        st = stage(msg)
        if node == 301 and st in {("share", 1), ("unmask", 1)}:
            captured[st[0]] = copy.deepcopy(msg)
        if node == 301 and st == ("mask", 1) and reply is not None:
            captured["mask-reply"] = reply
        if node == 301 and st == ("mask", 2):
            replay(node, captured["share"])
        if node == 301 and st == ("unmask", 2):
            replay(node, captured["unmask"])
        if node == 312 and st == ("mask", 2):
            return captured["mask-reply"]  # node 301's round-1 reply, as 312's answer
        return None

    grid.hooks.append(capture_and_replay)
    strategy, inner = start(grid, rounds=3)
    assert next_stage(captured["unmask"]) == ("share", 2)
    assert replayed == ["('share', 1)", "('unmask', 1)"]
    for rnd in (1, 2, 3):
        assert_exact(strategy, inner, rnd)
    assert 312 in strategy.outcomes[2].dropped and 301 not in strategy.outcomes[2].dropped
    assert set(strategy.outcomes[3].survivors) == set(grid.ids)  # 312 re-keyed in round 3


def test_the_mod_refuses_an_unmasked_train_message_and_a_both_shares_request() -> None:
    grid = Grid1(4)
    node = grid.ids[0]
    plain_msg = Message(
        RecordDict({"config": ConfigRecord({"server-round": 1})}),
        dst_node_id=node,
        message_type="train",
    )
    reply = toy(plain_msg, grid.contexts[node])
    assert reply.has_error() and "unmasked" in reply.error.reason

    def evil(n: int, msg: Message) -> None:
        if n == node and stage(msg) == ("unmask", 1):
            content = copy.deepcopy(msg.content)
            rec = content[wire.RECORD]
            both = list(rec["survivors"])[:1]
            rec["dropped"] = [*rec["dropped"], *both]
            forged = Message(content, dst_node_id=n, message_type="train", group_id="1")
            forged.metadata.__dict__["_message_id"] = msg.metadata.message_id
            before = dict(grid.contexts[n].state.config_records[wire.STATE_RECORD])
            res = toy(forged, grid.contexts[n])
            assert res.has_error() and "both survivor and dropped" in res.error.reason
            assert dict(grid.contexts[n].state.config_records[wire.STATE_RECORD]) == before

    grid.before.append(evil)
    strategy, inner = start(grid, rounds=1)
    assert_exact(strategy, inner, 1)  # the honest request afterwards still works


def test_float_updates_are_refused_by_the_mod_and_drop_that_node() -> None:
    grid = Grid1(5, node_config={312: {"float-updates": True}})
    strategy, inner = start(grid, rounds=1)
    out = strategy.outcomes[1]
    assert set(out.dropped) == {312} and "integer" in out.dropped[312]
    assert_exact(strategy, inner, 1)


def test_secagg_round_alone_with_a_sparse_graph() -> None:
    grid = Grid1(20)
    msgs = SumStrategy().configure_train(1, ArrayRecord(), ConfigRecord({}), grid)
    grid.hooks.append(drop_at("mask", {301, 400}))
    rnd = SecAggRound(grid, 1, msgs, levels=LEVELS, num_neighbours=8)
    out = rnd.run()
    assert out.abandoned is None and rnd.round_trips == 4
    arrays = rnd.aggregate_arrays(out)
    expected = plain(out.survivors, 1)
    assert all(np.array_equal(arrays[k].numpy(), expected[k]) for k in SHAPES)
    assert set(out.dropped) == {301, 400}


# ---------------------------------------------------------------------- pipelining


def test_steady_rounds_take_two_round_trips_with_exact_sums() -> None:
    """Round t's mask instruction asks for round t+1's keys, its unmask instruction carries
    round t+1's share request; the last round asks for nothing ahead."""
    grid = Grid1(6)
    strategy, inner = start(grid, rounds=5)
    for rnd in range(1, 6):
        assert_exact(strategy, inner, rnd)
        assert strategy.outcomes[rnd].survivors == tuple(grid.ids)
    assert strategy.round_trips == {1: 4, 2: 2, 3: 2, 4: 2, 5: 2}
    assert grid.calls == 4 + 4 * 2 + 5
    by_stage: dict[tuple[str, int], set[tuple[str, int] | None]] = {}
    for msg in grid.sent:
        st = stage(msg)
        if st is not None:
            by_stage.setdefault(st, set()).add(next_stage(msg))
    for rnd in range(1, 5):
        assert by_stage[("mask", rnd)] == {("advertise", rnd + 1)}
        assert by_stage[("unmask", rnd)] == {("share", rnd + 1)}
    assert by_stage[("mask", 5)] == {None} and by_stage[("unmask", 5)] == {None}
    assert not any(st[0] in ("advertise", "share") and st[1] > 1 for st in by_stage)


def test_a_sample_that_is_a_strict_subset_of_the_pipelined_set_stays_pipelined() -> None:
    """Round 2 samples 5 of the 6 nodes that shared ahead: the sixth is dropped before masking
    (its mask key is recovered; it masked nothing) and the sum is the 5's. Round 3 samples all
    six again: not a subset of round 2's survivors, so every node re-keys."""
    grid = Grid1(6)
    left_out = grid.ids[-1]

    def sample(rnd: int, ids: list[int]) -> list[int]:
        return [n for n in ids if n != left_out] if rnd == 2 else ids

    strategy, inner = start(grid, rounds=4, sample=sample)
    for rnd in (1, 2, 3, 4):
        assert_exact(strategy, inner, rnd)
    out = strategy.outcomes[2]
    assert out.survivors == tuple(grid.ids[:-1])
    assert out.dropped == {left_out: "mask: not sampled in this round"}
    assert not any(
        m.metadata.dst_node_id == left_out and stage(m) == ("mask", 2) for m in grid.sent
    )
    assert strategy.outcomes[3].survivors == tuple(grid.ids)
    assert strategy.round_trips == {1: 4, 2: 2, 3: 4, 4: 2}
    assert strategy.pipelined == {1: False, 2: True, 3: False, 4: True}


def test_a_subset_too_small_for_the_pipelined_graph_re_keys() -> None:
    """3 of 6 sampled (k = 5, t = 3 drawn over 6): each has 2 sampled neighbours, fewer than
    t, so the pipelined shares would abandon the round; it re-keys the 3 instead."""
    grid = Grid1(6)

    def sample(rnd: int, ids: list[int]) -> list[int]:
        return ids[:3] if rnd == 2 else ids

    strategy, inner = start(grid, rounds=3, sample=sample)
    for rnd in (1, 2, 3):
        assert_exact(strategy, inner, rnd)
    assert strategy.outcomes[2].survivors == tuple(grid.ids[:3])
    assert strategy.round_trips == {1: 4, 2: 4, 3: 4}


def test_a_sample_with_a_new_node_re_keys_every_node() -> None:
    grid = Grid1(7)
    newcomer = grid.ids[-1]

    def sample(rnd: int, ids: list[int]) -> list[int]:
        return [n for n in ids if n != newcomer] if rnd == 1 else ids

    strategy, inner = start(grid, rounds=3, sample=sample)
    for rnd in (1, 2, 3):
        assert_exact(strategy, inner, rnd)
    assert strategy.outcomes[1].survivors == tuple(grid.ids[:-1])
    assert strategy.outcomes[2].survivors == strategy.outcomes[3].survivors == tuple(grid.ids)
    assert strategy.round_trips == {1: 4, 2: 4, 3: 2}
    advertised = {m.metadata.dst_node_id for m in grid.sent if stage(m) == ("advertise", 2)}
    assert advertised == set(grid.ids)


def test_a_node_silent_at_the_pipelined_unmask_and_share_rejoins_the_round_after() -> None:
    """Node 334 masks round 2 (and sends its keys for round 3), then answers neither its unmask
    nor round 3's share: it is in round 2's sum, dropped at round 3's share (round 3 stays
    pipelined) and back in round 4, which re-keys."""
    grid = Grid1(6)
    grid.hooks.append(drop_at("unmask", {334}, rnd=2))
    strategy, inner = start(grid, rounds=5)
    for rnd in range(1, 6):
        assert_exact(strategy, inner, rnd)
    assert strategy.outcomes[2].survivors == tuple(grid.ids)
    assert set(strategy.outcomes[2].faulty) == {334}
    out3 = strategy.outcomes[3]
    assert 334 not in out3.survivors and out3.dropped[334] == "share: no reply"
    assert strategy.outcomes[4].survivors == strategy.outcomes[5].survivors == tuple(grid.ids)
    assert strategy.round_trips == {1: 4, 2: 2, 3: 2, 4: 4, 5: 2}
    assert strategy.pipelined == {1: False, 2: True, 3: True, 4: False, 5: True}


def test_a_refused_pipelined_share_refuses_the_unmask_too_and_keeps_the_state() -> None:
    """An unmask instruction whose riding share request names another round, or that also asks
    for the next round's keys, is refused whole (state unchanged); the honest one then works.
    A next-round record on a share instruction is refused too."""
    grid = Grid1(5)
    node = grid.ids[0]
    seen: list[str] = []

    def forge(msg: Message, edit: Callable[[RecordDict], None]) -> str:
        content = copy.deepcopy(msg.content)
        edit(content)
        st = stage(msg)
        assert st is not None
        forged = Message(content, dst_node_id=node, message_type="train", group_id=str(st[1]))
        forged.metadata.__dict__["_message_id"] = msg.metadata.message_id
        before = dict(grid.contexts[node].state.config_records[wire.STATE_RECORD])
        res = toy(forged, grid.contexts[node])
        assert res.has_error()
        assert dict(grid.contexts[node].state.config_records[wire.STATE_RECORD]) == before
        return res.error.reason

    def evil(n: int, msg: Message) -> None:
        if n != node:
            return
        if stage(msg) == ("unmask", 1):
            seen.append(forge(msg, lambda c: c[wire.NEXT_RECORD].__setitem__("round", 3)))
            seen.append(forge(msg, lambda c: c[wire.RECORD].__setitem__("advertise-next", True)))
        if stage(msg) == ("share", 1):
            nxt = wire.advertise_request(2)[wire.RECORD]
            seen.append(forge(msg, lambda c: c.__setitem__(wire.NEXT_RECORD, nxt)))
        if stage(msg) == ("mask", 1):
            nxt = wire.advertise_request(3)[wire.RECORD]
            seen.append(forge(msg, lambda c: c.__setitem__(wire.NEXT_RECORD, nxt)))

    grid.before.append(evil)
    strategy, inner = start(grid, rounds=2)
    assert len(seen) == 4 and all("MalformedMessageError" in r for r in seen), seen
    for rnd in (1, 2):
        assert_exact(strategy, inner, rnd)
    assert strategy.outcomes[2].survivors == tuple(grid.ids)
    assert strategy.round_trips == {1: 4, 2: 2}

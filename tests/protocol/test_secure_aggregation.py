"""Secure aggregation composed with CorBin-FL (``secure-aggregation = true``; issue 29 item 1).

On the in-process grid (the real ServerApp and ClientApp): the server learns only the exact sum
of the surviving clients' symbols, and its estimate equals the plain path's bit for bit given
the same bits; dropouts before masking, after masking and during unmasking either keep the sum
exact over the survivors or abandon the round with its reason (nothing applied); mechanisms
without an estimate affine in the symbol sum are refused before anything starts; a node that
requires secure aggregation refuses a run without it; replayed instructions are refused.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Error, Message
from flwr.serverapp.strategy import FedAvg
from harness import InProcessGrid, capture_metrics, make_cfg, run
from scipy.stats import binom
from wire_helpers import message_stage

from corbin_fl import secure, wire
from corbin_fl.app import client_app
from corbin_fl.app.config import AppConfig
from corbin_fl.client import encode as client_encode
from corbin_fl.client import secure_update
from corbin_fl.client.policy import Policy, PolicyError
from corbin_fl.config import ConfigError
from corbin_fl.server import round as server_round
from corbin_fl.server.strategy import CorBin

SECURE = {"secure-aggregation": True}


class Recorder:
    """Every aggregator of the run (with its inputs and estimate) and every client's plain
    encoded update before masking, by (round, node)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.aggregators: list[dict[str, Any]] = []
        self.plain: dict[tuple[int, int], tuple[str, np.ndarray]] = {}
        make = server_round.make_aggregator

        def make_aggregator(cfg: Any, w: Any, c: Any, r: Any, layout: Any, cohort: Any) -> Any:
            agg = make(cfg, w, c, r, layout, cohort)
            entry: dict[str, Any] = {
                "args": (cfg, w.clone(), c.clone(), r.clone(), layout, cohort),
                "agg": agg,
                "estimate": None,
            }
            estimate = agg.estimate

            def wrapped() -> Any:
                counter = getattr(agg, "counter", None)
                if counter is not None and agg.n:
                    entry["sum"] = np.asarray(counter.counts(), dtype=np.int64)
                out = estimate()
                entry["estimate"] = None if out is None else out.clone()
                return out

            agg.estimate = wrapped
            self.aggregators.append(entry)
            return agg

        monkeypatch.setattr(server_round, "make_aggregator", make_aggregator)
        masked_reply = secure_update.masked_reply

        def record(reply: Any, req: Any, context: Any, cfg: Any, m: int, *more: Any) -> Any:
            (key, arr), *_ = list(reply.array_records[wire.UPDATE_REC].items())
            self.plain[(req.server_round, context.node_id)] = (key, arr.numpy().copy())
            return masked_reply(reply, req, context, cfg, m, *more)

        monkeypatch.setattr(secure_update, "masked_reply", record)

    def replay_plain(self, rnd: int, nodes: list[int]) -> Any:
        """The plain path's estimate of round ``rnd`` from these nodes' recorded updates."""
        from flwr.app import ArrayRecord

        from corbin_fl.server.aggregation import make_aggregator

        agg = make_aggregator(*self.aggregators[rnd - 1]["args"])
        for nid in nodes:
            key, arr = self.plain[(rnd, nid)]
            agg.add(ArrayRecord({key: wire.to_array(arr)}))
        return agg.estimate()

    def symbol_sum(self, rnd: int, nodes: list[int], cfg: AppConfig, m: int) -> np.ndarray:
        total = np.zeros(m, dtype=np.int64)
        for nid in nodes:
            key, arr = self.plain[(rnd, nid)]
            total += secure.symbols(cfg, key, arr, m).astype(np.int64)
        return total


def _sum_of(entry: dict[str, Any]) -> np.ndarray:
    return entry["sum"]


def _drop(stage: str, nodes: set[int], rounds: set[int] | None = None) -> Any:
    """A hook: ``nodes`` send no reply at ``stage`` (of ``rounds``); they time out."""

    def hook(nid: int, instruction: Message, reply: Message | None) -> list[Message] | None:
        rnd = int(instruction.metadata.group_id)
        hit = nid in nodes and message_stage(instruction) == stage
        return [] if hit and (rounds is None or rnd in rounds) else None

    return hook


# ============================================================================ exact sums
@pytest.mark.parametrize("mechanism", ["ldpfl", "corbin"])
def test_secure_estimate_equals_plain_bit_for_bit(
    mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same client bits -> the same estimate, bit for bit; every round's sum is exact."""
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism=mechanism, num_rounds=3, **SECURE), 5)
    rows = capture_metrics(grid)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    assert [r["participants"] for r in rows] == [5, 5, 5]
    for rnd, row in enumerate(rows, start=1):
        sa = row["secure_aggregation"]
        assert sa["on"] and sa["abandoned"] is None and sa["survivors"] == 5
        assert (sa["b"], sa["k"], sa["t"], sa["levels"]) == (3, 4, 3, 1)  # ceil(log2(5 + 1))
        # k, t's bounds at the stated sizing (complete graph: P[Bin(5, 0.92^3) <= 3], c = 1 < t)
        assert (sa["dropout"], sa["collusion"], sa["p_security"]) == (0.08, 1 / 3, 0.0)
        assert sa["p_abandon"] == pytest.approx(binom.cdf(3, 5, 0.92**3), rel=1e-12)
        assert row["dropped"] == {}
        entry = rec.aggregators[rnd - 1]
        m = entry["agg"].m
        assert np.array_equal(_sum_of(entry), rec.symbol_sum(rnd, grid.node_ids, cfg, m))
        plain = rec.replay_plain(rnd, grid.node_ids)
        assert torch.equal(plain, entry["estimate"])
    # round trips: round 1 is advertise -> share -> update -> unmask (plus keygen/pair for
    # corbin); a steady round is update -> unmask, its share stage done with the last unmask
    assert [r["secure_aggregation"]["round_trips"] for r in rows] == [4, 2, 2]
    assert [r["secure_aggregation"]["pipelined"] for r in rows] == [False, True, True]
    assert rows[1]["round_trips"] == 2
    if mechanism == "corbin":
        assert rows[1]["carried_pairs"] == 2 and rows[1]["paired_updates"] == 4


def test_secure_run_equals_plain_run_with_the_same_coins(monkeypatch: pytest.MonkeyPatch) -> None:
    """ldpfl with deterministic coins: the whole run's models agree bit for bit."""
    models: dict[bool, list[torch.Tensor]] = {}
    apply = server_round.apply_global_lr
    for on in (False, True):
        counter = itertools.count()
        monkeypatch.setattr(
            client_encode,
            "quantization_generator",
            lambda device, c=counter: torch.Generator(device=device).manual_seed(next(c)),
        )
        estimates: list[torch.Tensor] = []

        def spy(w: Any, est: Any, lam: float, inplace: bool = False, out: Any = estimates) -> Any:
            res = apply(w, est, lam, inplace=inplace)
            out.append(res.clone())
            return res

        monkeypatch.setattr(server_round, "apply_global_lr", spy)
        extra = SECURE if on else {}
        grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=2, **extra), 4)
        capture_metrics(grid)
        models[on] = estimates
    assert len(models[True]) == 2
    for a, b in zip(models[False], models[True], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("mechanism", "extra", "levels"),
    [
        ("augcorbin", {"gamma": 0.5}, 1),
        ("signsgd", {}, 1),
        ("pbm", {"pbm-trials": 2}, 2),
        ("rqm", {"rqm-levels": 3}, 2),
        ("ternary", {}, 2),
        ("ternary", {"ternary-encoding": "int8"}, 2),
    ],
)
def test_every_affine_mechanism_sums_exactly(
    mechanism: str, extra: dict[str, Any], levels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism=mechanism, num_rounds=1, **extra, **SECURE), 4)
    rows = capture_metrics(grid)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    sa = rows[0]["secure_aggregation"]
    assert sa["levels"] == levels == secure.levels_of(cfg)
    assert sa["b"] == secure.bit_width(4, levels) and sa["survivors"] == 4
    plain = rec.replay_plain(1, grid.node_ids)
    got = rec.aggregators[0]["estimate"]
    if mechanism in ("pbm", "rqm"):  # float64 sum of levels: n v_0 + S step vs sum of v_k
        assert torch.allclose(plain, got, rtol=0, atol=1e-6)
    else:
        assert torch.equal(plain, got)


# ============================================================================ dropouts
def test_dropout_before_masking_sums_the_survivors(monkeypatch: pytest.MonkeyPatch) -> None:
    """One node silent at share, one at the update (mask) stage: the sum is over the other 3."""
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=1, **SECURE), 6)
    a, b = grid.node_ids[0], grid.node_ids[1]
    grid.hooks += [_drop(secure.SHARE, {a}), _drop(wire.UPDATE, {b})]
    rows = capture_metrics(grid)
    cfg = AppConfig.from_flower(grid.contexts[a].run_config)
    survivors = grid.node_ids[2:]
    row, sa = rows[0], rows[0]["secure_aggregation"]
    assert row["participants"] == 4 and sa["survivors"] == 4 and sa["abandoned"] is None
    assert row["dropped"][str(a)].startswith(secure.SHARE)
    assert row["dropped"][str(b)].startswith(wire.UPDATE)
    entry = rec.aggregators[0]
    assert np.array_equal(_sum_of(entry), rec.symbol_sum(1, survivors, cfg, entry["agg"].m))
    assert torch.equal(rec.replay_plain(1, survivors), entry["estimate"])


def test_dropout_during_unmask_keeps_the_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that masked but is silent at unmask: its input is in the sum (other holders)."""
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism="corbin", num_rounds=1, **SECURE), 5)
    gone = grid.node_ids[3]
    grid.hooks.append(_drop(secure.UNMASK, {gone}))
    rows = capture_metrics(grid)
    cfg = AppConfig.from_flower(grid.contexts[gone].run_config)
    sa = rows[0]["secure_aggregation"]
    assert sa["survivors"] == 5 and sa["abandoned"] is None
    assert str(gone) in sa["faulty"] and rows[0]["dropped"] == {}
    entry = rec.aggregators[0]
    assert np.array_equal(_sum_of(entry), rec.symbol_sum(1, grid.node_ids, cfg, entry["agg"].m))
    assert torch.equal(rec.replay_plain(1, grid.node_ids), entry["estimate"])


def test_too_many_dropouts_abandon_the_round_and_keep_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Round 2: 3 of 5 silent after sharing (t = 3): nobody can unmask; nothing is applied."""
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=2, **SECURE), 5)
    grid.hooks.append(_drop(wire.UPDATE, set(grid.node_ids[:3]), {2}))
    rows = capture_metrics(grid)
    sa = rows[1]["secure_aggregation"]
    assert sa["abandoned"] and "fewer than t = 3" in sa["abandoned"]
    assert rows[1]["participants"] == 0 and sa["survivors"] == 0
    assert rec.aggregators[1]["agg"].n == 0 and rec.aggregators[1]["estimate"] is None
    assert secure.UNMASK not in sa["bytes_up"]  # no share was ever asked for


def test_unmask_dropouts_below_t_abandon(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 of 5 silent at unmask (t = 3): the self masks cannot be removed; abandoned."""
    rec = Recorder(monkeypatch)
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=2, **SECURE), 5)
    grid.hooks.append(_drop(secure.UNMASK, set(grid.node_ids[:3]), {2}))
    rows = capture_metrics(grid)
    sa = rows[1]["secure_aggregation"]
    assert sa["abandoned"] and "could not be recovered" in sa["abandoned"]
    assert rows[1]["participants"] == 0 and rec.aggregators[1]["estimate"] is None
    assert rows[0]["participants"] == 5


# ============================================================================ refusals
@pytest.mark.parametrize("mechanism", ["gaussian", "fedavg", "cq", "laplace", "imvu", "fedcad"])
def test_mechanisms_without_an_affine_estimate_are_refused(mechanism: str) -> None:
    with pytest.raises(ConfigError, match=r"secure-aggregation: .*affine in that sum"):
        CorBin(FedAvg(), mechanism=mechanism, secure_aggregation=True, update_radius=0.01)
    with pytest.raises(ConfigError, match="secure-aggregation"):
        AppConfig.from_flower({"mechanism": mechanism, "secure-aggregation": True})


def test_corbin_accepts_secure_aggregation() -> None:
    strategy = CorBin(FedAvg(), mechanism="corbin", secure_aggregation=True, update_radius=0.01)
    assert strategy.cfg.secure_aggregation


def test_node_requiring_secure_aggregation_refuses_a_run_without_it() -> None:
    cfg = AppConfig.from_flower(make_cfg(mechanism="ldpfl"))
    strict = Policy.from_node({"corbin-require-secure-aggregation": True})
    with pytest.raises(PolicyError, match="corbin-require-secure-aggregation"):
        strict.check(cfg)
    strict.check(cfg.replace(secure_aggregation=True))
    env = Policy.from_node({}, {"CORBIN_REQUIRE_SECURE_AGGREGATION": "true"})
    assert env.require_secure_aggregation
    with pytest.raises(ValueError, match="true or false"):
        Policy.from_node({"corbin-require-secure-aggregation": "maybe"})

    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=1), 3)
    for ctx in grid.contexts.values():
        ctx.node_config["corbin-require-secure-aggregation"] = True
    with pytest.raises(Exception, match="corbin-require-secure-aggregation"):
        capture_metrics(grid)
    refusals = [m for m in grid.received if m.has_error()]
    assert refusals and all(m.error.code == wire.ERROR_CODE_POLICY for m in refusals)


def test_node_requiring_secure_aggregation_runs_with_it() -> None:
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=1, **SECURE), 3)
    for ctx in grid.contexts.values():
        ctx.node_config["corbin-require-secure-aggregation"] = True
    rows = capture_metrics(grid)
    assert rows[0]["participants"] == 3


def test_update_replies_carry_only_the_masked_vector() -> None:
    """No per-client metric or app record: corbin.reply (round, next key), the mask reply and,
    below the last round, the node's SecAgg+ keys of the next round (two public keys)."""
    grid = InProcessGrid(make_cfg(mechanism="corbin", num_rounds=2, **SECURE), 4)
    capture_metrics(grid)
    updates = [m for m in grid.received if m.has_content() and wire.REPLY in m.content]
    assert len(updates) == 8
    for reply in updates:
        nxt = {secure.NEXT_REC} if reply.metadata.group_id == "1" else set()
        assert set(reply.content) == {wire.REPLY, secure.SECAGG_REC, secure.MASKED_REC, *nxt}
        if nxt:
            keys = reply.content.config_records[secure.NEXT_REC]
            assert set(keys) == {"stage", "round", "version", "c-pk", "s-pk"} and keys["round"] == 2
        assert set(reply.content.config_records[wire.REPLY]) <= {
            wire.ROUND,
            wire.NEXT_PUBKEY,
            wire.NEXT_BLOB,
        }


def test_client_refuses_plain_update_in_a_secure_run() -> None:
    """A server that drops the mask request to get the plain update is refused."""
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=1, **SECURE), 3)

    def strip(nid: int, msg: Message) -> Message | None:
        if message_stage(msg) == wire.UPDATE and secure.SECAGG_REC in msg.content:
            del msg.content[secure.SECAGG_REC]
        return None

    grid.instruction_hooks.append(strip)
    with pytest.raises(Exception):  # noqa: B017 - every node refuses: the run learns nothing
        capture_metrics(grid)
    errors = [m.error.reason for m in grid.received if m.has_error()]
    assert errors and all("without a mask request" in e for e in errors)


def test_replayed_instructions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share, update (mask) or unmask instruction of round 1 replayed to its node in round 2
    (after its own answer) is refused; the building block's checks hold end to end."""
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=2, **SECURE), 4)
    capture_metrics(grid)
    node = grid.node_ids[0]
    for stage in (secure.SHARE, wire.UPDATE, secure.UNMASK, secure.ADVERTISE):
        old = next(
            m
            for m in grid.sent
            if m.metadata.dst_node_id == node
            and message_stage(m) == stage
            and m.metadata.group_id == "1"
        )
        reply = client_app.app(old, grid.contexts[node])
        assert reply.has_error(), stage
        assert "refused" in reply.error.reason or "already handled" in reply.error.reason


def test_unmask_asking_for_both_shares_is_refused_and_outvoted() -> None:
    """The server names a survivor as dropped to one holder too: that holder refuses (it would
    reveal both shares); the other holders unmask and the sum stays exact."""
    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=1, **SECURE), 5)
    liar_target, victim = grid.node_ids[0], grid.node_ids[1]

    def both(nid: int, msg: Message) -> Message | None:
        if nid == liar_target and message_stage(msg) == secure.UNMASK:
            rec = msg.content.config_records[secure.SECAGG_REC]
            rec["dropped"] = [*rec["dropped"], victim]
        return None

    grid.instruction_hooks.append(both)
    rows = capture_metrics(grid)
    sa = rows[0]["secure_aggregation"]
    assert sa["abandoned"] is None and sa["survivors"] == 5
    assert "both survivor and dropped" in sa["faulty"][str(liar_target)]
    refused = [m for m in grid.received if m.has_error() and m.metadata.src_node_id == liar_target]
    assert refused and isinstance(refused[0].error, Error)


# ============================================================================ the privacy report
def test_summary_reports_the_guarantee_against_the_sum_of_the_fewest_survivors() -> None:
    """summary.json's privacy (issue 29 item 3): n is the fewest survivors of an unmasked round
    (round 2 lost one node at the mask stage), ldpfl's (B) is dp with secure_sum's figures; the
    records count who was in each sum by assignment."""
    from corbin_fl.mechanisms import secure_sum
    from corbin_fl.server.metrics import RunFiles

    grid = InProcessGrid(make_cfg(mechanism="ldpfl", num_rounds=2, **SECURE), 5)
    grid.hooks.append(_drop(wire.UPDATE, {grid.node_ids[0]}, {2}))
    rows: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunFiles, "metrics", lambda self, rec: rows.append(rec))
        summary = run(grid)
    assert [r["secure_aggregation"]["survivors"] for r in rows] == [5, 4]
    assert [r["secure_aggregation"]["assignments"] for r in rows] == [{"solo": 5}, {"solo": 4}]
    priv = summary["privacy"]
    view = priv["secure_aggregation"]
    assert (view["n"], view["rounds"], view["source"], view["trials"]) == (4, 2, "rounds", 1)
    b = priv["threat_models"]["B"]
    g = secure_sum.one_bit_guarantee(priv["eps_p"], 4, priv["m"], priv["rounds"], priv["delta"])
    assert b["dp"] is True and b["all_rounds"]["eps"] == g["all_rounds"]["eps"]
    assert "at least n = 4 clients" in b["guarantee"]

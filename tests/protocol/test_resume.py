"""Server crash and resume (``pytest -m resume``): the checkpoint, its atomic files, and real runs.

Three layers:

* unit tests of :mod:`server.checkpoint`: atomic writes survive a failed rename, a save/load
  round trip restores everything, a missing / corrupt / differently-configured checkpoint is
  refused with a clear message, the release journal of an aborted round is folded in once;
* in-process runs (the real ``server.round`` and ``client`` code over the ``InProcessGrid`` of
  ``tests/protocol/harness.py``): a run that crashes in the middle of round 2 and resumes ends
  with exactly one ``metrics.jsonl`` row per round, a ledger that counts every released update
  exactly once (including the releases of the aborted attempt), the same public random choices
  (sampling, pairing) as an uninterrupted run, and a checkpoint that holds no key, seed or blob;
* one end-to-end run on real Flower processes (marked ``e2e``): SuperLink + 3 SuperNodes +
  ``flwr run``; after round 1 is checkpointed the whole server side (SuperLink, SuperExec,
  ServerApp process) is SIGKILLed, a new SuperLink is started on the same port, the SuperNodes
  are restarted, and ``flwr run`` with ``resume = true`` finishes the run. Flower 1.41
  SuperNodes retry while no SuperLink answers and then EXIT on the new SuperLink's ``401
  Unauthorized`` (in-memory state: it does not know them), so they must be restarted (with new
  node ids); with a SuperLink ``--database`` file (the Docker layout) they reconnect by
  themselves and keep their node ids (checked by hand, not in this test).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

# The in-process harness (a Flower Grid whose nodes are the real ClientApp handlers) and its
# fixtures: Flower's task identity, and stubbed data/model/training for fast protocol runs.
from harness import InProcessGrid, make_cfg
from wire_helpers import is_stage

from corbin_fl import wire
from corbin_fl.app import server_app
from corbin_fl.app.config import AppConfig
from corbin_fl.arrays import flatten_arrays, layout_of_arrays
from corbin_fl.client import handlers
from corbin_fl.config import ConfigError
from corbin_fl.mechanisms.accounting import PrivacyLedger
from corbin_fl.server import round as server_round
from corbin_fl.server.checkpoint import (
    CHECKPOINT_DIR,
    JOURNAL_FILE,
    MAY_DIFFER_ON_RESUME,
    STATE_FILE,
    Checkpointer,
    CheckpointError,
    TrainingState,
    atomic_write_bytes,
    config_mismatches,
    release_event,
)
from corbin_fl.server.metrics import RunFiles

pytestmark = [pytest.mark.resume]


class Crash(BaseException):
    """Stands for a SIGKILL of the ServerApp: not an ``Exception``, so nothing catches it."""


# ============================================================================ atomic writes
def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    with pytest.raises(TypeError, match="bytes"):
        atomic_write_bytes(target, "text")  # type: ignore[arg-type]


def test_atomic_write_failing_rename_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # temp file removed


# ============================================================================ checkpoint unit
M = 10


def _cfg(**changes: Any) -> AppConfig:
    return AppConfig.from_flower(
        {"num-rounds": 5, **{k.replace("_", "-"): v for k, v in changes.items()}}
    )


def _state(rnd: int, cfg: AppConfig, *, seed: int = 0) -> TrainingState:
    gen = torch.Generator().manual_seed(seed)
    ledger = PrivacyLedger()
    history = []
    for t in range(1, rnd + 1):
        history.append({"round": t, "test_accuracy": 0.1 * t, "participants": 2})
        for node in (11, 12):
            ledger.add(release_event(cfg, t, node, M, paired=True))
    return TrainingState(
        round=rnd,
        weights=torch.randn(M, generator=gen),
        best={"round": 1, "val_accuracy": 0.5, "val_loss": 1.0, "test_accuracy": 0.4},
        best_weights=torch.randn(M, generator=gen),
        since_best=rnd - 1,
        history=history,
        ledger=ledger,
        run_ids=[7],
    )


def test_save_load_round_trip_and_old_model_files_removed(tmp_path: Path) -> None:
    cfg = _cfg(out_dir=str(tmp_path))
    ck = Checkpointer(tmp_path, cfg, M)
    assert not ck.exists()
    ck.save(_state(1, cfg, seed=1))
    state = _state(2, cfg, seed=2)
    ck.save(state)
    files = sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir())
    assert files == sorted(["best-000001.npy", JOURNAL_FILE, "model-000002.npy", STATE_FILE])
    back = Checkpointer(tmp_path, cfg.replace(resume=True, stage_timeout=5.0, num_rounds=9), M)
    loaded = back.load()
    assert loaded.round == 2 and loaded.since_best == 1 and loaded.run_ids == [7]
    assert torch.equal(loaded.weights, state.weights.to(torch.float32))
    assert torch.equal(loaded.best_weights, state.best_weights)
    assert loaded.best == state.best
    assert loaded.history == state.history
    assert loaded.ledger.to_json() == state.ledger.to_json()
    assert loaded.aborted_releases == []


def test_load_refuses_missing_corrupt_and_foreign_checkpoints(tmp_path: Path) -> None:
    cfg = _cfg(out_dir=str(tmp_path))
    ck = Checkpointer(tmp_path, cfg, M)
    with pytest.raises(CheckpointError, match="does not exist"):
        ck.load()
    ck.save(_state(2, cfg))
    with pytest.raises(CheckpointError, match=r"(?s)2 key\(s\) differ.*mechanism.*seed"):
        Checkpointer(tmp_path, cfg.replace(mechanism="ldpfl", seed=3), M).load()
    with pytest.raises(CheckpointError, match="parameters"):
        Checkpointer(tmp_path, cfg, M + 1).load()
    with pytest.raises(CheckpointError, match="after num-rounds"):
        Checkpointer(tmp_path, cfg.replace(num_rounds=1), M).load()
    model = tmp_path / CHECKPOINT_DIR / "model-000002.npy"
    raw = bytearray(model.read_bytes())
    raw[-1] ^= 0x01
    model.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="SHA-256"):
        ck.load()
    (tmp_path / CHECKPOINT_DIR / STATE_FILE).write_text('{"version": 99}')
    with pytest.raises(CheckpointError, match="version-1"):
        ck.load()


def test_config_keys_that_may_and_may_not_differ() -> None:
    base = _cfg().to_flower()
    assert config_mismatches(base, dict(base)) == {}
    relaxed = {**base, **{k: base[k] for k in MAY_DIFFER_ON_RESUME}}
    relaxed.update({"num-rounds": 50, "stage-timeout": 9.0, "device": "cpu", "resume": True})
    assert config_mismatches(base, relaxed) == {}
    for key, value in [
        ("epsilon", 2.0),
        ("model", "resnet18"),
        ("dataset", "cifar10"),
        ("data-seed", 4),
        ("cr-mode", "derived"),
        ("d", 3),
        ("global-lr", 0.5),
    ]:
        diff = config_mismatches(base, {**base, key: value})
        assert list(diff) == [key], (key, diff)
    assert "absent" in config_mismatches(base, {k: v for k, v in base.items() if k != "d"})["d"]
    with pytest.raises(ConfigError, match="resume: needs out-dir"):
        AppConfig.from_flower({"resume": True})


def test_journal_of_an_aborted_round_is_folded_in_once(tmp_path: Path) -> None:
    cfg = _cfg(out_dir=str(tmp_path))
    ck = Checkpointer(tmp_path, cfg, M)
    ck.save(_state(2, cfg))
    # a stale entry of a committed round (crash between commit and truncation) is ignored;
    # two releases of round 3 (aborted) count; a torn last line (no newline) is ignored
    ck.journal_release(7, release_event(cfg, 2, 11, M, paired=True))
    ck.journal_release(7, release_event(cfg, 3, 11, M, paired=True))
    ck.journal_release(7, release_event(cfg, 3, 12, M, paired=False))
    with open(ck.journal_path, "a", encoding="utf-8") as fh:
        fh.write('{"run_id": 7, "event": {"round": 3, "no')
    loaded = ck.load()
    assert len(loaded.ledger) == 4 + 2
    assert [(e.round, e.node, e.paired) for e in loaded.ledger][-2:] == [
        (3, "11", True),
        (3, "12", False),
    ]
    assert loaded.aborted_releases == [
        {"run_id": 7, "round": 3, "node": "11"},
        {"run_id": 7, "round": 3, "node": "12"},
    ]
    # committing the next round empties the journal: nothing is counted twice afterwards
    loaded.round = 3
    loaded.history.append({"round": 3})
    ck.save(loaded)
    assert ck.journal_path.read_bytes() == b""
    again = ck.load()
    assert len(again.ledger) == 6 and len(again.aborted_releases) == 2


def test_bad_journal_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    cfg = _cfg(out_dir=str(tmp_path))
    ck = Checkpointer(tmp_path, cfg, M)
    ck.save(_state(1, cfg))
    ck.journal_path.write_text("garbage\n" + json.dumps({"run_id": 1, "event": {}}) + "\n")
    with pytest.raises(CheckpointError, match="bad line 1"):
        ck.load()


def test_release_events_per_mechanism() -> None:
    ev = release_event(_cfg(mechanism="corbin", d=4), 3, 99, M, paired=True)
    assert (ev.round, ev.node, ev.eps_p, ev.paired, ev.d, ev.delta) == (3, "99", 1.0, True, 4, None)
    assert release_event(_cfg(mechanism="ldpfl"), 1, 5, M, paired=True).paired is False
    assert release_event(_cfg(mechanism="cq"), 1, 5, M, paired=False).eps_p is None
    assert release_event(_cfg(mechanism="gaussian"), 1, 5, M, paired=False).delta == 1e-5
    with pytest.raises(ValueError, match="round"):
        release_event(_cfg(), 0, 5, M, paired=False)
    with pytest.raises(TypeError, match="node"):
        release_event(_cfg(), 1, "5", M, paired=False)  # type: ignore[arg-type]


def test_rewrite_metrics_keeps_appending(tmp_path: Path) -> None:
    files = RunFiles(str(tmp_path))
    for t in (1, 2, 3):
        files.metrics({"round": t})
    files.rewrite_metrics([{"round": 1}, {"round": 2}])
    files.metrics({"round": 3, "again": True})
    files.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"round": 1}, {"round": 2}, {"round": 3, "again": True}]


# ============================================================================ in-process runs
def _run(grid: InProcessGrid, **overrides: Any) -> dict[str, Any]:
    ctx = grid.contexts[grid.node_ids[0]]
    cfg = AppConfig.from_flower({**ctx.run_config, **overrides})
    return server_app.run_training(grid, cfg)


def _new_flower_run(grid: InProcessGrid) -> None:
    """``flwr run`` again: a new run, so every node starts with an empty ``Context.state``."""
    for ctx in grid.contexts.values():
        ctx.state = RecordDict()


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _state_doc(out: Path) -> dict[str, Any]:
    return json.loads((out / CHECKPOINT_DIR / STATE_FILE).read_text())


def test_crash_in_round_2_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash after 2 of 5 updates of round 2 were accepted; resume; check rows and ledger."""
    out = tmp_path / "out"
    grid = InProcessGrid(make_cfg(num_rounds=3, out_dir=str(out)), 5)
    real_accept = server_round.accept_update
    accepted_in_round_2: list[int] = []

    def crashing_accept(state: Any, nid: int, *args: Any) -> None:
        if state.round == 2 and len(accepted_in_round_2) == 2:
            raise Crash("ServerApp killed")
        real_accept(state, nid, *args)
        if state.round == 2:
            accepted_in_round_2.append(nid)

    with monkeypatch.context() as mp:
        mp.setattr(server_round, "accept_update", crashing_accept)
        with pytest.raises(Crash):
            _run(grid)
    assert _state_doc(out)["round"] == 1
    assert [r["round"] for r in _rows(out)] == [1]
    journal = (out / CHECKPOINT_DIR / JOURNAL_FILE).read_text().splitlines()
    assert len(journal) == 2  # the two releases of the aborted round 2
    # the crash also lost the round-1 row after the commit (the row is written after it)
    (out / "metrics.jsonl").write_text("")

    with pytest.raises(CheckpointError, match="resume = true"):
        _run(grid)  # a fresh run must not overwrite the checkpoint
    _new_flower_run(grid)
    summary = _run(grid, resume=True)

    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["participants"] == 5 for r in rows)
    doc = _state_doc(out)
    assert doc["round"] == 3
    ledger = PrivacyLedger.from_json(json.dumps(doc["ledger"]))
    per_round_node: dict[tuple[int, str], int] = {}
    for e in ledger:
        per_round_node[(e.round, e.node)] = per_round_node.get((e.round, e.node), 0) + 1
    nodes = [str(n) for n in grid.node_ids]
    twice = {str(n) for n in accepted_in_round_2}
    for t in (1, 2, 3):
        for node in nodes:
            expected = 2 if (t == 2 and node in twice) else 1
            assert per_round_node[(t, node)] == expected, (t, node)
    assert len(ledger) == 3 * 5 + 2
    assert summary["privacy_ledger"]["releases"] == 17
    assert summary["privacy_ledger"]["aborted_releases"] == 2
    assert summary["rounds"] == 3
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["from_round"] == 1
    assert resumes[0]["aborted_releases"] == 2
    assert [e["round"] for e in events if e["event"] == "checkpoint"] == [1, 2, 3]


def _public_choices(grid: InProcessGrid) -> dict[int, dict[str, Any]]:
    """Per round: the sampled nodes (update recipients), the pairing (partner of each paired
    update) and the nodes that had a pair stage."""
    out: dict[int, dict[str, Any]] = {}
    for msg in grid.sent:
        rnd = int(msg.metadata.group_id)
        entry = out.setdefault(rnd, {"update": set(), "partner": {}, "pair-stage": set()})
        cfg = msg.content.config_records[wire.CFG]
        if is_stage(msg, wire.UPDATE):
            entry["update"].add(msg.metadata.dst_node_id)
            if cfg[wire.ASSIGNMENT] == wire.PAIRED:
                entry["partner"][msg.metadata.dst_node_id] = int(cfg[wire.PARTNER])  # type: ignore[arg-type]
        if is_stage(msg, wire.PAIR):
            entry["pair-stage"].add(msg.metadata.dst_node_id)
    return out


def test_resumed_run_makes_the_same_public_choices_and_stores_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """7 nodes, 5 sampled per round, crash at the start of round 2: the sampling of every round
    equals an uninterrupted run's. Round 2 bootstraps afresh (the pipelined pairing fixed in
    round 1 is never checkpointed): its pairs come from its own pair stage. Round 3's pairing,
    fixed in round 2 over the same nodes, is the uninterrupted run's again. No key, seed or
    blob is in the checkpoint."""
    run_cfg = make_cfg(num_rounds=3, clients_per_round=5, checkpoint_patience=1)
    reference = InProcessGrid({**run_cfg, "out-dir": str(tmp_path / "ref")}, 7)
    _run(reference)

    seeds: list[bytes] = []
    real_seed = handlers.draw_seed

    def spy_seed() -> bytes:
        seeds.append(real_seed())
        return seeds[-1]

    monkeypatch.setattr(handlers, "draw_seed", spy_seed)
    out = tmp_path / "out"
    grid = InProcessGrid({**run_cfg, "out-dir": str(out)}, 7)
    real_start = RunFiles.round_start

    def crash_at_round_2(self: RunFiles, rnd: int) -> None:
        if rnd == 2:
            raise Crash("ServerApp killed")
        real_start(self, rnd)

    with monkeypatch.context() as mp:
        mp.setattr(RunFiles, "round_start", crash_at_round_2)
        with pytest.raises(Crash):
            _run(grid)
    checkpoint_model = np.load(out / CHECKPOINT_DIR / "model-000001.npy")
    _new_flower_run(grid)
    _run(grid, resume=True)

    ref, got = _public_choices(reference), _public_choices(grid)
    for t in (1, 2, 3):
        assert got[t]["update"] == ref[t]["update"], t
        assert len(got[t]["update"]) == 5
    for t in (1, 3):
        assert got[t]["partner"] == ref[t]["partner"], t
    assert set(got[2]["partner"]) == got[2]["pair-stage"]  # round 2: every pair is fresh
    assert len(got[2]["partner"]) == 4
    updates = [m for m in grid.sent if is_stage(m, wire.UPDATE)]
    first_r2 = next(m for m in updates if m.metadata.group_id == "2")
    arrays = first_r2.content.array_records["arrays"]
    sent = flatten_arrays(arrays, layout_of_arrays(arrays))
    np.testing.assert_array_equal(sent, checkpoint_model)  # round 2 starts from the checkpoint

    secrets_seen: list[bytes] = list(seeds)
    for ctx in grid.contexts.values():
        rec = ctx.state.config_records.get(handlers.STATE_KEY)
        assert rec is not None
        secrets_seen.append(bytes(rec["sk"]))  # type: ignore[arg-type]
    for msg in grid.received:  # public keys and relayed pair blobs: not secret, but not kept
        if msg.has_content():
            for rec in msg.content.config_records.values():
                secrets_seen.extend(bytes(v) for v in rec.values() if isinstance(v, bytes))
    assert len(seeds) >= 4 and len(secrets_seen) > len(seeds) + 7
    stored = b"".join(p.read_bytes() for p in (out / CHECKPOINT_DIR).iterdir())
    assert stored
    for secret in secrets_seen:
        assert len(secret) >= 16
        for form in (secret, secret.hex().encode(), base64.b64encode(secret)):
            assert form not in stored
    doc = _state_doc(out)
    assert {"pubkeys", "seed-bytes", "roles", "blobs"}.isdisjoint(doc)


def test_resume_without_checkpoint_fails_with_a_clear_error(tmp_path: Path) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, out_dir=str(tmp_path)), 2)
    with pytest.raises(CheckpointError, match="does not exist"):
        _run(grid, resume=True)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_end" and "CheckpointError" in events[-1]["error"]


def test_resume_of_a_finished_run_only_rewrites_the_summary(tmp_path: Path) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, out_dir=str(tmp_path)), 2)
    first = _run(grid)
    sent_before = len(grid.sent)
    again = _run(grid, resume=True)
    assert len(grid.sent) == sent_before  # no round re-run
    assert again["rounds"] == first["rounds"] == 2
    assert again["final_test_accuracy"] == first["final_test_accuracy"]
    assert [r["round"] for r in _rows(tmp_path)] == [1, 2]


"""cr-mode "derived": round 1 runs keygen and update; later rounds update only. The resumed run
starts with new SuperNodes (new keys, no cached partition), so its first round is like round 1."""

"""A run that cannot learn, or learned nothing, fails; it never ends as a success.

- Every sampled node refuses round 1 by its own privacy policy (the run asks for ``epsilon = 4``,
  the nodes allow at most 1): :meth:`server.strategy.CorBin.start` raises
  :class:`server.strategy.PolicyRefusedError` at once, after one round, naming the run's
  setting and the nodes' limit, and no training ran on any node.
- Only some nodes refuse: the round goes on with the others and the run succeeds.
- No round aggregated an update (every update is lost): the run raises
  :class:`server.strategy.RunFailedError` at the end, after writing ``summary.json``, with each
  round's drops in the message.

The real server and client code on the in-process grid (:mod:`harness`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import InProcessGrid, make_cfg, reply_hook, run

from corbin_fl import wire
from corbin_fl.server.strategy import PolicyRefusedError, RunFailedError


def _limit_epsilon(grid: InProcessGrid, nodes: list[int], max_epsilon: float) -> None:
    """Give ``nodes`` a node config that allows at most ``max_epsilon``."""
    for nid in nodes:
        grid.contexts[nid].node_config["corbin-max-epsilon"] = max_epsilon


@pytest.mark.parametrize("mechanism", ["corbin", "ldpfl"])
def test_every_node_refusing_by_policy_stops_the_run_and_names_both_settings(
    mechanism: str, tmp_path: Path
) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=3, mechanism=mechanism, epsilon=4.0), 3)
    _limit_epsilon(grid, grid.node_ids, 1.0)
    with pytest.raises(PolicyRefusedError) as info:
        run(grid, **{"out-dir": str(tmp_path)})
    text = str(info.value)
    assert text.startswith("round 1: every sampled node (3) refused")
    # the run's setting and the node's limit, and where each is set
    assert "epsilon 4 is above this node's corbin-max-epsilon 1" in text
    assert "the run's epsilon <= 1" in text
    assert "corbin-max-epsilon >= 4" in text and "CORBIN_MAX_EPSILON" in text
    assert all(str(nid) in text for nid in grid.node_ids)
    # stopped at once: only round 1's instructions went out, and no update was ever asked for
    assert {int(m.metadata.group_id) for m in grid.sent} == {1}
    first = {wire.KEYGEN} if mechanism == "corbin" else {wire.UPDATE}
    assert {m.content.config_records[wire.CFG][wire.STAGE] for m in grid.sent} == first
    assert all(r.has_error() and r.error.code == wire.ERROR_CODE_POLICY for r in grid.received)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_end"
    assert "PolicyRefusedError" in events[-1]["error"]
    assert not (tmp_path / "metrics.jsonl").exists() or not (
        (tmp_path / "metrics.jsonl").read_text().strip()
    )


def test_some_nodes_refusing_by_policy_do_not_stop_the_run() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, mechanism="ldpfl", epsilon=2.0), 3)
    strict = grid.node_ids[:1]
    _limit_epsilon(grid, strict, 1.0)
    run(grid)  # no exception: the other two nodes' updates are aggregated
    for rnd in (1, 2):
        replies = [m for m in grid.received if m.metadata.group_id == str(rnd)]
        refused = [m for m in replies if m.has_error()]
        assert [m.metadata.src_node_id for m in refused] == strict
        assert all(m.error.code == wire.ERROR_CODE_POLICY for m in refused)
        assert len(replies) - len(refused) == 2


def test_a_run_in_which_no_round_aggregated_fails_after_writing_its_summary(
    tmp_path: Path,
) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, mechanism="ldpfl"), 2)
    for nid in grid.node_ids:
        grid.hooks.append(reply_hook(wire.UPDATE, nid, lambda i, r: []))  # every update lost
    with pytest.raises(RunFailedError) as info:
        run(grid, **{"out-dir": str(tmp_path)})
    assert not isinstance(info.value, PolicyRefusedError)
    text = str(info.value)
    assert text.startswith("no round of the run aggregated an update (2 round(s))")
    assert "round 1: 2 sampled, 0 updates" in text and "round 2: 2 sampled, 0 updates" in text
    assert "update: " in text  # the stage and reason of the drops
    summary: dict[str, Any] = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["num-rounds"] == 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["participants"] for r in rows] == [0, 0]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_end" and "RunFailedError" in events[-1]["error"]


def test_a_run_with_one_aggregated_round_succeeds() -> None:
    grid = InProcessGrid(make_cfg(num_rounds=2, mechanism="ldpfl"), 2)

    def lose_round_one(instruction: Any, reply: Any) -> list[Any]:
        return [] if instruction.metadata.group_id == "1" else [reply]

    for nid in grid.node_ids:
        grid.hooks.append(reply_hook(wire.UPDATE, nid, lose_round_one))
    summary = run(grid)  # round 2 aggregated: no exception
    assert summary["config"]["num-rounds"] == 2

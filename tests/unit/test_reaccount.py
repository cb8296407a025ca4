"""experiments/reaccount.py: a finished run's privacy section recomputed from its own records
equals what the ServerApp wrote with the same accountant, and ``--write`` restores it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from corbin_fl.experiments import reaccount

RUNS = Path(__file__).resolve().parents[2] / "docs" / "results" / "quick" / "runs"
PLAIN = "ldpfl-eps1-d5-p0-n10-lr0.1-s0-184b26aab1"
"""A run without secure aggregation (A's exact composition; its ledger in the summary)."""
SECURE = "ldpfl-eps1-d5-p0-n10-lr1-s2-f6ebd00953"
"""A run with secure aggregation (B composed from its rounds' sums)."""
RENAMED = {"ldpfl": "ldpq", "augcorbin_theorem3": "corbin_theorem3"}
"""``mse_bounds``' keys renamed for issue 41 (named for the bound, not the mechanism): the
committed runs were written before and keep the old names, which nothing reads."""


def _current_names(privacy: dict[str, Any]) -> dict[str, Any]:
    """``privacy`` with its ``mse_bounds``' keys under today's names (:data:`RENAMED`)."""
    bounds = privacy.get("mse_bounds")
    if not bounds:
        return privacy
    return {**privacy, "mse_bounds": {RENAMED.get(k, k): v for k, v in bounds.items()}}


@pytest.mark.parametrize("run", [PLAIN, SECURE])
def test_recompute_reproduces_the_committed_privacy_section(run: str) -> None:
    summary, new = reaccount.recompute(RUNS / run)
    assert list(reaccount.changes(_current_names(summary["privacy"]), new)) == []


def test_write_restores_a_changed_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / SECURE
    shutil.copytree(RUNS / SECURE, run)
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    right = summary["privacy"]["threat_models"]["B"]["all_rounds"]["eps"]
    summary["privacy"]["threat_models"]["B"]["all_rounds"]["eps"] = 1.0
    path.write_text(json.dumps(summary))
    assert reaccount.main([str(run)]) == 0  # a dry run prints the change, writes nothing
    assert "~ privacy.threat_models.B.all_rounds.eps: 1.0 ->" in capsys.readouterr().out
    assert json.loads(path.read_text())["privacy"]["threat_models"]["B"]["all_rounds"]["eps"] == 1.0
    assert reaccount.main(["--write", str(run)]) == 0
    assert (
        json.loads(path.read_text())["privacy"]["threat_models"]["B"]["all_rounds"]["eps"] == right
    )


def test_a_folder_without_a_run_fails_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"privacy": {}}))
    assert reaccount.main([str(tmp_path)]) == 1

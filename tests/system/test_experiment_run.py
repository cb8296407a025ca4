"""An experiment spec run end to end on the real app (Flower's simulation runtime).

One run, of the paired mechanism (the app's longest path: key exchange, pairing, correlated
bits): what this test adds to tests/unit/test_experiments.py is the real app writing the files
the experiments layer reads, on the runtime the specs use. Sweeps, groups, lambda selection,
tables and figures over many settings are checked there, on runs in the same files. Each run
here starts Ray: with two mechanisms this test took 58 CPU-s of a suite run on 2 cores.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

import pytest

from corbin_fl.experiments import cli as ex
from corbin_fl.experiments.results import SELECTION_RULE
from corbin_fl.experiments.spec import parse_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

E2E_SPEC = """
seeds = [0]
lambda-grid = [1.0]

[experiment]
name = "e2e"
description = "CorBin-FL, one seed, two rounds, four virtual clients"
run-timeout-s = 600
retries = 2                 # Ray gives its raylet a fixed 30 s to start: retry on a busy machine
retry-delay-s = 20

[base]
dataset = "mnist"
model = "cnn"
clients = 4
num-rounds = 2
local-epochs = 1
batch-size = 64
max-steps = 3
epsilon = 1.0
mechanism = "corbin"

[plots]
figures = ["accuracy-bar", "accuracy-vs-round"]
"""


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_quick_experiment_on_the_real_app(tmp_path: Path, flwr_home: Path) -> None:
    spec = parse_spec(tomllib.loads(E2E_SPEC), source=str(tmp_path / "e2e.toml"))
    out = ex.run(spec, tmp_path / "results", progress=False)
    assert out.failed == {}, out.failed
    assert out.executed == 1
    root = tmp_path / "results" / "e2e"
    with (root / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["mechanism"] for r in rows] == ["corbin"]
    for r in rows:
        assert 0.0 <= float(r["test_accuracy"]) <= 1.0
        assert int(r["selected_round"]) in (1, 2)
        assert float(r["uplink_bytes"]) > 0
        assert math.isfinite(float(r["seconds"]))
        summary = json.loads((root.parent / "runs" / r["run_id"] / "summary.json").read_text())
        assert summary["run"]["complete"] is True
    assert (root / "figures" / "accuracy-bar.png").read_bytes()[:8] == PNG_MAGIC
    report = (root / "report.md").read_text()
    assert "## Privacy" in report and SELECTION_RULE in report
    # resuming does nothing
    again = ex.run(spec, tmp_path / "results", progress=False)
    assert again.executed == 0 and again.skipped == 1

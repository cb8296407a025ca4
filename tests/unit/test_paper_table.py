"""The paper's table in one place (``experiments/paper_table.py``, issue 40): every mechanism of
the two CPU specs against eps_p, a cell the mean over seeds with its Student-t half-width, the
committed ``docs/results/paper/table.md`` rebuilt from the committed runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from fake_experiments import FakeBackend, fake_app_dir
from test_lambda_from import BORROWER, SECURE_GRID, _specs

from corbin_fl.experiments import cli as ex
from corbin_fl.experiments import paper_table as pt
from corbin_fl.experiments.results import Stat

REPO = Path(__file__).resolve().parents[2]


def test_the_half_width_is_students_t_over_root_n() -> None:
    # t_{0.975, 2} = 4.302652729911275 (three seeds), t_{0.975, 1} = 12.706204736174707
    assert pt.half_width(Stat(0.7, 0.01, 3)) == pytest.approx(4.302652729911275 * 0.01 / 3**0.5)
    assert pt.half_width(Stat(0.7, 0.02, 2)) == pytest.approx(12.706204736174707 * 0.02 / 2**0.5)
    assert math.isnan(pt.half_width(Stat(0.7, math.nan, 1)))


def test_the_table_has_a_row_per_mechanism_and_a_column_per_eps(tmp_path: Path) -> None:
    source, spec = _specs(tmp_path, BORROWER.replace(SECURE_GRID, ""))
    root, app, backend = tmp_path / "r", fake_app_dir(tmp_path), FakeBackend()
    for s in (source, spec):
        ex.run(s, root, app_dir=app, backend=backend, progress=False)
    rows = pt.rows([source, spec], root)
    labels = [r.label for r in rows]
    # registration order, the rows without DP last (FedAvg)
    assert labels == ["CorBin-FL", "AugCorBin-FL", "LDP-FL", "central Gaussian", "FedAvg"]
    text = pt.build([source, spec], root)
    table = text.split("## Test accuracy against eps_p", 1)[1].split("##", 1)[0]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[4:]}
    corbin = next(r for r in rows if r.label == "CorBin-FL").groups[1.0]
    assert corbin.test.n == 3  # seed 0 chose, seeds 1 and 2 ran at the choice
    hw = pt.half_width(corbin.test)
    want = f"{100 * corbin.test.mean:.2f} ± {100 * hw:.2f} (n=3), λ {corbin.global_lr:g}"
    assert want in lines["CorBin-FL"]
    cells = lines["AugCorBin-FL"].split(" | ")
    assert cells[1] == "—" and "(n=2)" in cells[3]  # no eps_p 0.1 here; two seeds, one lambda
    assert lines["FedAvg"].split(" | ")[-2].endswith("(n=3), λ 1")  # the no-DP column
    # LDP-FL is in both specs: the first spec's setting (3 seeds), not the borrower's (2)
    assert "(n=3), λ" in lines["LDP-FL"].split(" | ")[3]
    body = table.split("| mechanism |", 1)[1]
    assert "?" not in body  # every lambda grid has run: no choice is provisional
    privacy = text.split("## The guarantee per threat model at eps_p = 1", 1)[1]
    assert "| CorBin-FL | eps_p = 1 per parameter | no DP" in privacy
    assert "`tiny` 25 of 25 runs; `borrower` 12 of 12 runs" in text


def test_the_committed_table_is_the_committed_runs() -> None:
    """docs/results/paper/table.md is what the command builds from the committed runs (all but
    its time stamp): regenerate it whenever a run is committed."""
    path = REPO / "docs" / "results" / "paper" / pt.TABLE_FILE
    committed = path.read_text(encoding="utf-8")
    built = pt.build([pt.load_spec(p) for p in pt.SPECS], REPO / "docs" / "results" / "paper")
    stamp = re.compile(r"^- generated: .*$", flags=re.M)
    assert stamp.sub("", built).replace(str(REPO / "docs"), "docs") == stamp.sub("", committed), (
        "stale: python -m corbin_fl.experiments.paper_table --results docs/results/paper"
    )


def test_rows_before_any_run_and_a_provisional_choice(tmp_path: Path) -> None:
    source, spec = _specs(tmp_path)
    labels = [r.label for r in pt.rows([source, spec], tmp_path / "r")]
    assert labels == [
        *("CorBin-FL", "AugCorBin-FL", "LDP-FL", "central Gaussian", "FedAvg"),
        "LDP-FL + SecAgg+",
    ]
    head = pt.privacy_table(pt.rows([source, spec], tmp_path / "r")).splitlines()[0]
    assert "| B: server that sees every bit (only the sum in the SecAgg+ rows) |" in head
    head = pt.privacy_table(pt.rows([source], tmp_path / "r")).splitlines()[0]
    assert "| B: server that sees every bit |" in head  # no secure row
    root, app = tmp_path / "r", fake_app_dir(tmp_path)
    ex.run(source, root, app_dir=app, backend=FakeBackend(), progress=False, max_runs=2)
    (row,) = [r for r in pt.rows([source], root) if r.label == "LDP-FL"]
    assert row.provisional == {0.5}  # 2 of its 3 lambdas ran: the best so far, marked
    assert pt.cell(row.groups[0.5], True).endswith("?")

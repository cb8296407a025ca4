"""A grid's own ``lambda-grid``: the settings of one ``[grid]`` / ``[[extra-grid]]`` table run at
their own lambda candidates instead of the top-level grid's (issue 40: the paper spec's other
mechanisms run at the lambda the main table chose for their eps_p, not at a fixed 1.0)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from corbin_fl.experiments import cli as ex
from corbin_fl.experiments.report import lambda_text
from corbin_fl.experiments.results import group_results
from corbin_fl.experiments.spec import SpecError
from corbin_fl.experiments.sweep import expand_runs

OWN = TINY.replace(
    '[[extra-grid]]\nmechanism = ["fedavg"]\n',
    '[[extra-grid]]\nmechanism = ["fedavg"]\nlambda-grid = [0.3]\n',
)


def test_an_extra_grid_runs_at_its_own_lambdas_and_the_others_at_the_top_level_ones() -> None:
    spec = spec_from(OWN)
    assert spec.lambda_grid == (0.5, 1.0) and spec.grid_lambdas == (None, (0.3,))
    assert spec.lambdas(0) == (0.5, 1.0) and spec.lambdas(1) == (0.3,)
    assert spec.all_lambdas == (0.3, 0.5, 1.0)
    runs = expand_runs(spec)
    by_mechanism: dict[str, set[float]] = {}
    for r in runs:
        by_mechanism.setdefault(str(r.run_config["mechanism"]), set()).add(
            float(r.run_config["global-lr"])
        )
    assert by_mechanism == {"ldpfl": {0.5, 1.0}, "corbin": {0.5, 1.0}, "fedavg": {0.3}}
    assert len(runs) == (4 * 2 + 1 * 1) * 2  # settings x their lambdas x 2 seeds
    # the same spec without the override: fedavg at both top-level lambdas, ids unchanged
    plain = {r.run_id for r in expand_runs(spec_from(TINY))}
    assert {r.run_id for r in runs if r.run_config["mechanism"] != "fedavg"} <= plain
    assert "(its own: extra-grid[0]: [0.3])" in lambda_text(spec)
    assert lambda_text(spec_from(TINY)) == "[0.5, 1.0]"


def test_the_report_chooses_among_each_settings_own_lambdas(tmp_path: Path) -> None:
    spec, root = spec_from(OWN), tmp_path / "r"
    out = ex.run(spec, root, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(), progress=False)
    assert (out.executed, out.total, out.failed) == (18, 18, {})
    groups = group_results(ex.load_finished(spec, root), spec.lambda_seeds)
    fedavg = [g for g in groups if g.setting["mechanism"] == "fedavg"]
    assert [g.global_lr for g in fedavg] == [0.3]
    assert all(g.global_lr in (0.5, 1.0) for g in groups if g not in fedavg)
    report = out.report.read_text(encoding="utf-8") if out.report else ""
    assert "| setting | λ=0.3 | λ=0.5 | λ=1 |" in report  # every candidate a column


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("lambda-grid = [0.0]", r"extra-grid\[0\]"),
        ("lambda-grid = [1.5]", r"extra-grid\[0\]"),
        ("lambda-grid = []", r"extra-grid\[0\]"),
        ("global-lr = [0.3]", "a grid's own `lambda-grid`"),
    ],
    ids=["zero", "above-one", "empty", "global-lr"],
)
def test_a_bad_grid_lambda_fails_before_anything_runs(line: str, match: str) -> None:
    text = TINY.replace('[[extra-grid]]\nmechanism = ["fedavg"]\n', f"[[extra-grid]]\n{line}\n")
    with pytest.raises(SpecError, match=match):
        spec_from(text)

"""Lambda chosen on some seeds (a spec's ``lambda-seeds``): every setting runs the whole lambda
grid on those seeds first, then its other seeds only at the lambda chosen from them; the plan,
the runner and the report agree on which runs the table needs (issue 40)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.experiments import cli as ex
from corbin_fl.experiments.results import (
    LAMBDA_MAX,
    choose_lambda,
    grid_end,
    grid_end_text,
    group_label,
    group_results,
    load_run,
)
from corbin_fl.experiments.spec import SpecError
from corbin_fl.experiments.sweep import POOL_DIR, Run, RunState, expand_runs, table_size

TWO_STAGE = TINY.replace("seeds = [0, 1]\n", "seeds = [0, 1, 2]\nlambda-seeds = [0]\n")
SETTINGS = 5  # ldpfl and corbin at two eps, fedavg
LAMBDAS = 2


def _lambda_of(run_id: str, root: Path) -> tuple[str, int, float]:
    """(setting key, seed, lambda) of a finished run in the pool under ``root``."""
    result = load_run(root / POOL_DIR / run_id)
    return result.setting_key, result.seed, result.global_lr


def test_the_spec_names_the_seeds_that_choose_and_the_runs_come_in_two_stages() -> None:
    spec = spec_from(TWO_STAGE)
    assert spec.selection_seeds == (0,) and spec.confirmation_seeds == (1, 2)
    runs = expand_runs(spec)
    assert len(runs) == SETTINGS * LAMBDAS * 3  # every combination exists as a run
    first = [r.selects for r in runs]
    # every lambda-choosing run (seed 0) comes before any run on seeds 1 and 2
    assert first == sorted(first, reverse=True) and sum(first) == SETTINGS * LAMBDAS
    assert all((r.run_config["seed"] == 0) == r.selects for r in runs)
    assert table_size(spec, runs) == SETTINGS * LAMBDAS + SETTINGS * 2
    # without lambda-seeds every seed chooses, every run is needed, in the former order
    plain = spec_from(TINY)
    assert plain.confirmation_seeds == () and all(r.selects for r in expand_runs(plain))
    assert table_size(plain, expand_runs(plain)) == len(expand_runs(plain))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (TINY.replace("seeds = [0, 1]\n", "seeds = [0, 1]\nlambda-seeds = [2]\n"), "not in seeds"),
        (TINY.replace("seeds = [0, 1]\n", "seeds = [0, 1]\nlambda-seeds = []\n"), "lambda-seeds"),
        (TINY.replace("seeds = [0, 1]\n", "seeds = [0, 1]\nlambda-seeds = [0, 0]\n"), "duplicate"),
        (
            "lambda-seeds = [0]\n[experiment]\nname = 'm'\nkind = 'mse'\n",
            'lambda-seeds: not used by kind = "mse"',
        ),
    ],
    ids=["not-a-seed", "empty", "duplicate", "mse"],
)
def test_bad_lambda_seeds_fail_before_anything_runs(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        spec_from(text)


def test_the_plan_waits_for_the_choice_then_needs_only_the_chosen_lambda(tmp_path: Path) -> None:
    spec, root = spec_from(TWO_STAGE), tmp_path / "r"
    planned = ex.plan(spec, root)
    states = [s for _, s in planned]
    assert states.count(RunState.MISSING) == SETTINGS * LAMBDAS
    assert states.count(RunState.WAITING) == SETTINGS * 2 * LAMBDAS  # which lambda: not known
    assert len(ex.to_do(planned)) == table_size(spec, expand_runs(spec)) == 20
    assert ex.plan_counts(spec, planned) == (
        "tiny: 20 runs (0 done, 0 partial, 10 to do, 10 then at their setting's chosen lambda "
        "(seeds 1, 2; lambda chosen on seed 0))"
    )
    backend, app = FakeBackend(), fake_app_dir(tmp_path)
    first = ex.run(spec, root, app_dir=app, backend=backend, progress=False, max_runs=10)
    assert first.executed == 10 and first.total == 20 and not first.failed
    assert {_lambda_of(rid, root)[1] for rid in backend.calls} == {0}  # stage 1 only
    planned = ex.plan(spec, root)
    assert RunState.WAITING not in {s for _, s in planned}
    todo = [r for r, s in planned if s is RunState.MISSING]
    assert len(todo) == SETTINGS * 2
    runs = expand_runs(spec)
    for r in todo:  # each at the lambda the report's rule picks from the setting's seed-0 runs
        mine = [o for o in runs if o.setting_key == r.setting_key and o.selects]
        assert len(mine) == LAMBDAS
        chosen, _ = choose_lambda([load_run(root / POOL_DIR / o.run_id) for o in mine])
        assert r.run_config["global-lr"] == chosen and r.run_config["seed"] in (1, 2)
    second = ex.run(spec, root, app_dir=app, backend=backend, progress=False)
    assert (second.skipped, second.executed, second.total) == (10, 10, 20)
    assert sorted(backend.calls[10:]) == sorted(r.run_id for r in todo)


def test_one_invocation_runs_both_stages_and_the_report_chooses_on_seed_0(tmp_path: Path) -> None:
    spec, root = spec_from(TWO_STAGE), tmp_path / "r"
    backend = FakeBackend()
    out = ex.run(spec, root, app_dir=fake_app_dir(tmp_path), backend=backend, progress=False)
    assert (out.executed, out.total, out.failed) == (20, 20, {})
    seeds = [_lambda_of(rid, root)[1] for rid in backend.calls]
    assert seeds[:10] == [0] * 10 and set(seeds[10:]) == {1, 2}
    assert ex.plan_counts(spec, ex.plan(spec, root)) == (
        "tiny: 20 runs (20 done, 0 partial, 0 to do)"
    )
    report = out.report.read_text(encoding="utf-8") if out.report else ""
    assert "runs: 20 of 20 finished (complete)" in report
    assert "chosen on seed 0 alone; seeds 1, 2 ran only at each setting's chosen lambda" in report
    assert "### Lambda selection (mean validation accuracy at the checkpoints, seed 0)" in report
    table = report.split("## Results", 1)[1].split("###", 1)[0]
    assert table.count("| 3 |") == SETTINGS  # every setting: 3 seeds at its lambda
    groups = group_results(ex.load_finished(spec, root), spec.lambda_seeds)
    for g in groups:  # chosen on seed 0's validation alone, reported over all 3 seeds
        assert {lam: s.n for lam, s in g.lambda_scores.items()} == {0.5: 1, 1.0: 1}
        assert g.test.n == 3 and {r.seed for r in g.runs} == {0, 1, 2}


def test_a_failed_choosing_run_leaves_its_settings_other_seeds_waiting(tmp_path: Path) -> None:
    spec, root = spec_from(TWO_STAGE), tmp_path / "r"
    runs = expand_runs(spec)
    doomed = runs[0]  # a seed-0 run of the first setting
    backend = FakeBackend(fail={doomed.run_id})
    out = ex.run(spec, root, app_dir=fake_app_dir(tmp_path), backend=backend, progress=False)
    assert set(out.failed) == {doomed.run_id}
    # the 4 other settings ran both stages; the first setting's seeds 1, 2 wait for its choice
    assert out.executed == 1 + 4 * LAMBDAS + 4 * 2
    waiting = {r.run_id for r, s in ex.plan(spec, root) if s is RunState.WAITING}
    assert waiting == {
        r.run_id for r in runs if r.setting_key == doomed.setting_key and not r.selects
    }


@pytest.mark.parametrize(
    ("chosen", "grid", "end"),
    [
        (0.03, [1.0, 0.1, 0.03, 0.3], "smallest"),
        (0.3, [0.03, 0.1, 0.3], "largest"),
        (1.0, [0.03, 0.1, 0.3, 1.0], None),  # nothing lies above lambda = 1 (eq. 6)
        (0.1, [0.03, 0.1, 0.3, 1.0], None),
        (0.5, [0.5], None),  # a grid of one value chooses nothing
    ],
)
def test_a_choice_at_an_end_of_its_grid_is_named(
    chosen: float, grid: list[float], end: str | None
) -> None:
    assert grid_end(chosen, grid) == end
    text = grid_end_text("pbm, epsilon=0.3", chosen, grid)
    if end is None:
        assert text is None
    else:
        beyond = "below" if end == "smallest" else "above"
        values = ", ".join(f"{lam:g}" for lam in sorted(grid))
        assert text == (
            f"pbm, epsilon=0.3: lambda {chosen:g}, the {end} of its grid [{values}]: "
            f"the best may lie {beyond} it"
        )


def test_lambda_max_is_the_largest_global_lr_a_run_accepts() -> None:
    """:data:`LAMBDA_MAX` is where the run config stops: no grid extends above it."""
    assert AppConfig.from_flower({"global-lr": LAMBDA_MAX}).global_lr == LAMBDA_MAX
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({"global-lr": math.nextafter(LAMBDA_MAX, 2.0)})
    assert "global-lr" in info.value.errors


def test_the_plan_and_the_report_name_the_choices_at_an_end_of_the_grid(tmp_path: Path) -> None:
    """A choice at the smallest or largest lambda says only that the best may lie beyond the
    grid: the plan and the report name every such setting once its lambda-choosing runs are
    done (and the report the setting whose choice is not final yet), none inside its grid."""
    three = TWO_STAGE.replace("lambda-grid = [0.5, 1.0]", "lambda-grid = [0.25, 0.5, 1.0]")
    spec, root = spec_from(three), tmp_path / "r"
    pool = root / POOL_DIR
    first = ex.run(
        spec, root, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(), progress=False,
        max_runs=13,
    )  # fmt: skip
    assert first.executed == 13  # 4 settings' 3 lambdas, and 1 of the 5th's
    planned = ex.plan(spec, root)
    choosing: dict[str, list[Run]] = {}
    for r, _ in planned:
        if r.selects:
            choosing.setdefault(r.setting_key, []).append(r)
    done = {r.run_id for r, state in planned if state is RunState.DONE}
    ends: dict[str, str | None] = {}  # final settings, in the plan's order
    chosen: dict[str, float] = {}
    labels: dict[str, str] = {}
    for key, members in choosing.items():
        results = [load_run(pool / r.run_id) for r in members if r.run_id in done]
        labels[key] = group_label(results[0].setting, ["mechanism", "epsilon"])
        if len(results) == 3:
            chosen[key] = choose_lambda(results)[0]
            ends[key] = grid_end(chosen[key], [0.25, 0.5, 1.0])
    # the fake's accuracy does not depend on lambda: one setting chooses the smallest, one the
    # largest, 1, which no grid can extend (LAMBDA_MAX), and two lie inside the grid
    assert sorted(chosen.values()) == [0.25, 0.5, 0.5, 1.0]
    assert sorted(map(str, ends.values())) == ["None", "None", "None", "smallest"]
    named = ex.grid_ends(spec, planned, pool)
    assert [text.split(":", 1)[0] for text in named] == [
        labels[key] for key, end in ends.items() if end is not None
    ]
    for text, end in zip(named, [end for end in ends.values() if end is not None], strict=True):
        assert f", the {end} of its grid [0.25, 0.5, 1]: the best may lie " in text
    report = first.report.read_text(encoding="utf-8") if first.report else ""
    selection = report.split("### Lambda selection", 1)[1].split("## Figures", 1)[0]
    (unfinished,) = (labels[key] for key in choosing if key not in ends)
    assert f"Not final (a lambda-choosing run not finished):\n\n- {unfinished}\n" in selection
    bullets = "".join(f"- {text}\n" for text in named)
    assert f"Chosen at an end of the grid:\n\n{bullets}" in selection

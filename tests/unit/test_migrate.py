"""Tests of ``corbin-fl experiment migrate`` (:mod:`experiments.migrate`).

The scenario is the one the module exists for: an experiment is run (fake backend, real runner,
real run records) while the app's default is ``range-mode = "layer"``; the default becomes
``"update"``, so every run is stale; the spec then states ``range-mode = "layer"``, which gives
its runs new ids; the migration moves the finished runs to those ids without running anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from experiments import cli as exp_cli
from experiments import experiment as ex
from experiments.migrate import (
    MigrationError,
    migrate_experiments,
    plan_migration,
)
from experiments.spec import load_app_defaults
from experiments.sweep import Run, RunState, expand_runs

LAYER = TINY.replace("d = 5\n", 'd = 5\nrange-mode = "layer"\n')
"""TINY with the range mode its runs were made with, stated."""
RUNS = 20
"""Runs of TINY: (2 x 2 + 1) settings x 2 lambdas x 2 seeds."""


class AppBackend(FakeBackend):
    """:class:`FakeBackend` that records the effective config as the app does: the app's
    defaults (``[tool.flwr.app.config]`` of ``app``, read at each run) overridden by the run's."""

    def __init__(self, app: Path) -> None:
        super().__init__()
        self.app = app

    def execute(self, run: Run, run_config: Mapping[str, Any], out_dir: Path, **kw: Any) -> Any:
        effective = {**load_app_defaults(self.app), **run_config}
        return super().execute(run, effective, out_dir, **kw)


def set_default(app: Path, key: str, value: Any) -> None:
    """Change one default of the app's ``[tool.flwr.app.config]``."""
    pyproject = app / "pyproject.toml"
    line = f"{key} = {json.dumps(value)}"
    text, n = re.subn(rf"^{key} = .*$", line, pyproject.read_text(), flags=re.MULTILINE)
    assert n == 1
    pyproject.write_text(text)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def made_in_the_layer_mode(tmp_path: Path, text: str = TINY) -> tuple[Path, Path]:
    """Run ``text`` while the app's default is the layer range, then change the default to
    ``"update"``; return the app folder and the results folder."""
    app = fake_app_dir(tmp_path)
    set_default(app, "range-mode", "layer")
    set_default(app, "update-radius", 0.01)
    results = tmp_path / "results"
    ex.run_federated(spec_from(text), results, app_dir=app, backend=AppBackend(app), progress=False)
    set_default(app, "range-mode", "update")
    set_default(app, "update-radius", 0.0)
    return app, results


def states(text: str, results: Path, app: Path) -> list[RunState]:
    return [s for _, s in ex.plan(spec_from(text), results, load_app_defaults(app))]


def test_runs_move_to_the_ids_of_the_spec_that_states_their_value(tmp_path: Path) -> None:
    app, results = made_in_the_layer_mode(tmp_path)
    defaults = load_app_defaults(app)
    runs_csv = (results / "tiny" / "runs.csv").read_text()
    assert states(TINY, results, app) == [RunState.STALE] * RUNS
    assert states(LAYER, results, app) == [RunState.MISSING] * RUNS  # other ids
    before = snapshot(results / "tiny" / "runs")

    done, refused = migrate_experiments([spec_from(LAYER)], results, defaults)

    assert refused == []
    plan = done[0].plan
    assert (plan.renamed, plan.rewritten, plan.unchanged, plan.to_do) == (RUNS, 0, 0, ())
    assert states(LAYER, results, app) == [RunState.DONE] * RUNS
    ids = {}
    for run in expand_runs(spec_from(LAYER)):
        folder = results / "tiny" / "runs" / run.run_id
        summary = json.loads((folder / "summary.json").read_text())
        record = summary["run"]
        (old,) = record["renamed_from"]
        ids[old] = run.run_id
        assert record["run_config"] == {**dict(run.run_config)}
        assert (record["run_id"], record["config_hash"]) == (run.run_id, run.config_hash)
        assert record["run_config"]["range-mode"] == "layer"
        # every other file, and summary.json but for the run record, is unchanged
        old_summary = json.loads(before[f"{old}/summary.json"])
        assert {k: v for k, v in summary.items() if k != "run"} == {
            k: v for k, v in old_summary.items() if k != "run"
        }
        for key in ("experiment", "flwr_run_id", "seconds", "started_at", "complete"):
            assert record[key] == old_summary["run"][key]
        for name in ("metrics.jsonl", "app/metrics.jsonl", "app/summary.json"):
            assert (folder / name).read_bytes() == before[f"{old}/{name}"]
    assert len(ids) == RUNS and set(ids) != set(ids.values())
    # the results it reports are the same, under the new ids
    ex.finalize_federated(spec_from(LAYER), results, app_defaults=defaults)
    renamed = re.sub("|".join(ids), lambda m: ids[m.group(0)], runs_csv)
    assert (results / "tiny" / "runs.csv").read_text() == renamed


def test_migrating_again_changes_nothing(tmp_path: Path) -> None:
    app, results = made_in_the_layer_mode(tmp_path)
    defaults = load_app_defaults(app)
    migrate_experiments([spec_from(LAYER)], results, defaults)
    after = snapshot(results)

    done, refused = migrate_experiments([spec_from(LAYER)], results, defaults)

    assert refused == []
    plan = done[0].plan
    assert (plan.renamed, plan.rewritten, plan.unchanged) == (0, 0, RUNS)
    assert snapshot(results) == after


def test_an_ambiguous_match_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """update-radius has no effect in the layer mode, so a grid over it names every layer run
    twice: which id a finished run should get is not decidable."""
    app, results = made_in_the_layer_mode(tmp_path)
    twice = LAYER.replace(
        "epsilon = [0.5, 1.0]\n", "epsilon = [0.5, 1.0]\nupdate-radius = [0.01, 0.02]\n", 1
    )
    before = snapshot(results)

    with pytest.raises(MigrationError, match="ambiguous") as info:
        plan_migration(spec_from(twice), results, load_app_defaults(app))

    # the quantizing runs (2 mechanisms x 2 eps x 2 lambdas x 2 seeds) are each two runs of it;
    # the fedavg runs (no update-radius in their grid) are not
    assert len(info.value.problems) == 16
    assert all("ambiguous" in p for p in info.value.problems)
    done, refused = migrate_experiments([spec_from(twice)], results, load_app_defaults(app))
    assert (done, len(refused)) == ([], 1)
    assert snapshot(results) == before


def test_a_folder_that_is_no_run_or_the_same_run_twice_is_refused(tmp_path: Path) -> None:
    app, results = made_in_the_layer_mode(tmp_path)
    defaults = load_app_defaults(app)
    # the spec as it was: its runs would now be made in the update mode
    with pytest.raises(MigrationError) as info:
        plan_migration(spec_from(TINY), results, defaults)
    assert len(info.value.problems) == RUNS
    assert "range-mode (recorded 'layer', app default 'update')" in info.value.problems[0]
    assert "state the recorded value in the spec" in info.value.problems[0]

    runs_dir = results / "tiny" / "runs"
    first = sorted(runs_dir.iterdir())[0]
    (runs_dir / "a-copy").mkdir()
    for name in ("summary.json", "metrics.jsonl"):
        (runs_dir / "a-copy" / name).write_bytes((first / name).read_bytes())
    (runs_dir / "unfinished").mkdir()
    before = snapshot(results)
    with pytest.raises(MigrationError) as info:
        plan_migration(spec_from(LAYER), results, defaults)
    problems = "\n".join(info.value.problems)
    assert len(info.value.problems) == 2
    assert f"tiny/runs/{first.name} and tiny/runs/a-copy are both the run" in problems
    assert "tiny/runs/unfinished: no run record" in problems
    assert snapshot(results) == before


def test_copies_in_another_experiment_follow_their_source(tmp_path: Path) -> None:
    """A run copied into a second experiment names its source (reused_from); both experiments
    migrate on their own, and the copy ends up pointing at the source's new folder."""
    app, results = made_in_the_layer_mode(tmp_path)
    copy_text = TINY.replace('name = "tiny"', 'name = "tiny-copy"')
    set_default(app, "range-mode", "layer")
    set_default(app, "update-radius", 0.01)
    backend = AppBackend(app)
    ex.run_federated(spec_from(copy_text), results, app_dir=app, backend=backend, progress=False)
    assert backend.calls == []  # every run copied from tiny
    set_default(app, "range-mode", "update")
    set_default(app, "update-radius", 0.0)
    copy_layer = LAYER.replace('name = "tiny"', 'name = "tiny-copy"')

    # the copy first: its sources move only afterwards, in the same invocation
    done, refused = migrate_experiments(
        [spec_from(copy_layer), spec_from(LAYER)], results, load_app_defaults(app)
    )

    assert refused == []
    assert [(r.plan.experiment, r.references_updated, r.warnings) for r in done] == [
        ("tiny-copy", RUNS, ()),
        ("tiny", 0, ()),
    ]
    for run in expand_runs(spec_from(copy_layer)):
        record = json.loads(
            (results / "tiny-copy" / "runs" / run.run_id / "summary.json").read_text()
        )
        assert record["run"]["reused_from"] == f"tiny/runs/{run.run_id}"
    assert states(copy_layer, results, app) == [RunState.DONE] * RUNS


def test_cli_migrate_dry_run_then_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app, results = made_in_the_layer_mode(tmp_path)
    (tmp_path / "old.toml").write_text(TINY)
    (tmp_path / "tiny.toml").write_text(LAYER)
    before = snapshot(results)
    base = ["--results", str(results), "--app", str(app)]

    assert exp_cli.main(["migrate", str(tmp_path / "tiny.toml"), *base, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"tiny: {RUNS} run folders: {RUNS} would be renamed" in " ".join(out.split())
    assert snapshot(results) == before

    assert exp_cli.main(["migrate", str(tmp_path / "old.toml"), *base]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "not migrated, nothing changed" in err and "range-mode" in err
    assert snapshot(results) == before

    assert exp_cli.main(["migrate", str(tmp_path / "tiny.toml"), *base]) == 0
    assert exp_cli.main(["plan", str(tmp_path / "tiny.toml"), *base]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"tiny: {RUNS} runs ({RUNS} done, 0 partial, 0 stale, 0 to do)" in out

"""Tests of ``corbin-fl experiment migrate`` (:mod:`experiments.migrate`): the runs of the
per-experiment layout (``<results>/<experiment>/runs/<old-id>/``, copies of shared runs in each
experiment) move into the run pool, addressed by their result config, without running anything.

The old folders are made by the real runner (fake backend) and then put back into the old layout:
the old record had no ``"config"``, an id that hashed the spec's keys and, for a copy, a
``"reused_from"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from experiments import cli as exp_cli
from experiments import experiment as ex
from experiments.migrate import apply_migration, plan_migration
from experiments.sweep import POOL_DIR, RunState, expand_runs

LAYER = TINY.replace("d = 5\n", 'd = 5\nrange-mode = "layer"\n')
"""TINY in the layer range (the range every run had before range-mode existed)."""


def old_layout(results: Path, experiment: str, *, copy_of: str | None = None) -> list[Path]:
    """Move the pool's runs into ``<results>/<experiment>/runs/`` as the old runner left them
    (copies of them when ``copy_of`` names the experiment they were reused from)."""
    moved = []
    for folder in sorted((results / POOL_DIR).iterdir()):
        target = results / experiment / "runs" / f"old-{folder.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder, target)
        summary = json.loads((target / "summary.json").read_text())
        record = {k: v for k, v in summary["run"].items() if k != "config"}
        record.update(run_id=target.name, config_hash="old")
        if copy_of is not None:
            record["reused_from"] = f"{copy_of}/runs/{target.name}"
        summary["run"] = record
        (target / "summary.json").write_text(json.dumps(summary))
        moved.append(target)
    return moved


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def made_old(tmp_path: Path, text: str = LAYER) -> Path:
    """One experiment and a copy of it in a second one, in the old layout."""
    results = tmp_path / "results"
    spec = spec_from(text)
    ex.run_federated(
        spec, results, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(), progress=False
    )
    ex.finalize_federated(spec, results)
    old_layout(results, "tiny")
    old_layout(results, "wider", copy_of="tiny")
    shutil.rmtree(results / POOL_DIR)
    return results


def test_old_runs_and_their_copies_become_one_pool_folder_each(tmp_path: Path) -> None:
    results = made_old(tmp_path)
    spec = spec_from(LAYER)
    reported = snapshot(results / "tiny")
    assert {s for _, s in ex.plan(spec, results)} == {RunState.MISSING}

    plan = plan_migration(results)
    runs = len(expand_runs(spec))
    assert (plan.count("move"), plan.count("duplicate"), plan.count("conflict")) == (runs, runs, 0)
    apply_migration(plan)
    assert {s for _, s in ex.plan(spec, results)} == {RunState.DONE}
    assert not (results / "tiny" / "runs").exists() and not (results / "wider" / "runs").exists()
    run = expand_runs(spec)[0]
    record = json.loads((results / POOL_DIR / run.run_id / "summary.json").read_text())["run"]
    assert (record["run_id"], record["config_hash"]) == (run.run_id, run.config_hash)
    assert record["config"] == dict(run.config)
    assert record["migrated_from"] == [
        f"tiny/runs/old-{run.run_id}",
        f"wider/runs/old-{run.run_id}",
    ]
    assert "reused_from" not in record
    # the report made from the pool is the report made before, number for number
    ex.finalize_federated(spec, results)
    after = snapshot(results / "tiny")
    for name in ("runs.csv", "groups.csv"):
        assert after[name] == reported[name]
    # running it again changes nothing
    before = snapshot(results)
    again = plan_migration(results)
    assert again.moves == [] and again.skipped == []
    apply_migration(again)
    assert snapshot(results) == before


def test_a_record_older_than_a_key_ran_with_the_value_the_key_came_with(tmp_path: Path) -> None:
    """range-mode came with "layer" (today's default is "update"): a run recorded without it is
    the run of a spec that states the layer range, not of one that leaves the default."""
    results = made_old(tmp_path)
    for summary_path in results.glob("*/runs/*/summary.json"):
        summary = json.loads(summary_path.read_text())
        del summary["config"]["range-mode"], summary["config"]["update-radius"]
        summary_path.write_text(json.dumps(summary))
    apply_migration(plan_migration(results))
    assert {s for _, s in ex.plan(spec_from(LAYER), results)} == {RunState.DONE}
    assert {s for _, s in ex.plan(spec_from(TINY), results)} == {RunState.MISSING}


def test_other_executions_of_a_pooled_run_and_partial_folders_stay_where_they_are(
    tmp_path: Path,
) -> None:
    results = made_old(tmp_path)
    spec = spec_from(LAYER)
    run = expand_runs(spec)[0]
    # a third experiment ran that configuration again (other numbers: another execution)
    again = results / "again" / "runs" / f"old-{run.run_id}"
    shutil.copytree(results / "tiny" / "runs" / f"old-{run.run_id}", again)
    (again / "metrics.jsonl").write_text((again / "metrics.jsonl").read_text().replace("0.", "0.0"))
    partial = results / "again" / "runs" / "torn"
    partial.mkdir()
    (partial / "summary.json").write_text('{"run": ')

    plan = plan_migration(results)
    assert [m.source for m in plan.moves if m.action == "conflict"] == [again]
    assert len(plan.skipped) == 1 and plan.skipped[0].startswith("again/runs/torn")
    apply_migration(plan)
    # the execution two experiments shared is the pool's; the other one is kept, not lost
    pooled = results / POOL_DIR / run.run_id
    assert (pooled / "metrics.jsonl").read_bytes() != (again / "metrics.jsonl").read_bytes()
    assert again.is_dir() and partial.is_dir()
    assert {s for _, s in ex.plan(spec, results)} == {RunState.DONE}


def test_cli_dry_run_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = made_old(tmp_path)
    before = snapshot(results)
    assert exp_cli.main(["migrate", "--results", str(results), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "20 were moved" not in out and "20 would be moved into the pool" in out
    assert snapshot(results) == before
    assert exp_cli.main(["migrate", "--results", str(results)]) == 0
    assert "20 were moved into the pool, 20 copies were removed" in capsys.readouterr().out
    assert {s for _, s in ex.plan(spec_from(LAYER), results)} == {RunState.DONE}


def test_a_migration_cut_off_midway_completes_when_run_again(tmp_path: Path) -> None:
    results = made_old(tmp_path)
    run = expand_runs(spec_from(LAYER))[0]
    again = results / "again" / "runs" / f"old-{run.run_id}"  # another execution of a run
    shutil.copytree(results / "tiny" / "runs" / f"old-{run.run_id}", again)
    (again / "metrics.jsonl").write_text((again / "metrics.jsonl").read_text().replace("0.", "0.0"))
    plan = plan_migration(results)
    cut = next(i for i, m in enumerate(plan.moves) if m.action == "duplicate") + 3
    plan.moves = plan.moves[:cut]  # the moves a process killed here had carried out
    apply_migration(plan)
    rest = plan_migration(results)
    assert rest.count("duplicate") + rest.count("move") > 0
    assert [m.source for m in rest.moves if m.action == "conflict"] == [again]
    apply_migration(rest)
    assert {s for _, s in ex.plan(spec_from(LAYER), results)} == {RunState.DONE}
    assert list(results.glob("*/runs/*")) == [again] and len(list(results.glob("runs/*"))) == 20

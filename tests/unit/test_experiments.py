"""Tests of the experiment framework (``corbin-fl experiment``, ``experiments``).

Fast tests use a fake backend that writes real files in the app's contract format
(``metrics.jsonl``: one object per round; ``summary.json``: config, final accuracy, privacy);
the ``e2e`` test runs a tiny experiment on the real app on Flower's simulation runtime.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_experiments import (
    FAKE_M,
    TINY,
    FakeBackend,
    fake_app_dir,
    spec_from,
)

from corbin_fl import registry
from corbin_fl.app.config import AppConfig
from corbin_fl.config import MECHANISMS
from corbin_fl.deploy.follow import read_jsonl as read_metrics
from corbin_fl.experiments import cli as ex
from corbin_fl.experiments import mse, plots
from corbin_fl.experiments.host import host_record
from corbin_fl.experiments.mse import (
    GridMSE,
    RealWeightsMSE,
    measure_grid,
    measure_real_weights,
    measurement_table,
    mse_targets,
    read_measurement,
)
from corbin_fl.experiments.report import (
    TARGET_RULE,
    Difference,
    _amount,
    federated_targets,
    verdict,
)
from corbin_fl.experiments.results import (
    SELECTION_RULE,
    RunResult,
    Selection,
    Stat,
    choose_lambda,
    group_label,
    group_results,
    load_run,
    select_round,
    varying_keys,
    write_table,
)
from corbin_fl.experiments.spec import (
    MSESpec,
    RealWeightsSpec,
    SpecError,
    load_spec,
)
from corbin_fl.experiments.sweep import (
    Run,
    RunState,
    Submission,
    app_run_config,
    check_app_accepts,
    execute_run,
    expand_runs,
    make_run_id,
    run_state,
)
from corbin_fl.mechanisms.accounting import THREAT_MODELS
from corbin_fl.mechanisms.report import privacy_report

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
"""Parameters of the fake model (what the privacy report composes over)."""


# --------------------------------------------------------------------------- helpers


def write_run(
    run_dir: Path,
    run_config: dict[str, Any],
    rows: list[dict[str, Any]],
    clients: int = 4,
) -> None:
    """A finished run folder in the runner's format (for the selection tests)."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = {
        "run_id": run_dir.name,
        "config_hash": "x",
        "run_config": run_config,
        "config": AppConfig.from_flower(run_config).result_config(),
        "clients": clients,
        "seconds": 1.0,
        "complete": True,
    }
    (run_dir / "summary.json").write_text(json.dumps({"config": run_config, "run": record}))


def rows_of(vals: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [
        {"round": t + 1, "val_accuracy": v, "test_accuracy": te, "bytes_up": 10}
        for t, (v, te) in enumerate(vals)
    ]


# --------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*/*.toml")), ids=str)
def test_shipped_specs_parse_and_expand(path: Path) -> None:
    spec = load_spec(path)
    assert spec.source == path
    if spec.kind == "federated":
        runs = expand_runs(spec)
        assert len(runs) == len({r.run_id for r in runs})
        # every setting runs each of its lambda candidates (its grid's, or its counterpart's)
        # on every seed
        pairs: dict[str, set[tuple[Any, Any]]] = {}
        for r in runs:
            pairs.setdefault(r.setting_key, set()).add(
                (r.run_config["global-lr"], r.run_config["seed"])
            )
        for found in pairs.values():
            lambdas = {lam for lam, _ in found}
            assert found == {(lam, s) for lam in lambdas for s in spec.seeds}
        # issue 40: 3 seeds for the table's main mechanisms, fewer for the rest (the CPU budget)
        assert len(spec.seeds) >= 3 or path.name == "fashion-cpu-rest.toml"
    else:
        assert spec.mse is not None


def test_quick_and_paper_scale_match_the_brief() -> None:
    eps = load_spec(REPO / "experiments/quick/epsilon.toml")
    runs = expand_runs(eps)
    # (3 mechanisms x 7 eps + fedavg) settings x 3 lambdas x 3 seeds
    assert len(runs) == (3 * 7 + 1) * 3 * 3
    assert {r.clients for r in runs} == {10}
    assert {r.run_config["dataset"] for r in runs} == {"mnist"}
    paper = load_spec(REPO / "experiments/paper/mechanisms.toml")
    assert paper.lambda_grid == tuple(round(0.1 * k, 1) for k in range(1, 11))
    prun = expand_runs(paper)[0]
    assert (prun.clients, prun.run_config["num-rounds"], prun.run_config["batch-size"]) == (
        50,
        100,
        64,
    )
    assert (prun.run_config["d"], prun.run_config["gamma"]) == (5, 0.2)
    mechs = {r.run_config["mechanism"] for r in expand_runs(paper)}
    # The paper's Experiment 1: every mechanism it compares (the later ones are in the bits
    # frontier below).
    assert mechs == set(MECHANISMS) - {"pbm", "rqm", "imvu", "signsgd", "central-gaussian"}


@pytest.mark.parametrize(("task", "model"), [("femnist", "cnn"), ("shakespeare", "char-lstm")])
def test_paper_bits_frontier_specs_cover_every_private_mechanism_and_bit_budget(
    task: str, model: str
) -> None:
    spec = load_spec(REPO / f"experiments/paper/bits-frontier-{task}.toml")
    runs = expand_runs(spec)
    settings = {
        (
            r.run_config["mechanism"],
            r.run_config.get("pbm-trials"),
            r.run_config.get("rqm-levels"),
            r.run_config.get("imvu-bits"),
            r.run_config["epsilon"],
        )
        for r in runs
    }
    eps = (0.1, 0.3, 1.0, 3.0)
    want = {(m, None, None, None, e) for m in ("corbin", "ldpfl") for e in eps}
    want |= {("pbm", t, None, None, e) for t in (1, 2) for e in eps}
    want |= {("rqm", None, k, None, e) for k in (2, 3) for e in eps}
    want |= {("imvu", None, None, b, e) for b in (1, 2, 4) for e in eps}
    assert settings == want
    assert {(r.run_config["dataset"], r.run_config["model"]) for r in runs} == {(task, model)}
    assert {r.run_config["partitioner"] for r in runs} == {"natural"}


BAD_SPECS = [
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\n[bogus]\n",
        "unknown key(s) bogus",
    ),
    ("[experiment]\nname='x'\ncolour='red'\n", "experiment: unknown key(s) colour"),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\nepsilom=1.0\n",
        "did you mean 'epsilon'",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\nepsilon='a'\n",
        "expected a number",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\nepsilon=-1\n",
        "epsilon",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='nope'\n",
        "must be one of",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\nseed=3\n",
        "top-level `seeds",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\nglobal-lr=0.5\n",
        "lambda-grid",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism=['corbin']\n",
        "lists go in [grid]",
    ),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\n[grid]\nmechanism=['corbin','corbin']\n",
        "duplicate values",
    ),
    ("[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\n[grid]\nmechanism=[]\n", "empty"),
    ("[experiment]\ndescription='no name'\n", "experiment.name: missing"),
    ("[experiment]\nname='a b'\n", "folder name"),
    ("[experiment]\nname='x'\nbackend='simulation'\n", "unknown key(s) backend"),
    ("[experiment]\nname='x'\nkind='mse'\n[grid]\nmechanism=['corbin']\n", "configured in [mse]"),
    (
        "[experiment]\nname='x'\nkind='mse'\n[mse]\nepsilons=[1.0]\nheatmap-epsilons=[2.0]\n",
        "not in mse.epsilons",
    ),
    ("[experiment]\nname='x'\nkind='mse'\n[mse]\nsamples=5\n", "samples"),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=1\nclients=2\nmechanism='corbin'\n[plots]\n"
        "figures=['mse-heatmap']\n",
        "not available for kind",
    ),
    ("seeds=[1,1]\n[experiment]\nname='x'\n", "duplicate values"),
    ("[experiment]\nname='x'\nretries=-1\n", "experiment.retries"),
    ("seeds=[-1]\n[experiment]\nname='x'\n", "seeds"),
    ("lambda-grid=[0.0]\n[experiment]\nname='x'\n", "lambda-grid"),
    ("lambda-grid=[1.5]\n[experiment]\nname='x'\n", "lambda-grid"),
    ("[experiment]\nname='x'\n[base]\nclients=2\nmechanism='corbin'\n", "num-rounds: missing"),
    ("[experiment]\nname='x'\n[base]\nclients=2\nnum-rounds=2\n", "set `mechanism`"),
    ("[experiment]\nname='x'\n[base]\nclients=1\nnum-rounds=2\nmechanism='corbin'\n", ">= 2"),
    (
        "[experiment]\nname='x'\n[base]\nnum-rounds=2\nmechanism='corbin'\nd=true\n",
        "expected an integer",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_SPECS)
def test_invalid_specs_are_rejected_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from(text, source="bad.toml")
    assert message in str(info.value)
    assert str(info.value).startswith("bad.toml")


def test_invalid_toml_and_combination_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment\nname = 1")
    with pytest.raises(SpecError, match="invalid TOML"):
        load_spec(bad)
    # each value is valid alone; the combination is not (checked per run by AppConfig)
    spec = spec_from(
        "[experiment]\nname='x'\n[base]\nclients=4\nnum-rounds=1\nmechanism='corbin'\n"
        "min-clients=4\nclients-per-round=2\n"
    )
    with pytest.raises(SpecError, match="clients-per-round"):
        expand_runs(spec)
    no_clients = spec_from("[experiment]\nname='x'\n[base]\nnum-rounds=1\nmechanism='corbin'\n")
    with pytest.raises(SpecError, match=r"base\.clients: required"):
        expand_runs(no_clients)


def test_integer_literals_are_accepted_for_float_keys() -> None:
    spec = spec_from(
        "lambda-grid=[1]\n[experiment]\nname='x'\n[base]\nclients=2\nnum-rounds=1\n"
        "mechanism='corbin'\nepsilon=1\n"
    )
    assert spec.base["epsilon"] == 1.0 and isinstance(spec.base["epsilon"], float)
    assert spec.lambda_grid == (1.0,)


# --------------------------------------------------------------------------- sweep


def test_expansion_counts_order_and_dedup() -> None:
    spec = spec_from(TINY)
    runs = expand_runs(spec)
    # (2 mechanisms x 2 eps + fedavg) x 2 lambdas x 2 seeds
    assert len(runs) == 5 * 2 * 2
    first = runs[0].run_config
    assert (first["mechanism"], first["epsilon"], first["global-lr"], first["seed"]) == (
        "ldpfl",
        0.5,
        0.5,
        0,
    )
    assert [r.run_config["seed"] for r in runs[:4]] == [0, 1, 0, 1]
    assert all(r.run_config["min-clients"] == 4 for r in runs)
    assert all("out-dir" not in r.run_config for r in runs)
    # an extra grid that repeats a setting of the main grid adds nothing
    dup = spec_from(TINY + "\n[[extra-grid]]\nmechanism=['corbin']\nepsilon=[0.5]\n")
    assert len(expand_runs(dup)) == len(runs)


def test_run_ids_are_stable_and_identify_the_config() -> None:
    runs = expand_runs(spec_from(TINY))
    again = expand_runs(spec_from(TINY))
    assert [r.run_id for r in runs] == [r.run_id for r in again]
    rid = runs[0].run_id
    assert rid.startswith("ldpfl-eps0.5-d5-p0-n4-lr0.5-s0-")
    # a different layout (grid order, extra values) keeps the ids of the runs already there
    other = TINY.replace("epsilon = [0.5, 1.0]", "epsilon = [1.0, 0.5, 3.0]").replace(
        'mechanism = ["ldpfl", "corbin"]', 'mechanism = ["corbin", "ldpfl"]'
    )
    ids_other = {r.run_id for r in expand_runs(spec_from(other))}
    assert {r.run_id for r in runs} < ids_other
    # any change of what the run computes changes the id
    cfg = dict(runs[0].config)
    assert make_run_id(cfg, 4) == rid
    assert make_run_id({**cfg, "batch-size": 7}, 4) != rid
    assert make_run_id(cfg, 5) != rid


def ids_of(text: str, **base: object) -> list[str]:
    """Run ids of ``text`` with ``base`` keys added to its [base] table."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())
    return [r.run_id for r in expand_runs(spec_from(text.replace("d = 5\n", "d = 5\n" + extra)))]


def test_a_run_is_addressed_by_what_it_computes_not_by_how_the_spec_spells_it() -> None:
    """The id hashes the result config: spelling out a default, or setting a key that cannot
    change the result (declared on the AppConfig fields), keeps the ids; anything else does not."""
    plain = ids_of(TINY)
    assert AppConfig().delta == 1e-5 and AppConfig().dropout_prob == 0.0
    assert ids_of(TINY, delta=1e-5, **{"dropout-prob": 0.0}) == plain
    assert ids_of(TINY, **{"poll-interval": 0.5, "data-dir": "elsewhere", "device": "cpu"}) == plain
    assert not set(ids_of(TINY, delta=1e-6)) & set(plain)
    # update-radius is read only where the update is quantized
    layer = TINY.replace("d = 5\n", 'd = 5\nrange-mode = "layer"\n')
    assert ids_of(layer, **{"update-radius": 0.5}) == ids_of(layer)
    assert not set(ids_of(TINY, **{"update-radius": 0.5})) & set(plain)
    assert AppConfig.execution_keys().isdisjoint(expand_runs(spec_from(TINY))[0].config)


def test_a_run_made_for_one_experiment_is_found_by_every_other(tmp_path: Path) -> None:
    app = fake_app_dir(tmp_path)
    results = tmp_path / "results"
    first = spec_from(TINY)
    ex.run(first, results, app_dir=app, backend=FakeBackend(), progress=False)
    # same base spelled otherwise, a wider epsilon grid: only the new epsilon is run
    second = spec_from(
        TINY.replace('name = "tiny"', 'name = "wider"')
        .replace("epsilon = [0.5, 1.0]", "epsilon = [0.5, 1.0, 3.0]")
        .replace("d = 5\n", "d = 5\ndelta = 1e-5\npoll-interval = 0.5\n")
    )
    backend = FakeBackend()
    out = ex.run(second, results, app_dir=app, backend=backend, progress=False)
    new = {r.run_id for r in expand_runs(second)} - {r.run_id for r in expand_runs(first)}
    assert len(new) == 8 and sorted(backend.calls) == sorted(new)
    assert (out.executed, out.skipped) == (8, 20)
    # both experiments report from the one pool, every run of theirs included
    with (results / second.name / "runs.csv").open(newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 28
    assert sorted(p.name for p in results.iterdir()) == ["runs", "tiny", "wider"]
    # --fresh removes an experiment's outputs and its runs, not the other experiment's
    ex.remove_experiment(first, results)
    assert {s for _, s in ex.plan(first, results)} == {RunState.MISSING}
    assert [s for _, s in ex.plan(second, results)].count(RunState.DONE) == 8


def test_the_app_gets_the_whole_result_config(tmp_path: Path) -> None:
    """What a run computes does not depend on the app's defaults: the runner hands it every key
    of the result config, the spec's keys on top."""
    seen: list[dict[str, Any]] = []

    class Recording(FakeBackend):
        def __call__(self, run: Run, run_config: Any, out_dir: Path, **kw: Any) -> Submission:
            seen.append(dict(run_config))
            return super().__call__(run, run_config, out_dir, **kw)

    run = expand_runs(spec_from(TINY.replace("d = 5\n", "d = 5\npoll-interval = 0.5\n")))[0]
    execute_run(run, Recording(), tmp_path / "r", experiment="tiny", timeout_s=10)
    assert seen[0] == {**run.config, **run.run_config}
    assert seen[0]["poll-interval"] == 0.5 and seen[0]["lr"] == AppConfig().lr
    record = json.loads((tmp_path / "r" / "summary.json").read_text())["run"]
    assert record["config"] == dict(run.config)


# --------------------------------------------------------------------------- resume


def test_resume_skips_done_runs_and_redoes_partial_ones(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    app = fake_app_dir(tmp_path)
    results = tmp_path / "results"
    backend = FakeBackend()
    out = ex.run(spec, results, app_dir=app, backend=backend, progress=False)
    assert (out.total, out.executed, out.skipped, out.failed) == (20, 20, 0, {})
    assert len(backend.calls) == 20
    states = ex.plan(spec, results)
    assert all(s is RunState.DONE for _, s in states)

    # second invocation: nothing to do
    backend2 = FakeBackend()
    out2 = ex.run(spec, results, app_dir=app, backend=backend2, progress=False)
    assert backend2.calls == [] and out2.skipped == 20

    # make three runs partial in different ways: no summary, a torn summary, missing rounds
    r0, r1, r2 = (r for r, _ in states[:3])
    pool = results / "runs"
    (pool / r0.run_id / "summary.json").unlink()
    (pool / r1.run_id / "summary.json").write_text('{"run": {"run_id": ')
    metrics = pool / r2.run_id / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))
    assert [run_state(pool / r.run_id, r) for r in (r0, r1, r2)] == [RunState.PARTIAL] * 3
    backend3 = FakeBackend()
    out3 = ex.run(spec, results, app_dir=app, backend=backend3, progress=False)
    assert sorted(backend3.calls) == sorted([r0.run_id, r1.run_id, r2.run_id])
    assert out3.executed == 3 and out3.skipped == 17
    assert all(s is RunState.DONE for _, s in ex.plan(spec, results))


def test_failed_and_truncated_runs_are_recorded_and_retried(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    app = fake_app_dir(tmp_path)
    results = tmp_path / "results"
    ids = [r.run_id for r in expand_runs(spec)]
    backend = FakeBackend(fail={ids[0]}, truncate={ids[1]}, flaky={ids[2]})
    out = ex.run(spec, results, app_dir=app, backend=backend, progress=False)
    assert set(out.failed) == {ids[0], ids[1]}
    # retries = 1 (default): each failing run is attempted twice, the flaky one succeeds
    assert backend.calls[:6] == [ids[0], ids[0], ids[1], ids[1], ids[2], ids[2]]
    assert out.executed == 18
    assert "boom" in out.failed[ids[0]] and "1 rows, expected 4" in out.failed[ids[1]]
    run_dir = results / "runs"
    assert json.loads((run_dir / ids[0] / "failed.json").read_text())["reason"] == "boom"
    assert not (run_dir / ids[0] / "summary.json").exists()
    assert "INCOMPLETE (18/20 runs)" in (results / "tiny" / "report.md").read_text()
    # the next invocation retries exactly the failed ones
    backend2 = FakeBackend()
    out2 = ex.run(spec, results, app_dir=app, backend=backend2, progress=False)
    assert sorted(backend2.calls) == sorted(ids[:2]) and not out2.failed
    assert not (run_dir / ids[0] / "failed.json").exists()


class InterruptingBackend(FakeBackend):
    """Raises KeyboardInterrupt (Ctrl-C) in the middle of its ``n``-th run."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __call__(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        if len(self.calls) + 1 == self.n:
            self.calls.append(run.run_id)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "metrics.jsonl").write_text('{"round": 1}\n')  # a torn, partial run
            raise KeyboardInterrupt
        return super().__call__(run, run_config, out_dir, timeout_s=timeout_s, on_round=on_round)


def test_interrupt_then_resume(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    app = fake_app_dir(tmp_path)
    results = tmp_path / "results"
    backend = InterruptingBackend(3)
    out = ex.run(spec, results, app_dir=app, backend=backend, progress=False)
    assert out.interrupted and out.executed == 2
    states = [s for _, s in ex.plan(spec, results)]
    assert states[:2] == [RunState.DONE] * 2
    assert states[2] is RunState.PARTIAL and set(states[3:]) == {RunState.MISSING}
    # the report of what is done was still written
    assert "INCOMPLETE (2/20 runs)" in (results / "tiny" / "report.md").read_text()
    backend2 = FakeBackend()
    out2 = ex.run(spec, results, app_dir=app, backend=backend2, progress=False)
    assert out2.skipped == 2 and out2.executed == 18 and not out2.interrupted
    assert backend2.calls[0] == backend.calls[2]


def test_max_runs_and_app_key_check(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    app = fake_app_dir(tmp_path)
    backend = FakeBackend()
    out = ex.run(spec, tmp_path / "r", app_dir=app, backend=backend, progress=False, max_runs=3)
    assert out.executed == 3 and len(backend.calls) == 3
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    (narrow / "pyproject.toml").write_text(
        '[tool.flwr.app]\npublisher="t"\n[tool.flwr.app.config]\nmechanism="corbin"\n'
    )
    with pytest.raises(ValueError, match=r"does not declare .*epsilon"):
        check_app_accepts(narrow, {"mechanism", "epsilon"})
    with pytest.raises(ValueError, match="does not declare"):
        ex.run(spec, tmp_path / "r2", app_dir=narrow, backend=backend, progress=False)


def test_summary_is_written_atomically_with_the_run_record(tmp_path: Path) -> None:
    run = expand_runs(spec_from(TINY))[0]
    run_dir = tmp_path / "runs" / run.run_id
    (run_dir / "stale").mkdir(parents=True)  # a partial run's leftovers are wiped
    summary = execute_run(run, FakeBackend(), run_dir, experiment="tiny", timeout_s=10)
    assert not (run_dir / "stale").exists()
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == summary
    assert on_disk["run"]["complete"] is True
    assert on_disk["run"]["config_hash"] == run.config_hash
    assert on_disk["run"]["host"] == host_record()  # the machine it ran on
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 4
    assert not list(run_dir.glob(".*.tmp"))
    assert run_state(run_dir, run) is RunState.DONE
    # the record must match the run it is checked against
    other = expand_runs(spec_from(TINY))[1]
    assert run_state(run_dir, other) is RunState.PARTIAL


def test_relative_data_dir_is_resolved_for_the_app(tmp_path: Path) -> None:
    cfg = {"data-dir": "data/cifar", "epsilon": 1.0}
    out = app_run_config(cfg, cwd=tmp_path)
    assert out["data-dir"] == str((tmp_path / "data/cifar").resolve())
    assert app_run_config({"data-dir": ""}, cwd=tmp_path)["data-dir"] == ""
    assert cfg["data-dir"] == "data/cifar"  # the run's identity keeps the spec value


# --------------------------------------------------------------------------- selection rule


def test_checkpoint_round_is_chosen_on_validation_never_on_test() -> None:
    # test accuracy peaks at round 2 (0.99), validation at round 4: round 4 is reported
    rows = rows_of([(0.50, 0.60), (0.60, 0.99), (0.70, 0.70), (0.80, 0.75), (0.79, 0.90)])
    sel = select_round(rows)
    assert sel == Selection(round=4, val_accuracy=0.80, test_accuracy=0.75)
    # ties: the earliest round
    assert select_round(rows_of([(0.5, 0.1), (0.9, 0.2), (0.9, 0.3)])).round == 2
    with pytest.raises(ValueError):
        select_round([])
    with pytest.raises(ValueError, match="finite val_accuracy"):
        select_round([{"round": 1, "val_accuracy": None, "test_accuracy": 0.5}])


def test_lambda_is_chosen_on_validation_and_test_is_read_at_that_point(tmp_path: Path) -> None:
    base = {"mechanism": "corbin", "epsilon": 0.5, "num-rounds": 3}
    # lambda=0.5: best test (0.95) but worse validation; lambda=1.0: better validation
    cases = {
        (0.5, 0): [(0.60, 0.95), (0.62, 0.90), (0.61, 0.93)],
        (0.5, 1): [(0.58, 0.94), (0.63, 0.91), (0.60, 0.92)],
        (1.0, 0): [(0.70, 0.70), (0.75, 0.72), (0.74, 0.80)],
        (1.0, 1): [(0.72, 0.71), (0.74, 0.74), (0.76, 0.73)],
    }
    results = []
    for (lam, seed), vals in cases.items():
        d = tmp_path / f"r-{lam}-{seed}"
        write_run(d, {**base, "global-lr": lam, "seed": seed}, rows_of(vals))
        results.append(load_run(d))
    (group,) = group_results(results)
    assert group.global_lr == 1.0
    assert group.lambda_scores[0.5].mean == pytest.approx((0.62 + 0.63) / 2)
    assert group.lambda_scores[1.0].mean == pytest.approx((0.75 + 0.76) / 2)
    # seed 0 checkpoint = round 2 (test 0.72), seed 1 = round 3 (test 0.73)
    assert [r.selection.round for r in group.runs] == [2, 3]
    assert group.test.mean == pytest.approx((0.72 + 0.73) / 2)
    assert group.test.std == pytest.approx(np.std([0.72, 0.73], ddof=1))
    assert group.final_test.mean == pytest.approx((0.80 + 0.73) / 2)
    best_test_anywhere = max(te for vals in cases.values() for _, te in vals)
    assert group.test.mean < best_test_anywhere
    # ties between lambdas go to the larger lambda
    tie = [r for r in results if r.seed == 0]
    tie_copy = [
        RunResult(**{**r.__dict__, "selection": Selection(1, 0.5, 0.5)})  # type: ignore[arg-type]
        for r in tie
    ]
    assert choose_lambda(tie_copy)[0] == 1.0


def test_a_run_with_an_invalid_recorded_config_is_not_a_finished_run(tmp_path: Path) -> None:
    """A tampered or foreign ``summary.json`` (d out of range) is refused by name."""
    write_run(
        tmp_path / "bad", {"mechanism": "ldpfl", "global-lr": 1.0, "seed": 0}, rows_of([(0.5, 0.5)])
    )
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    summary["run"]["config"] = {**summary["run"]["config"], "d": 99}
    (tmp_path / "bad" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="recorded result config is not valid"):
        load_run(tmp_path / "bad")
    del summary["run"]["config"]  # a folder of the per-experiment layout
    (tmp_path / "bad" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="no result config"):
        load_run(tmp_path / "bad")


def test_stat_formatting() -> None:
    assert Stat.of([0.5, 0.7]).fmt() == f"60.00 ± {100 * np.std([0.5, 0.7], ddof=1):.2f}"
    assert Stat.of([0.5]).fmt() == "50.00 (n=1)"
    assert Stat.of([]).fmt() == "—"
    assert Stat.of([None, float("nan"), 1.0]).n == 1  # type: ignore[list-item]


# --------------------------------------------------------------------------- writers


def test_csv_figures_and_report_from_contract_files(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    app = fake_app_dir(tmp_path)
    results = tmp_path / "results"
    out = ex.run(spec, results, app_dir=app, backend=FakeBackend(), progress=False)
    root = results / "tiny"
    with (root / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 20
    required = {
        "mechanism", "epsilon", "d", "dropout", "clients", "seed", "global_lr", "test_accuracy",
        "final_test_accuracy", "eps_update", "uplink_bytes", "seconds", "selected_round",
        "selected_by",
    }  # fmt: skip
    assert required <= set(rows[0])
    assert {r["selected_by"] for r in rows} == {"val_accuracy"}
    # per setting exactly the seeds of one lambda are marked selected
    selected = [r for r in rows if r["lambda_selected"] == "true"]
    assert len(selected) == 5 * 2
    for r in rows:
        run_dir = results / "runs" / r["run_id"]
        metrics = read_metrics(run_dir / "metrics.jsonl")
        sel = select_round(metrics)
        assert int(r["selected_round"]) == sel.round
        assert float(r["test_accuracy"]) == pytest.approx(sel.test_accuracy)
        assert float(r["final_test_accuracy"]) == pytest.approx(metrics[-1]["test_accuracy"])
        assert float(r["uplink_bytes"]) == 4 * 4000
        expected = privacy_report(
            r["mechanism"], float(r["epsilon"]), 1e-5, FAKE_M, 4, d=5, gamma=0.2, n=4, r=0.1
        )
        if r["mechanism"] == "fedavg":
            assert r["eps_update"] == "" and r["eps_run"] == ""
        else:
            assert float(r["eps_p"]) == float(r["epsilon"])
            view_a = expected["threat_models"]["A"]
            assert float(r["eps_update"]) == pytest.approx(view_a["per_update"]["eps"])
            assert float(r["eps_run"]) == pytest.approx(view_a["all_rounds"]["eps"])
            assert float(r["eps_run"]) > float(r["eps_update"]) > float(r["eps_p"])
        if r["mechanism"] == "corbin":
            assert r["pair_eps_update"] == ""  # no finite eps for the pair-joint view
            assert 0 < float(r["pair_delta_lower_bound"]) <= 1
    with (root / "groups.csv").open() as fh:
        groups = list(csv.DictReader(fh))
    assert len(groups) == 5 and {g["seeds"] for g in groups} == {"2"}
    for name in spec.figures:
        png = root / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
    report = (root / "report.md").read_text()
    assert SELECTION_RULE in report
    assert "![accuracy-vs-epsilon](figures/accuracy-vs-epsilon.png)" in report
    assert " ± " in report and "## Privacy" in report and "A: eavesdropper on one uplink" in report
    assert "— (no DP)" in report  # fedavg: no eps_p
    assert "**no DP** (paired bits are not private against it); one update: δ ≥" in report
    assert "corbin-fl experiment run" in report
    # fake accuracies: corbin > ldpfl by ~20 points; fedavg ~3 points above corbin at eps 1,
    # which 2 seeds (Welch df ~1) cannot place below the target's 5 points
    assert [t.status for t in out.targets] == ["PASS", "PASS", "not resolved"]
    assert "**PASS**" in report and "**not resolved**" in report and "CorBin 8" in report
    assert TARGET_RULE in report and "95% CI [" in report
    assert "## Discussion" not in report
    # a hand-written discussion next to the report is embedded, and kept on regeneration
    (root / "discussion.md").write_text("Why the figure looks like this.\n")
    ex.finalize(spec, results)
    report = (root / "report.md").read_text()
    assert "## Discussion" in report and "Why the figure looks like this." in report
    assert (root / "discussion.md").read_text() == "Why the figure looks like this.\n"


@pytest.mark.parametrize(
    ("value", "text"),
    [(1263.4, "1,263"), (2000.0, "2,000"), (99.94, "99.9"), (23.456, "23.5"), (0.5, "0.5")],
)
def test_seconds_and_megabytes_a_run_print_whole_units_from_100(value: float, text: str) -> None:
    """The results table's ``s / run`` and ``uplink MB / run``: ``1,263``, never ``1.26e+03``."""
    assert _amount(value) == text
    assert _amount(math.nan) == "—"


def _seeded_groups(tmp_path: Path, settings: list[tuple[str, float, list[float]]]) -> list[Any]:
    """Lambda-selected groups of ``(mechanism, eps, test accuracy per seed)`` (one run per
    seed, validation accuracy = test accuracy)."""
    runs = []
    for mech, eps, accs in settings:
        for seed, acc in enumerate(accs):
            d = tmp_path / f"{mech}-{eps}-s{seed}"
            cfg = {"mechanism": mech, "epsilon": eps, "global-lr": 1.0, "seed": seed}
            write_run(d, cfg, rows_of([(acc, acc)]))
            runs.append(load_run(d))
    return group_results(runs)


def test_targets_pass_miss_not_resolved_and_not_applicable(tmp_path: Path) -> None:
    groups = _seeded_groups(
        tmp_path,
        [
            ("corbin", 0.5, [0.618, 0.62, 0.622]),
            ("ldpfl", 0.5, [0.599, 0.60, 0.601]),  # beaten by 2 points: resolved, but < 5
            ("corbin", 1.0, [0.698, 0.70, 0.702]),
            ("ldpfl", 1.0, [0.719, 0.72, 0.721]),  # LDP-FL 2 points ahead: resolved
        ],
    )
    t = federated_targets(groups)
    assert [x.status for x in t] == ["MISS", "MISS", "N/A"]
    assert "eps=0.5: CorBin 62.00 ± 0.20 - LDP-FL 60.00 ± 0.10 = +2.00 points" in t[0].detail
    assert "95% CI [" in t[0].detail and ": PASS; eps=1: " in t[0].detail
    assert t[0].detail.endswith(": MISS")
    assert "+2.00 points (SE 0.13, 95% CI [" in t[1].detail
    # the same means with noisier seeds: the 5-point target is then not resolved
    noisy = _seeded_groups(
        tmp_path / "noisy",
        [("corbin", 0.5, [0.52, 0.62, 0.72]), ("ldpfl", 0.5, [0.50, 0.60, 0.70])],
    )
    t = federated_targets(noisy)
    assert [x.status for x in t] == ["not resolved", "not resolved", "N/A"]
    # FedAvg 10 points ahead of CorBin at eps 1: resolved above the 5 points allowed
    fedavg = _seeded_groups(tmp_path / "fedavg", [("fedavg", 1.0, [0.79, 0.80, 0.81])])
    assert federated_targets([*groups, *fedavg])[2].status == "MISS"
    close = _seeded_groups(tmp_path / "close", [("fedavg", 1.0, [0.719, 0.72, 0.721])])
    assert federated_targets([*groups, *close])[2].status == "PASS"  # 2 points, resolved
    # one seed per setting: no interval, never resolved
    single = _seeded_groups(tmp_path / "single", [("corbin", 0.5, [0.90]), ("ldpfl", 0.5, [0.10])])
    t = federated_targets(single)
    assert t[0].status == "not resolved" and "no interval (one seed)" in t[0].detail


def test_target_rule_is_welchs_interval_at_95_percent() -> None:
    from scipy import stats as st

    a, b = [0.95, 0.955, 0.9455], [0.94, 0.93, 0.9659]
    diff = Difference.welch(Stat.of(a), Stat.of(b))
    want = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff.low == pytest.approx(100 * want.low) and diff.high == pytest.approx(100 * want.high)
    assert diff.value == pytest.approx(100 * (np.mean(a) - np.mean(b)))
    # issue 26's case: 95.03 ± 0.55 vs 94.53 ± 1.20 over 3 seeds each is not resolved
    case = Difference.welch(Stat(0.9503, 0.0055, 3), Stat(0.9453, 0.0120, 3))
    assert case.low < 0.0 < case.high
    assert verdict(case, 0.0, "above") == "not resolved"
    assert verdict(case, -5.0, "above") == "PASS" and verdict(case, 5.0, "above") == "MISS"
    assert verdict(case, 5.0, "below") == "PASS" and verdict(case, -5.0, "below") == "MISS"
    # more seeds of the same spread resolve it
    assert verdict(Difference.welch(Stat(0.9503, 0.0055, 30), Stat(0.9453, 0.0120, 30)),
                   0.0, "above") == "PASS"  # fmt: skip
    assert verdict(Difference.welch(Stat(0.9, 0.01, 1), Stat(0.1, 0.01, 3)), 0.0, "above") == (
        "not resolved"
    )
    same = Difference.welch(Stat(0.75, 0.0, 3), Stat(0.5, 0.0, 3))  # no spread: a point
    assert (same.low, same.high) == (25.0, 25.0)
    assert verdict(same, 25.0, "above") == "not resolved"  # on the threshold
    assert verdict(same, 24.0, "above") == "PASS"
    ratio = Difference.normal(0.16, 0.01)
    assert ratio.high == pytest.approx(0.16 + 1.959964 * 0.01)
    assert verdict(ratio, 0.5, "below") == "PASS"


def test_figure_guarantees_name_the_threat_models_the_accountant_gives(tmp_path: Path) -> None:
    """Every guarantee class claims DP against exactly the threat models (of A and B) for which
    the accountant's report of each of its mechanisms says ``dp``, in its legend entry, its bar
    label and its bar legend alike (central DP: against C)."""
    setting = {"epsilon": 1.0, "delta": 1e-5}
    for mech in MECHANISMS:
        kind = plots.guarantee_kind(mech)
        assert kind is not None
        m = registry.get(mech)
        report = privacy_report(
            mech,
            1.0,
            1e-5,
            1000,
            10,
            d=5 if m.pairs else None,
            gamma=0.2 if mech == "augcorbin" else None,
            n=10,
            r=0.01,
            delta_u=1e-5 if mech == "fedcad" else None,
        )
        tm = report["threat_models"]
        assert {k for k in "AB" if tm[k]["dp"]} == plots.DP_AGAINST[kind], mech
        for label in (
            plots.SHORT_KIND[kind],
            _flat(plots.guarantee({**setting, "mechanism": mech}).label),
            kind,
        ):
            claimed, _, denied = label.replace("A-D", "A, B, C, D").partition("no DP")
            letters = {k for k in "AB" if re.search(rf"\b{k}\b", claimed)}
            assert letters == plots.DP_AGAINST[kind], (mech, label)
            assert {k for k in "AB" if re.search(rf"\b{k}\b", denied)} == set("AB") - letters
        if mech == "central-gaussian":
            assert tm["C"]["dp"] and "vs C" in plots.SHORT_KIND[kind]
    assert set(plots.THREAT_MODELS) == set(THREAT_MODELS)
    assert all(name in plots.THREAT_NOTE for name in THREAT_MODELS.values())


def test_plot_accuracy_vs_requires_the_key(tmp_path: Path) -> None:
    d = tmp_path / "r"
    run_config = {"mechanism": "corbin", "global-lr": 1.0, "seed": 0}
    write_run(d, run_config, rows_of([(0.5, 0.5)]), clients=None)  # type: ignore[arg-type]
    groups = group_results([load_run(d)])
    with pytest.raises(ValueError, match="no run sets 'clients'"):
        plots.accuracy_vs_figure(groups, "clients", [])


# --------------------------------------------------------------------------- figure texts


def _texts(fig: Any) -> tuple[str, str]:
    """A figure's title (suptitle) and caption (supxlabel, or the x-label of an axes)."""
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    caption = fig._supxlabel.get_text() if fig._supxlabel is not None else ""
    return title, caption


def _legend_texts(fig: Any) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _mechanism_groups(tmp_path: Path, mechanisms: tuple[str, ...]) -> list[Any]:
    """Lambda-selected groups of two seeds per mechanism at eps = 5, delta = 1e-5 (real
    ``load_run`` on runner-format folders; accuracies spread by seed)."""
    runs = []
    for i, mech in enumerate(mechanisms):
        for seed in (0, 1):
            acc = 0.5 + 0.04 * i + 0.02 * seed
            d = tmp_path / f"{mech}-s{seed}"
            cfg = {
                "mechanism": mech, "epsilon": 5.0, "delta": 1e-5, "d": 5, "num-rounds": 2,
                "dataset": "mnist", "global-lr": 1.0, "seed": seed, "range-mode": "update",
            }  # fmt: skip
            write_run(d, cfg, rows_of([(acc - 0.1, acc - 0.1), (acc, acc)]), clients=10)
            runs.append(load_run(d))
    return group_results(runs)


def test_figures_read_each_settings_guarantee_from_its_summary(tmp_path: Path) -> None:
    """The class a figure draws is the one the accountant's report in ``summary.json`` states:
    for every mechanism the report's class is its registered one, and a setting whose report
    says otherwise is drawn as its report says (the mechanism only without a report)."""
    for mech in MECHANISMS:
        m = registry.get(mech)
        report = privacy_report(
            mech, 1.0, 1e-5, 1000, 10, d=5 if m.pairs else None,
            gamma=0.2 if mech == "augcorbin" else None, n=10, r=0.01,
            delta_u=1e-5 if mech == "fedcad" else None,
        )  # fmt: skip
        assert plots.report_kind(report) == plots.guarantee_kind(mech), mech
    assert plots.report_kind(None) is None and plots.report_kind({"error": "x"}) is None
    (corbin,) = _mechanism_groups(tmp_path, ("corbin",))
    assert plots.group_kind(corbin) == plots.PAIRED_KIND  # no report: its mechanism's class
    ldp = privacy_report("ldpfl", 5.0, 1e-5, 1000, 2, n=10, r=0.01)
    said = dataclasses.replace(corbin.runs[0], summary={**corbin.runs[0].summary, "privacy": ldp})
    corbin = dataclasses.replace(corbin, runs=(said, *corbin.runs[1:]))
    assert plots.group_kind(corbin) == plots.LDP_KIND
    fig = plots.accuracy_vs_round_figure([corbin], ["mechanism"])
    assert _legend_texts(fig) == [f"corbin (λ=1) [{plots.SHORT_KIND[plots.LDP_KIND]}]"]
    bars = plots.accuracy_bar_figure([corbin], ["mechanism"])
    assert plots.LDP_KIND in _legend_texts(bars)


def test_outside_legends_sit_right_of_the_axes_inside_the_figure(tmp_path: Path) -> None:
    """A single-panel figure's legend (``loc="outside right center"``) lies right of the axes,
    below the title and inside the figure, and the axes keep their width."""
    groups = _mechanism_groups(tmp_path, MECHANISMS)
    fig = plots.accuracy_vs_round_figure(groups, ["mechanism"], title="All mechanisms")
    (ax,) = fig.axes
    (legend,) = fig.legends
    fig.draw_without_rendering()
    box, axes, title = (
        a.get_window_extent().transformed(fig.dpi_scale_trans.inverted())
        for a in (legend, ax, fig._suptitle)
    )
    assert axes.x1 <= box.x0 and box.x1 <= fig.get_figwidth(), (axes, box)
    assert box.y0 >= 0.0 and box.y1 <= title.y0, (box, title)
    assert axes.width >= 0.6 * 5.0  # new_figure's 5 in, less the y-axis labels
    assert len(legend.get_texts()) == len(MECHANISMS)


def test_every_mechanism_has_a_stated_guarantee() -> None:
    for mech in MECHANISMS:
        assert plots.guarantee_kind(mech) is not None, mech
    setting = {"epsilon": 5.0, "delta": 1e-5}
    labels = {m: plots.guarantee({**setting, "mechanism": m}) for m in MECHANISMS}
    for mech in ("corbin", "augcorbin"):
        assert labels[mech].kind == plots.PAIRED_KIND
        assert _flat(labels[mech].label) == "ε_p=5/param. vs A only; no DP vs B"
    for mech in ("ldpfl", "laplace", "ternary"):
        assert labels[mech] == plots.Guarantee(plots.LDP_KIND, "ε_p=5/param.\nvs A, B")
    assert labels["gaussian"].kind == plots.APPROX_LDP_KIND
    assert _flat(labels["gaussian"].label) == "(ε_p=5, δ=1e-05) per param. vs A, B"
    assert labels["fedcad"].kind == plots.UPDATE_KIND
    assert _flat(labels["fedcad"].label) == "(ε=5, δ=1e-05) per update vs A, B"
    assert _flat(labels["central-gaussian"].label) == "(ε=5, δ=1e-05) central vs C; no DP vs A, B"
    for mech in ("fedavg", "cq"):
        assert labels[mech] == plots.Guarantee(plots.NO_DP_KIND, "no DP vs A-D")
    assert plots.guarantee({"mechanism": "signsgd"}).kind == plots.NO_DP_KIND
    with pytest.raises(ValueError, match="no privacy guarantee is known for mechanism 'sgd'"):
        plots.guarantee({"mechanism": "sgd", "epsilon": 1.0})
    with pytest.raises(ValueError, match=r"'fedcad'.*no finite 'delta'"):
        plots.guarantee({"mechanism": "fedcad", "epsilon": 1.0})
    with pytest.raises(ValueError, match="names no mechanism"):
        plots.guarantee({"epsilon": 1.0})


def test_mechanism_bar_chart_marks_each_bars_guarantee(tmp_path: Path) -> None:
    groups = _mechanism_groups(tmp_path, MECHANISMS)
    fig = plots.accuracy_bar_figure(groups, ["mechanism"], title="All mechanisms")
    (ax,) = fig.axes
    ticks = {t.get_text().split("\n")[0]: _flat(t.get_text()) for t in ax.get_xticklabels()}
    assert set(ticks) == set(MECHANISMS)
    assert ticks["corbin"] == "corbin ε_p=5/param. vs A only; no DP vs B"
    assert ticks["ldpfl"] == "ldpfl ε_p=5/param. vs A, B"
    assert ticks["gaussian"] == "gaussian (ε_p=5, δ=1e-05) per param. vs A, B"
    assert ticks["fedcad"] == "fedcad (ε=5, δ=1e-05) per update vs A, B"
    assert ticks["fedavg"] == "fedavg no DP vs A-D" and ticks["cq"] == "cq no DP vs A-D"
    legend = _legend_texts(fig)
    for kind in plots.GUARANTEE_COLORS:
        assert kind in legend
    assert "test acc. at val-selected round" in legend and "final-round test acc." in legend
    # each bar pair has its guarantee's colour; bars of one guarantee are side by side
    from matplotlib.colors import to_rgb

    order = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    kinds = [plots.guarantee_kind(m) for m in order]
    assert kinds == sorted(kinds, key=list(plots.GUARANTEE_COLORS).index)
    bars = ax.patches
    assert len(bars) == 2 * len(MECHANISMS)
    for k, mech in enumerate(order):
        want = to_rgb(plots.GUARANTEE_COLORS[plots.guarantee_kind(mech)])  # type: ignore[index]
        assert to_rgb(bars[k].get_facecolor()) == pytest.approx(want)
        assert to_rgb(bars[len(order) + k].get_facecolor()) == pytest.approx(want)
    title, _ = _texts(fig)
    caption = ax.get_xlabel()
    assert title.startswith(
        "Test accuracy per mechanism at the val-selected and the final round\n"
        "experiment: All mechanisms\nfixed: "
    )
    flat_title = _flat(title)
    assert "clients=10" in flat_title and "rounds=2" in flat_title and "d=5" in flat_title
    assert (
        "ε=5 (per parameter; central-gaussian: central, all rounds; fedcad: per update)"
        in flat_title
    )
    assert "δ=1e-05" in flat_title
    assert "± 1 sample std (ddof=1) over 2 seeds (0, 1)" in _flat(caption)
    assert plots.THREAT_NOTE in _flat(caption)
    assert "not one unit" in _flat(caption)
    fig.savefig(tmp_path / "bar.png")  # lays out and draws without error
    with pytest.raises(ValueError, match="no privacy guarantee is known"):
        bad = _mechanism_groups(tmp_path / "bad", ("corbin",))
        bad[0] = dataclasses.replace(bad[0], setting={**bad[0].setting, "mechanism": "x"})
        plots.accuracy_bar_figure(bad, ["mechanism"])


def test_line_figures_state_settings_error_bars_references_and_y_range(tmp_path: Path) -> None:
    spec = spec_from(TINY)
    results = tmp_path / "results"
    ex.run(spec, results, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(),
                     progress=False)  # fmt: skip
    runs = ex.load_finished(spec, results)
    groups = group_results(runs)
    keys = ["mechanism", "epsilon"]
    fig = plots.accuracy_vs_figure(groups, "epsilon", keys, title="Accuracy vs eps_p")
    title, caption = _texts(fig)
    assert title.startswith(
        "Test accuracy vs the per-parameter budget ε_p\nexperiment: Accuracy vs eps_p\nfixed: "
    )
    for part in ("clients=4", "rounds=4", "d=5", "dataset=mnist", "model=cnn"):
        assert part in _flat(title), (part, title)
    assert "epsilon" not in _flat(title).split("fixed: ")[1]  # it varies: not a fixed setting
    assert "error bars: ± 1 sample std (ddof=1) over 2 seeds (0, 1)" in _flat(caption)
    assert f"y-axis spans ≥ {plots.MIN_Y_SPAN:g} points" in _flat(caption)
    assert plots.THREAT_NOTE in _flat(caption)
    legend = _legend_texts(fig)
    assert legend == [
        "ldpfl [ε_p-LDP/param. vs A, B]",
        "corbin [ε_p/param. vs A only; no DP vs B]",
        "fedavg [no DP vs A-D]: reference, not swept over epsilon (band ± 1 std)",
    ]
    (ax,) = fig.axes
    lo, hi = ax.get_ylim()
    stds = [100 * g.test.std for g in groups]
    assert hi - lo >= max(plots.MIN_Y_SPAN, plots.STD_SPAN * max(stds)) - 1e-9
    assert lo >= 0.0 and hi <= 100.0
    # every panel of the per-round figure shares one honest y-axis; bands are named
    fig = plots.accuracy_vs_round_figure(groups, keys, title="per round")
    round_title, caption = _texts(fig)
    assert "fixed: " in round_title
    assert "bands: ± 1 sample std (ddof=1) over 2 seeds" in _flat(caption)
    # two figures of one experiment (one description) never share a title
    assert round_title.startswith("Test accuracy per round\nexperiment: per round\n")
    assert round_title.split("\n")[0] != title.split("\n")[0]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len({ax.get_ylim() for ax in visible}) == 1
    lo, hi = visible[0].get_ylim()
    assert hi - lo >= plots.MIN_Y_SPAN - 1e-9
    with pytest.raises(ValueError, match="no settings to plot"):
        plots.accuracy_vs_round_figure([], keys)


def test_a_flat_sweep_is_drawn_flat(tmp_path: Path) -> None:
    """bits-like data: 3 points of spread across d, seed stds of ~1.4 points. The y-axis must
    span the 20-point floor, not the 4-point data range that autoscaling would zoom in on."""
    runs = []
    for d, level in ((1, 0.86), (3, 0.84), (5, 0.83), (7, 0.84)):
        for seed in (0, 1, 2):
            run_dir = tmp_path / f"corbin-d{d}-s{seed}"
            cfg = {"mechanism": "corbin", "epsilon": 1.0, "d": d, "global-lr": 1.0, "seed": seed}
            acc = level + 0.01 * (seed - 1)
            write_run(run_dir, cfg, rows_of([(acc, acc)]), clients=10)
            runs.append(load_run(run_dir))
    for seed in (0, 1, 2):
        run_dir = tmp_path / f"ldpfl-s{seed}"
        cfg = {"mechanism": "ldpfl", "epsilon": 1.0, "global-lr": 1.0, "seed": seed}
        write_run(run_dir, cfg, rows_of([(0.80 + 0.01 * seed, 0.80 + 0.01 * seed)]), clients=10)
        runs.append(load_run(run_dir))
    groups = group_results(runs)
    fig = plots.accuracy_vs_figure(groups, "d", ["mechanism", "d"], title="bits")
    (ax,) = fig.axes
    lo, hi = ax.get_ylim()
    data = [100 * (g.test.mean + s * g.test.std) for g in groups for s in (-1, 1)]
    assert max(data) - min(data) < plots.MIN_Y_SPAN / 2  # autoscale would zoom in ~4x
    assert hi - lo == pytest.approx(plots.MIN_Y_SPAN)
    assert lo <= min(data) and max(data) <= hi
    assert "ldpfl [ε_p-LDP/param. vs A, B]: reference, not swept over d (band ± 1 std)" in (
        _legend_texts(fig)
    )
    assert "over 3 seeds (0, 1, 2)" in _flat(_texts(fig)[1])
    assert "clients=10" in _texts(fig)[0] and "ε_p=1" in _texts(fig)[0]


def test_accuracy_ylim_never_zooms_in_on_seed_noise() -> None:
    # bits-like: means 80-86 with 4-point seed stds -> 20 points, centred, inside [0, 100]
    lo, hi = plots.accuracy_ylim(78.0, 88.0, 4.0)
    assert hi - lo == pytest.approx(plots.MIN_Y_SPAN) and (lo + hi) / 2 == pytest.approx(83.0)
    lo, hi = plots.accuracy_ylim(70.0, 80.0, 6.0)  # 5 stds = 30 points > the floor
    assert hi - lo == pytest.approx(plots.STD_SPAN * 6.0)
    lo, hi = plots.accuracy_ylim(10.0, 95.0, 2.0)  # a wide range keeps its own span + margin
    assert hi - lo == pytest.approx(1.1 * 85.0) and lo < 10.0 and hi > 95.0
    assert plots.accuracy_ylim(93.0, 97.0, 0.5) == pytest.approx((80.0, 100.0))  # shifted down
    assert plots.accuracy_ylim(1.0, 3.0, 0.5) == pytest.approx((0.0, 20.0))  # shifted up
    for bad in ((5.0, 4.0, 1.0), (math.nan, 4.0, 1.0), (1.0, 4.0, math.inf)):
        with pytest.raises(ValueError, match="not a finite range"):
            plots.accuracy_ylim(*bad)


def test_mse_figures_state_their_fixed_settings_and_error_bars() -> None:
    mse_spec = MSESpec(
        center=0.1, radius=0.4, epsilons=(0.5, 2.0), d=3, grid_points=3, samples=200,
        heatmap_epsilons=(0.5,),
    )  # fmt: skip
    grid = measure_grid(mse_spec, seeds=(0, 1), device="cpu")
    for fig in (mse.vs_epsilon_figure(grid), mse.heatmaps_figure(grid, (0.5,))):
        title, caption = _texts(fig)
        fixed = "fixed: center c=0.1, radius r=0.4, d=3, 200 samples per point and seed, seeds 0, 1"
        assert fixed in _flat(title)
        assert caption
    fig = mse.vs_epsilon_figure(grid)
    assert "± 3 standard errors" in _texts(fig)[1]
    assert "1/2: target CorBinQ ≤ LDPQ / 2" in _legend_texts(fig)


# --------------------------------------------------------------------------- mse


def test_measured_pair_mse_matches_closed_form_and_report(tmp_path: Path) -> None:
    mse_spec = MSESpec(
        center=0.1, radius=0.4, epsilons=(0.5, 2.0), d=3, grid_points=5, samples=4000,
        heatmap_epsilons=(0.5,),
    )  # fmt: skip
    grid = measure_grid(mse_spec, seeds=(0, 1), device="cpu")
    for which in ("corbin", "ldpq"):
        mean, se, closed = grid.averages(which)
        np.testing.assert_array_equal(closed, getattr(grid, f"{which}_closed").mean(axis=(1, 2)))
        assert np.all(np.abs(mean - closed) <= 5 * se), (which, mean, closed, se)
        z = grid.z_scores(which)
        assert np.mean(np.abs(z) <= 5) == 1.0
    # CorBinQ beats LDPQ on average (Theorem 2), at both budgets
    assert np.all(grid.averages("corbin")[0] < grid.averages("ldpq")[0])
    assert grid.corbin_seed_means.shape == (2, 2)
    # same seeds, same numbers
    again = measure_grid(mse_spec, seeds=(0, 1), device="cpu")
    np.testing.assert_array_equal(grid.corbin_measured, again.corbin_measured)
    path = tmp_path / mse.MEASUREMENT
    write_table(path, measurement_table(grid))
    loaded, real = read_measurement(path)
    assert isinstance(loaded, GridMSE) and loaded.epsilons == grid.epsilons and real is None
    np.testing.assert_array_equal(loaded.ldpq_se, grid.ldpq_se)
    np.testing.assert_array_equal(loaded.corbin_seed_means, grid.corbin_seed_means)
    targets = mse_targets(grid, None)
    assert targets[0].status == "PASS"
    assert targets[1].status == "PASS" and targets[1].detail.startswith("grid average")


def test_mse_experiment_end_to_end_on_real_weights(tmp_path: Path) -> None:
    spec = spec_from(
        """
seeds = [0, 1]
[experiment]
name = "mse-small"
kind = "mse"
[mse]
epsilons = [0.5]
d = 4
grid-points = 3
samples = 500
[mse.real-weights]
dataset = "mnist"
model = "cnn"
local-epochs = 1
batch-size = 64
num-partitions = 50
repeats = 10
"""
    )
    assert spec.mse is not None and spec.mse.real_weights == RealWeightsSpec(
        batch_size=64, num_partitions=50, repeats=10
    )
    out = ex.run(spec, tmp_path, progress=False)
    root = tmp_path / "mse-small"
    report = (root / "report.md").read_text()
    for name in ("mse-heatmap", "mse-vs-epsilon", "mse-real-weights"):
        assert (root / "figures" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert f"figures/{name}.png" in report
    with (root / mse.MEASUREMENT).open() as fh:
        layers = [row for row in csv.DictReader(fh) if row["part"] == "real-weights"]
    assert layers[-1]["layer"] == "all"
    _, real = read_measurement(root / mse.MEASUREMENT)
    assert isinstance(real, RealWeightsMSE)
    # SE from 10 repeats: a t(9) statistic; |t| > 8 has probability < 2e-5 per check
    for which in ("corbin", "ldpq"):
        meas = getattr(real, f"{which}_measured")[0]
        closed = getattr(real, f"{which}_closed")[0]
        se = getattr(real, f"{which}_se")[0]
        assert np.all(np.abs(meas - closed) <= 8 * se + 1e-6 * closed), (which, meas, closed, se)
    assert real.corbin_measured[0, -1] < real.ldpq_measured[0, -1]
    assert [t.status for t in out.targets][1] == "PASS"
    # the report can be rebuilt from the saved measurements alone
    (root / "report.md").unlink()
    targets, report_path = ex.finalize(spec, tmp_path)
    assert report_path is not None and report_path.exists() and targets


def test_measure_real_weights_requires_the_table() -> None:
    with pytest.raises(ValueError, match="real-weights"):
        measure_real_weights(MSESpec(), seed=0)


# --------------------------------------------------------------------------- CLI


def test_cli_plan_report_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(TINY)
    assert ex.main(["plan", str(spec_path), "--results", str(tmp_path / "r")]) == 0
    assert "tiny: 20 runs (0 done, 0 partial, 20 to do)" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment]\nname='x'\nbogus=1\n")
    assert ex.main(["run", str(bad)]) == 2
    assert ex.main(["run", str(tmp_path / "missing.toml")]) == 2
    assert ex.main(["frobnicate"]) == 2
    assert ex.main(["report", str(spec_path), "--results", str(tmp_path / "r")]) == 0
    ex.run(
        spec_from(TINY), tmp_path / "r", app_dir=fake_app_dir(tmp_path), backend=FakeBackend(),
        progress=False,
    )  # fmt: skip
    (tmp_path / "r" / "tiny" / "report.md").unlink()
    assert ex.main(["report", str(spec_path), "--results", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "tiny" / "report.md").exists()
    assert "[PASS]" in capsys.readouterr().out
    # the runs another experiment has done are done for this one too
    wider = tmp_path / "wider.toml"
    wider.write_text(
        TINY.replace('name = "tiny"', 'name = "wider"')
        .replace("epsilon = [0.5, 1.0]", "epsilon = [0.5, 1.0, 3.0]")
        .replace("d = 5", "d = 5\ndelta = 1e-5")
    )
    assert ex.main(["plan", str(wider), "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "wider: 28 runs (20 done, 0 partial, 8 to do)" in out
    missing = [line for line in out.splitlines() if line.startswith("  missing ")]
    assert len(missing) == 8 and all("-eps3-" in line for line in missing)


# --------------------------------------------------------------------------- end to end


def test_accuracy_vs_bits_puts_each_mechanism_at_its_uplink_bits(tmp_path: Path) -> None:
    """One panel per eps_p; pbm at 1 and 2 bits, imvu at 1, 2, 4, corbin and ldpfl at 1."""
    settings = [
        ("corbin", {}),
        ("ldpfl", {}),
        ("pbm", {"pbm-trials": 1}),
        ("pbm", {"pbm-trials": 2}),
        ("rqm", {"rqm-levels": 3}),
        ("imvu", {"imvu-bits": 1}),
        ("imvu", {"imvu-bits": 2}),
        ("imvu", {"imvu-bits": 4}),
    ]
    runs = []
    for eps in (0.3, 1.0):
        for i, (mech, extra) in enumerate(settings):
            for seed in (0, 1):
                acc = 0.5 + 0.03 * i + 0.1 * eps + 0.01 * seed
                d = tmp_path / f"{mech}-{i}-{eps}-s{seed}"
                cfg = {
                    "mechanism": mech, "epsilon": eps, "d": 5, "num-rounds": 2,
                    "global-lr": 1.0, "seed": seed, "range-mode": "update", **extra,
                }  # fmt: skip
                write_run(d, cfg, rows_of([(acc - 0.1, acc - 0.1), (acc, acc)]), clients=10)
                runs.append(load_run(d))
    groups = group_results(runs)
    assert {plots.bits_per_parameter(g.setting) for g in groups} == {1, 2, 4}
    assert plots.bits_per_parameter({"mechanism": "fedavg"}) == 32
    fig = plots.accuracy_vs_bits_figure(groups, varying_keys(runs), title="Bits frontier")
    axes = fig.axes
    assert [a.get_title() for a in axes] == ["ε_p = 0.3", "ε_p = 1"]
    xs = [tuple(float(x) for x in c.lines[0].get_xdata()) for c in axes[0].containers]
    # corbin, ldpfl, pbm (m = 1, 2), rqm (3 levels), imvu (1, 2, 4 bits)
    assert sorted(xs) == sorted([(1.0,), (1.0,), (1.0, 2.0), (2.0,), (1.0, 2.0, 4.0)])
    legend = _legend_texts(fig)
    assert "corbin, 1 bit + shared randomness [ε_p/param. vs A only; no DP vs B]" in legend
    assert "imvu [ε_p-LDP/param. vs A, B]" in legend
    title, caption = _texts(fig)
    assert title.startswith("Test accuracy vs uplink bits per parameter, one panel per ε_p\n")
    assert plots.THREAT_NOTE in _flat(caption)
    fig.savefig(tmp_path / "bits.png")
    with pytest.raises(ValueError, match="no settings"):
        plots.accuracy_vs_bits_figure([], [])


def _server_groups(tmp_path: Path) -> list[Any]:
    """Two seeds of ldpfl and augcorbin (gamma 0.6) with secure aggregation, B's run eps in
    their summaries, and of fedavg without it (no DP vs B); 8 parameters, 10 clients a round."""
    runs = []
    for i, (mech, extra, eps, up) in enumerate(
        [
            ("ldpfl", {"secure-aggregation": True}, 300.0, 40),
            ("augcorbin", {"secure-aggregation": True, "gamma": 0.6}, 3e4, 41),
            ("fedavg", {}, None, 320),
        ]
    ):
        for seed in (0, 1):
            d = tmp_path / f"{mech}-s{seed}"
            cfg = {"mechanism": mech, "num-rounds": 2, "global-lr": 1.0, "seed": seed, **extra}
            acc = 0.6 + 0.1 * i + 0.02 * seed
            sa = {"secure_aggregation": {"b": 4}} if extra else {}
            rows = [r | {"bytes_up": {"total": up}, "participants": 10} | sa for r in rows_of(
                [(acc - 0.1, acc - 0.1), (acc, acc)])]  # fmt: skip
            write_run(d, cfg, rows, clients=10)
            summary = json.loads((d / "summary.json").read_text())
            b = {"dp": True, "all_rounds": {"eps": eps}} if eps else {"dp": False}
            tm = {"threat_models": {"B": b}, "m": 8, "rounds": 2, "mechanism": mech}
            summary |= {"num_params": 8, "privacy": tm}
            (d / "summary.json").write_text(json.dumps(summary))
            runs.append(load_run(d))
    return group_results(runs)


def test_accuracy_vs_server_eps_puts_no_dp_settings_in_their_own_panel(tmp_path: Path) -> None:
    groups = _server_groups(tmp_path)
    keys = ["mechanism", "gamma", "secure-aggregation"]
    assert [plots.uplink_bits(g) for g in groups] == [4.0, 4.1, 32.0]  # 8 bits x bytes / (10 x 8)
    fig = plots.accuracy_vs_server_eps_figure(groups, keys, title="Server")
    left, right = fig.axes
    assert left.get_xscale() == "log"
    assert [c.lines[0].get_xdata()[0] for c in left.containers] == [300.0, 3e4]
    assert [c.lines[0].get_xdata()[0] for c in right.containers] == [1.0]
    assert _legend_texts(fig) == [
        "ldpfl + SecAgg, b = 4: 4 bits/param",
        "augcorbin, gamma=0.6 + SecAgg, b = 4: 4.1 bits/param",
        "fedavg: 32 bits/param",
    ]
    title, caption = _texts(fig)
    assert title.startswith("Test accuracy vs the guarantee against the server (B)\n")
    assert "± 1 sample std (ddof=1) over 2 seeds" in _flat(caption)
    # issue 38: both runs' eps exceed 10, so the region above it is shaded and said to be none
    assert "shaded: ε > 10, formally DP and practically none" in _flat(caption)
    assert [t.get_text() for t in left.texts] == ["ε > 10: no meaningful protection"]
    fig.savefig(tmp_path / "server.png")


def test_threat_model_cells_mark_eps_above_10_and_show_b_per_parameter() -> None:
    """Issue 38 item 4: a composed eps above 10 reads "no meaningful protection"; with secure
    aggregation B's cell carries its per-parameter eps beside the composed one (5 digits, and
    "no better than eps_p" where the sum gains nothing per parameter)."""
    from corbin_fl.experiments.report import _threat_model_cell

    a = {"dp": True, "headline": "eps_p = 1 per parameter",
         "per_update": {"k": 1000, "eps": 577.8, "delta": 1e-5},
         "all_rounds": {"k": 3000, "eps": 9.5, "delta": 1e-5}}  # fmt: skip
    cell = _threat_model_cell("A", a)
    assert "update (577.8, 1.000e-05) no meaningful protection" in cell
    assert "run (9.5, 1.000e-05)" in cell and cell.count("no meaningful protection") == 1
    b = {"dp": True, "headline": "no meaningful protection: run eps 916.4",
         "per_parameter": {"eps": 0.999974405, "delta": 1e-5},
         "all_rounds": {"k": 3000, "eps": 916.4, "delta": 1e-5}}  # fmt: skip
    cell = _threat_model_cell("B", b, 1.0, secure=True)
    assert cell.endswith("per parameter 0.99997 (no better than eps_p = 1)")
    assert "per parameter" not in _threat_model_cell("B", b, 1.0)  # without it: A's figures


def test_server_scaling_calls_the_accountant_per_gamma_at_the_runs_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corbin_fl.experiments import server_table as st
    from corbin_fl.experiments.report import server_scaling

    calls: list[dict[str, Any]] = []

    def table(**kw: Any) -> list[dict[str, Any]]:
        calls.append(kw)
        row = {"n": 10, "bits": 1, "dp": True, "delta": 1e-5, "note": ""}
        row |= dict.fromkeys(("per_parameter_eps", "per_update_eps", "all_rounds_eps"), 1.0)
        return [row | {"mechanism": "ldpfl"}, row | {"mechanism": f"aug {kw['gamma']}"}]

    monkeypatch.setattr(st, "server_table", table)
    groups = _server_groups(tmp_path)
    text, block = server_scaling([g for g in groups if g.setting.get("secure-aggregation")])
    run = {"eps_p": 1.0, "m": 8, "rounds": 2, "delta": 1e-5, "d": 5}  # AppConfig's
    assert calls == [run | {"gamma": 0.6}]
    assert "m = 8 parameters, T = 2 rounds" in text and "gamma = 0.6" in text
    assert block == f"```\n{st.format_table(table(**run, gamma=0.6))}\n```"


def test_privacy_section_names_b_as_each_report_does(tmp_path: Path) -> None:
    """With a secure-aggregation setting, B's column says the server may see only the sum and
    each mechanism's words use its report's own B name; without one, the header is unchanged."""
    from corbin_fl.experiments.report import privacy_section

    groups = _server_groups(tmp_path)
    for g in groups:
        for r in g.runs:
            tm = r.summary["privacy"]
            tm["eps_p"] = 1.0
            if g.setting.get("secure-aggregation"):
                tm["secure_aggregation"] = {"n": 10}
                tm["threat_models"]["B"] |= {"name": "server, sees only the sum", "guarantee": "g"}
    keys = ["mechanism", "gamma", "secure-aggregation"]
    text = privacy_section(groups, keys)
    assert "| B: server that sees every bit (only the sum with SecAgg+) |" in text
    assert "  - B, server, sees only the sum: g" in text
    assert "  - B, server that sees every bit: " in text  # fedavg, no secure aggregation
    plain = privacy_section([g for g in groups if not g.setting.get("secure-aggregation")], keys)
    assert "| B: server that sees every bit |" in plain and "SecAgg" not in plain


def test_group_label_leaves_out_other_mechanisms_keys_at_their_default() -> None:
    keys = ["mechanism", "epsilon", "imvu-bits", "pbm-trials", "rqm-levels"]
    defaults = {"imvu-bits": 1, "pbm-trials": 1, "rqm-levels": 2}
    assert group_label({"mechanism": "corbin", "epsilon": 0.1, **defaults}, keys) == (
        "corbin, epsilon=0.1"
    )
    # its own key stays, at the default too
    assert group_label({"mechanism": "pbm", "epsilon": 0.1, **defaults}, keys) == (
        "pbm, epsilon=0.1, pbm-trials=1"
    )
    # another mechanism's key away from its default stays, so labels stay distinct
    other = {**defaults, "pbm-trials": 2}
    assert group_label({"mechanism": "corbin", "epsilon": 0.1, **other}, keys) == (
        "corbin, epsilon=0.1, pbm-trials=2"
    )
    # a multi-word mechanism owns its prefix; keys without a mechanism prefix always stay
    assert group_label(
        {"mechanism": "central-gaussian", "central-clip": 1.0, "cr-mode": "relay"},
        ["mechanism", "central-clip", "cr-mode"],
    ) == ("central-gaussian, central-clip=1.0, cr-mode=relay")
    # gamma is AugCorBin's: the registry says which keys a mechanism reads
    from corbin_fl import registry

    assert registry.get("augcorbin").own_keys == {"gamma"}
    assert "gamma" not in registry.get("corbin").own_keys
    assert "pbm-trials" in registry.get("pbm").own_keys
    keys = ["mechanism", "gamma", "secure-aggregation"]
    assert group_label({"mechanism": "ldpfl", "gamma": 0.2, "secure-aggregation": False}, keys) == (
        "ldpfl, secure-aggregation=False"
    )
    assert group_label({"mechanism": "augcorbin", "gamma": 0.2}, keys) == (
        "augcorbin, gamma=0.2, secure-aggregation=default"
    )
    assert group_label({"mechanism": "pbm", "gamma": 0.6, "secure-aggregation": True}, keys) == (
        "pbm, gamma=0.6, secure-aggregation=True"
    )

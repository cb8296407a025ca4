"""Fashion-MNIST as a data set of the app (issue 40): the run config, the ``corbin-fl`` checks
before anything starts, the console header, the limit of a run without ``--timeout``, the
server's channels-last evaluation, and the paper specs' plan and progress line.

The files are tiny IDX files written here in the real format (``tests/unit/test_data.py``'s
helpers); nothing needs Debian's ``dataset-fashion-mnist``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_data import write_mnist_dir

from corbin_fl.app.config import AppConfig
from corbin_fl.deploy import cli
from corbin_fl.deploy.pace import PACE_FACTOR, PACE_SLACK_S, derived_deadline
from corbin_fl.deploy.run import LocalRunOptions
from corbin_fl.experiments import cli as ex
from corbin_fl.experiments import sweep
from corbin_fl.experiments.spec import load_spec
from corbin_fl.experiments.sweep import Run, RunState, expand_runs, table_size

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- run config
def test_fashion_mnist_is_always_tested_on_its_official_split() -> None:
    """``use-official-test`` reads true for fashion-mnist, the app's default (false) included;
    other data sets keep what they are given."""
    assert AppConfig.from_flower({"dataset": "fashion-mnist"}).use_official_test is True
    cfg = AppConfig.from_flower({"dataset": "fashion-mnist", "use-official-test": False})
    assert cfg.use_official_test is True and cfg.result_config()["use-official-test"] is True
    assert AppConfig.from_flower({"dataset": "mnist-idx", "data-dir": "/x"}).use_official_test is (
        False
    )


# --------------------------------------------------------------------------- corbin-fl checks
def _half_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "half"
    write_mnist_dir(folder, np.random.default_rng(5), gz=True)
    for f in [*folder.glob("t10k-*")]:
        f.unlink()
    return folder


@pytest.mark.parametrize("command", ["local", "simulate"])
def test_missing_files_fail_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Two of four files: exit 2 at once, naming both and the apt-get line; no run folder."""
    out = tmp_path / "out"
    code = cli.main(
        [
            command,
            "--dataset",
            "fashion-mnist",
            "--out",
            str(out),
            "--quiet",
            "--run-config",
            f'data-dir="{_half_folder(tmp_path)}"',
        ]
    )
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE == 2
    assert "t10k-images-idx3-ubyte" in err and "t10k-labels-idx1-ubyte" in err
    assert "lacks 2 of 4 files" in err
    assert "apt-get install dataset-fashion-mnist" in err
    assert not out.exists()


def test_a_missing_default_folder_and_an_explicit_pooled_split_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from corbin_fl.app import sources

    absent = tmp_path / "not-installed"
    entry = sources.IDX_SOURCES["fashion-mnist"]
    monkeypatch.setitem(
        sources.IDX_SOURCES,
        "fashion-mnist",
        sources.IdxSource(**{**vars(entry), "default_dir": str(absent)}),
    )
    assert cli.main(["local", "--dataset", "fashion-mnist", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{absent} does not exist" in err and "apt-get install dataset-fashion-mnist" in err
    assert all(name in err for name in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
    folder = tmp_path / "full"
    write_mnist_dir(folder, np.random.default_rng(6))
    code = cli.main(
        [
            "local",
            "--dataset",
            "fashion-mnist",
            "--quiet",
            "--run-config",
            f'data-dir="{folder}" use-official-test=false',
        ]
    )
    assert code == 2
    assert "official test split" in capsys.readouterr().err


def test_the_console_header_names_the_data_set_and_its_test_split(tmp_path: Path) -> None:
    folder = tmp_path / "full"
    write_mnist_dir(folder, np.random.default_rng(7))
    label = cli.data_label(cli.repo_root(), {"dataset": "fashion-mnist", "data-dir": str(folder)})
    assert label == "Fashion-MNIST (fashion-mnist; test: official split)"
    label = cli.data_label(cli.repo_root(), {"dataset": "mnist-idx", "data-dir": str(folder)})
    assert label == "IDX files (MNIST format) (mnist-idx; test: pooled 80/20 split)"
    assert "Fashion" not in label
    assert cli.data_label(tmp_path, {"dataset": "x"}) == "dataset x"


def test_the_dataset_flag_lists_every_source() -> None:
    sim = cli.build_parser().parse_args(["simulate"])._cli_parser
    text = " ".join(sim.format_help().split())
    for name in ("mnist", "fashion-mnist", "mnist-idx", "cifar10", "femnist", "shakespeare"):
        assert f"{name} (" in text or f"{name}," in text or f"{name} or" in text, name
    assert "hf:<hub-id>" in text and "apt-get install dataset-fashion-mnist" in text


# --------------------------------------------------------------------------- run limit
def test_a_run_without_timeout_is_limited_by_its_own_pace() -> None:
    """No fixed limit by default; after r of R rounds the limit is now + (R - r) x 3 x the
    slowest round + 600 s, and none before a round has ended."""
    assert cli.build_parser().parse_args(["simulate"]).timeout is None
    assert LocalRunOptions(app_dir=REPO, out_dir=Path("/tmp/x")).timeout is None
    assert derived_deadline(100.0, [], 100) == math.inf
    assert derived_deadline(100.0, [{"round_seconds": 9.0}], None) == math.inf
    rows = [{"round_seconds": 9.0}, {"round_seconds": 12.0}, {"round": 3}]
    assert derived_deadline(100.0, rows, 100) == 100.0 + 97 * PACE_FACTOR * 12.0 + PACE_SLACK_S
    assert derived_deadline(0.0, rows, 3) == PACE_SLACK_S  # the last round ended: the summary
    with pytest.raises(ValueError, match="timeout must be > 0"):
        LocalRunOptions(app_dir=REPO, out_dir=Path("/tmp/x"), timeout=0.0).validate()


# --------------------------------------------------------------------------- evaluation
def test_channels_last_evaluation_gives_the_same_result() -> None:
    """The server scores with a channels-last copy of the model: same loss and accuracy."""
    from corbin_fl.app.models import build_model
    from corbin_fl.app.training import evaluate

    gen = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(
        torch.randn(300, 1, 28, 28, generator=gen), torch.randint(0, 10, (300,), generator=gen)
    )
    plain = build_model("cnn", 1, 10, seed=4)
    fast = build_model("cnn", 1, 10, seed=0).to(memory_format=torch.channels_last)
    fast.load_state_dict(plain.state_dict(), strict=True)
    a = evaluate(plain, data, batch_size=128, device="cpu")
    b = evaluate(fast, data, batch_size=128, device="cpu")
    assert a.accuracy == b.accuracy
    assert a.loss == pytest.approx(b.loss, rel=1e-5)


# --------------------------------------------------------------------------- paper specs
CPU_SPEC = REPO / "experiments/paper/fashion-cpu.toml"
CPU_REST_SPEC = REPO / "experiments/paper/fashion-cpu-rest.toml"
GPU_SPEC = REPO / "experiments/paper/fashion-gpu.toml"


def test_the_paper_specs_are_the_papers_setting() -> None:
    """50 clients, IID, 100 rounds, the CNN, batch 64, eps_p in {0.1, 0.3, 1, 3}, >= 3 seeds,
    lambda from a grid, on Fashion-MNIST; the CPU specs cap the local steps, the GPU spec runs
    full local epochs."""
    for path in (CPU_SPEC, CPU_REST_SPEC, GPU_SPEC):
        spec = load_spec(path)
        runs = expand_runs(spec)
        assert {r.clients for r in runs} == {50}
        for r in runs:
            cfg = AppConfig.from_flower(dict(r.run_config))
            assert (cfg.dataset, cfg.use_official_test, cfg.partitioner) == (
                "fashion-mnist",
                True,
                "iid",
            )
            assert (cfg.num_rounds, cfg.model, cfg.batch_size, cfg.local_epochs) == (
                100,
                "cnn",
                64,
                1,
            )
            if cfg.mechanism not in ("fedavg",):
                assert cfg.epsilon in (0.1, 0.3, 1.0, 3.0)
        # the CPU specs carry their measured round; no GPU was lent to measure the GPU spec's
        assert (spec.round_seconds is None) == (path == GPU_SPEC)
        assert len(spec.lambda_grid) >= 2 or path == CPU_REST_SPEC
    cpu, gpu = expand_runs(load_spec(CPU_SPEC)), expand_runs(load_spec(GPU_SPEC))
    assert {AppConfig.from_flower(dict(r.run_config)).max_steps for r in cpu} == {
        load_spec(CPU_SPEC).base["max-steps"]
    }
    assert {AppConfig.from_flower(dict(r.run_config)).max_steps for r in gpu} == {0}
    assert len(load_spec(CPU_SPEC).seeds) >= 3 and len(load_spec(GPU_SPEC).seeds) >= 3
    main = {(r.run_config["mechanism"], r.run_config.get("epsilon")) for r in cpu}
    for mech in ("corbin", "ldpfl", "pbm"):
        assert {e for m, e in main if m == mech} == {0.1, 0.3, 1.0, 3.0}
    assert ("fedavg", None) in main or any(m == "fedavg" for m, _ in main)
    rest = expand_runs(load_spec(CPU_REST_SPEC))
    mechs = {
        (r.run_config["mechanism"], r.run_config.get("secure-aggregation", False)) for r in rest
    }
    for mech in ("augcorbin", "rqm", "imvu", "central-gaussian"):
        assert (mech, False) in mechs
    for mech in ("ldpfl", "pbm", "augcorbin"):
        assert (mech, True) in mechs
    gpu_mechs = {r.run_config["mechanism"] for r in gpu}
    assert gpu_mechs >= {"corbin", "augcorbin", "ldpfl", "pbm", "rqm", "imvu", "fedavg"}
    assert "central-gaussian" in gpu_mechs


def test_plan_prints_the_runs_and_their_estimated_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (CPU_SPEC, CPU_REST_SPEC, GPU_SPEC):
        spec = load_spec(path)
        runs = expand_runs(spec)
        n, first = table_size(spec, runs), sum(r.selects for r in runs)  # lambda-seeds: fewer
        assert ex.main(["plan", str(path), "--results", str(tmp_path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"{spec.name}: {n} runs (0 done, 0 partial, {first} to do" in out
        if first < n and spec.lambda_from is None:  # fashion-cpu: lambda chosen on seed 0
            assert f"{n - first} then at their setting's chosen lambda" in out
        elif first < n:  # fashion-cpu-rest: at the lambda fashion-cpu chooses for a counterpart
            assert f"{n - first} then at the lambda chosen for their counterpart in" in out
        if spec.round_seconds is None:
            assert "estimate:" not in out
            continue
        hours = n * 100 * spec.round_seconds / 3600
        assert f"estimate: {n} runs to do x their rounds ({n * 100:,} in all)" in out
        assert f"= {hours:.1f} h" in out
    # every seed chooses: each run not done is one to do
    spec = dataclasses.replace(load_spec(CPU_SPEC), lambda_seeds=None)
    planned = ex.plan(spec, tmp_path)
    half = [(r, RunState.DONE if i % 2 else s) for i, (r, s) in enumerate(planned)]
    left = sum(1 for _, s in half if s is not RunState.DONE)
    assert f"estimate: {left} runs to do" in str(ex.plan_estimate(spec, half))


def test_the_progress_line_counts_the_pools_runs_and_the_time_left() -> None:
    outcome = ex.Outcome(total=40, skipped=12, executed=3, failed={"x": "why"})
    now = __import__("time").monotonic()
    line = ex.progress_line("fashion-cpu", outcome, 4, 28, now - 4 * 60.0)
    assert line.startswith("fashion-cpu: run 5 of 28 to do now; 15 of 40 done, 1 failed")
    assert "about 24 min left at 1.0 min a run" in line
    first = ex.progress_line("fashion-cpu", ex.Outcome(total=40, skipped=12), 0, 28, now)
    assert first.endswith("12 of 40 done (resumes where it stopped)")


def test_a_run_of_the_pool_logs_its_progress_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``experiment run`` logs one progress line per run, and a second invocation resumes:
    it counts the runs the first one did as done and executes only the rest."""
    from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

    spec = spec_from(TINY)
    total = len(expand_runs(spec))
    app = fake_app_dir(tmp_path)
    caplog.set_level(logging.INFO, logger="corbin_fl.experiments.cli")
    first = ex.run(spec, tmp_path / "r", app_dir=app, backend=FakeBackend(), max_runs=3,
                   progress=False)  # fmt: skip
    assert first.executed == 3
    lines = [r.getMessage() for r in caplog.records if " to do now; " in r.getMessage()]
    assert lines[0] == f"tiny: run 1 of 3 to do now; 0 of {total} done (resumes where it stopped)"
    assert lines[2].startswith(f"tiny: run 3 of 3 to do now; 2 of {total} done")
    caplog.clear()
    second = ex.run(spec, tmp_path / "r", app_dir=app, backend=FakeBackend(), progress=False)
    assert (second.skipped, second.executed) == (3, total - 3)
    lines = [r.getMessage() for r in caplog.records if " to do now; " in r.getMessage()]
    assert lines[0] == (
        f"tiny: run 1 of {total - 3} to do now; 3 of {total} done (resumes where it stopped)"
    )


HERE: dict[str, Any] = {"cpu": "CPU A", "cpus": 2, "isa": ["avx2"], "machine": "x86_64"}
"""The machine the estimates below are made on (``host_record()``'s shape)."""


def _write_done_run(
    pool: Path, run: Run, seconds: float, host: dict[str, Any] | None = None
) -> None:
    """A finished run folder of ``run`` as the pool writes it (``results.load_run`` reads it),
    which took ``seconds`` of wall time (on ``host``; a record without the field if None)."""
    folder = pool / run.run_id
    folder.mkdir(parents=True)
    record = {
        "run_id": run.run_id,
        "run_config": dict(run.run_config),
        "config": dict(run.config),
        "clients": run.clients,
        "complete": True,
        "seconds": seconds,
    }
    if host is not None:
        record["host"] = host
    summary = json.dumps({sweep.RUN_RECORD_KEY: record})
    (folder / sweep.SUMMARY_FILE).write_text(summary, encoding="utf-8")
    row = {"round": 1, "val_accuracy": 0.5, "test_accuracy": 0.5}
    (folder / sweep.METRICS_FILE).write_text(json.dumps(row) + "\n", encoding="utf-8")


def test_the_estimate_takes_the_median_round_of_the_runs_done(tmp_path: Path) -> None:
    """Measured beats declared: a round's seconds is the median over the runs done (so one run
    beside other work does not pull it), apart for the runs with secure aggregation, and the
    spec's ``round-seconds`` only where none of a kind is done; the time at each kind's fastest
    run follows when it is quicker than the median."""
    spec = load_spec(CPU_REST_SPEC)
    planned = ex.plan(spec, tmp_path)
    plain = [r for r, _ in planned if not r.config.get("secure-aggregation")]
    secure = [r for r, _ in planned if r.config.get("secure-aggregation")]
    assert len(plain) >= 4 and len(secure) >= 2
    # three plain runs done: 100 rounds in 800, 900 and 5,000 s -> a median of 9 s a round
    done = dict(zip((r.run_id for r in plain[:3]), (800.0, 900.0, 5000.0), strict=True))
    for r in plain[:3]:
        _write_done_run(tmp_path / "runs", r, done[r.run_id])
    marked = [(r, RunState.DONE if r.run_id in done else s) for r, s in planned]
    measured = ex.round_seconds_done(marked, tmp_path / "runs")
    assert sorted(s for secure, s, _ in measured if not secure) == [8.0, 9.0, 50.0]
    assert [s for secure, s, _ in measured if secure] == []
    text = str(ex.plan_estimate(spec, marked, tmp_path / "runs", host=HERE))
    assert "9 s a round (the median of 3 runs done, none on this machine)" in text
    declared = f"{spec.round_seconds:g} s a round with secure aggregation (measured, see the spec)"
    assert declared in text
    todo = ex.to_do(marked)
    n_secure = sum(bool(r.config.get("secure-aggregation")) for r in todo)
    hours = (100 * 9.0 * (len(todo) - n_secure) + 100 * spec.round_seconds * n_secure) / 3600
    assert f"= {hours:.1f} h" in text
    # and at the fastest plain run (8 s), the declared figure for the secure runs
    fast = (100 * 8.0 * (len(todo) - n_secure) + 100 * spec.round_seconds * n_secure) / 3600
    assert text.endswith(f"; {fast:.1f} h at the fastest run done (8 s a round)"), text
    # one run of a kind: its median is its fastest, and no second figure is given
    one = [(r, RunState.DONE if r.run_id == plain[0].run_id else s) for r, s in planned]
    assert "fastest" not in str(ex.plan_estimate(spec, one, tmp_path / "runs", host=HERE))
    # a secure run done: its kind's median replaces the spec's figure; a run whose record
    # cannot be read is left out, and a spec without round-seconds still estimates from it
    _write_done_run(tmp_path / "runs", secure[0], 2000.0)
    (tmp_path / "runs" / secure[1].run_id).mkdir()  # done by its state, but no summary.json
    both = {secure[0].run_id, secure[1].run_id}
    marked = [(r, RunState.DONE if r.run_id in both else s) for r, s in marked]
    unmeasured = dataclasses.replace(spec, round_seconds=None)
    text = str(ex.plan_estimate(unmeasured, marked, tmp_path / "runs", host=HERE))
    assert "20 s a round with secure aggregation (the median of 1 run done, none on" in text
    assert text.endswith("(8 s a round and 20 s a round with secure aggregation)"), text
    assert ex.plan_estimate(unmeasured, planned, tmp_path / "missing") is None


def test_the_estimate_counts_only_the_runs_done_on_this_machine_where_there_are_some(
    tmp_path: Path,
) -> None:
    """A pool resumed over sessions ran on machines of different speeds: where runs of a kind
    were done on this machine (``run.host`` equal to ``host_record()``), only they give the
    median; a kind with none here takes every run done, and says so."""
    spec = load_spec(CPU_REST_SPEC)
    planned = ex.plan(spec, tmp_path)
    plain = [r for r, _ in planned if not r.config.get("secure-aggregation")]
    secure = [r for r, _ in planned if r.config.get("secure-aggregation")]
    other = HERE | {"cpu": "CPU B"}
    # plain: 2 runs here (5 and 6 s a round), 3 on a slower machine (11, 12, 13 s) and 1
    # older record without a host; secure: 1 run elsewhere (20 s)
    seconds = [(500.0, HERE), (600.0, HERE), (1100.0, other), (1200.0, other), (1300.0, other)]
    for r, (s, host) in zip(plain, [*seconds, (1400.0, None)], strict=False):
        _write_done_run(tmp_path / "runs", r, s, host)
    _write_done_run(tmp_path / "runs", secure[0], 2000.0, other)
    done = {r.run_id for r in [*plain[:6], secure[0]]}
    marked = [(r, RunState.DONE if r.run_id in done else s) for r, s in planned]
    measured = ex.round_seconds_done(marked, tmp_path / "runs")
    assert sorted(s for secure, s, host in measured if not secure and host == HERE) == [5.0, 6.0]
    assert len([s for secure, s, _ in measured if not secure]) == 6
    text = str(ex.plan_estimate(spec, marked, tmp_path / "runs", host=HERE))
    assert "5.5 s a round (the median of 2 runs done on this machine)" in text
    assert "20 s a round with secure aggregation (the median of 1 run done, none on" in text
    # on the slower machine its own three runs count
    text = str(ex.plan_estimate(spec, marked, tmp_path / "runs", host=other))
    assert "12 s a round (the median of 3 runs done on this machine)" in text
    assert "20 s a round with secure aggregation (the median of 1 run done on this" in text

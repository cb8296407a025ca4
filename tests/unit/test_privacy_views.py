"""The privacy report as users read it: the terminal table of ``corbin-fl local`` and the
"## Privacy" section of the experiment reports, one guarantee per threat model."""

from __future__ import annotations

import dataclasses
import io
import json
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from corbin_fl.config import MECHANISMS
from corbin_fl.deploy import cli
from corbin_fl.deploy.follow import RunResult
from corbin_fl.experiments.report import privacy_section
from corbin_fl.experiments.results import (
    group_results,
    load_run,
    privacy_fields,
    privacy_view,
    varying_keys,
)
from corbin_fl.experiments.spec import load_spec
from corbin_fl.experiments.sweep import expand_runs
from corbin_fl.mechanisms.accounting import THREAT_MODELS
from corbin_fl.mechanisms.report import privacy_report

REPO = Path(__file__).resolve().parents[2]
MECHANISMS_RUNS = [
    REPO / "docs" / "results" / "quick" / "runs" / run.run_id
    for run in expand_runs(load_spec(REPO / "experiments" / "quick" / "mechanisms.toml"))
    if (REPO / "docs" / "results" / "quick" / "runs" / run.run_id).is_dir()
]
"""The committed runs of the quick mechanisms experiment, in the run pool."""
RECORDED_MECHANISMS = frozenset(
    tomllib.loads(
        (Path(__file__).resolve().parents[2] / "experiments/quick/mechanisms.toml").read_text()
    )["grid"]["mechanism"]
)
"""The mechanisms of the committed quick-scale mechanisms experiment (the later ones are in
``bits-frontier``)."""


def _report(mech: str, **kw: object) -> dict:
    args = {"d": 5, "gamma": 0.2, "n": 10, "r": 0.05} | kw
    # The largest numbers a real run prints: the CIFAR-10 ResNet-18 size over 500 rounds.
    return privacy_report(mech, 0.5, 1e-5, 11_200_000, 500, **args)  # type: ignore[arg-type]


def _render(renderable: object, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


# ------------------------------------------------------------------------- terminal


@pytest.mark.parametrize("mech", MECHANISMS)
def test_privacy_table_has_one_row_per_threat_model_within_80_columns(mech: str) -> None:
    report = _report(mech)
    # Natural width (a wide console never wraps): the table needs no wrapping at 80 columns.
    text = _render(cli.privacy_table(report), width=200)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert text == _render(cli.privacy_table(report), width=80)
    rows = [line for line in text.splitlines() if line[:1] in THREAT_MODELS]
    assert [row[0] for row in rows] == list(THREAT_MODELS), text
    for row, (key, entry) in zip(rows, report["threat_models"].items(), strict=True):
        assert THREAT_MODELS[key] in row and entry["headline"] in row, (row, entry)
        assert ("no DP" in row) is not entry["dp"], row


def test_privacy_table_says_no_dp_against_the_server_for_corbin() -> None:
    text = _render(cli.privacy_table(_report("corbin")), width=80)
    server = next(line for line in text.splitlines() if line.startswith("B"))
    assert "server that sees every bit" in server
    assert "no DP (paired bits are not private against it)" in server
    assert "one update: (1,378,462, 1e-05)" in text and "500 rounds:" in text
    ldpfl = _render(cli.privacy_table(_report("ldpfl")), width=80)
    assert "no DP" not in ldpfl and "same as A" in ldpfl
    fedavg = _render(cli.privacy_table(privacy_report("fedavg", None, 1e-5, 100, 3)), width=80)
    assert fedavg.count("no DP") == 4 and "1e-05" not in fedavg


def test_privacy_table_shows_b_per_parameter_and_says_when_eps_protects_nothing() -> None:
    """Issue 38 item 4: ldpfl with secure aggregation at n = 3. B's composed eps over the run is
    below A's and would read as a gain; its per-parameter eps (0.99997) is no better than
    eps_p = 1, and every composed eps above 10 says it protects nothing."""
    from corbin_fl.mechanisms.secure_sum import SumView

    report = privacy_report("ldpfl", 1.0, 1e-5, 1000, 3, secure=SumView(3, trials=1))
    b = report["threat_models"]["B"]
    assert b["all_rounds"]["eps"] < report["threat_models"]["A"]["all_rounds"]["eps"]
    text = _render(cli.privacy_table(report), width=80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    flat = " ".join(text.split())
    assert f"no meaningful protection: run eps {b['all_rounds']['eps']:.4g}" in flat
    assert "per parameter: 0.99997 (no better than eps_p = 1), delta 1e-05" in flat
    assert "one update: (577.8, 1e-05), no meaningful protection" in flat
    plain = _render(cli.privacy_table(privacy_report("ldpfl", 1.0, 1e-5, 1000, 3)), width=80)
    assert "per parameter:" not in plain  # without secure aggregation B is A's figures


def test_privacy_table_reads_the_committed_runs_and_errors() -> None:
    if not MECHANISMS_RUNS:
        pytest.skip("no committed mechanism runs in this checkout")
    corbin = next(p for p in MECHANISMS_RUNS if p.name.startswith("corbin-"))
    stored = json.loads((corbin / "app" / "summary.json").read_text())
    text = _render(cli.privacy_table(stored["privacy"]), width=80)
    assert "no DP (paired bits are not private against it)" in text
    error = {"mechanism": "corbin", "eps_p": 1.0, "error": "boom"}
    assert "failed: boom" in _render(cli.privacy_table(error), width=80)
    with pytest.raises(TypeError):
        cli.privacy_table([])  # type: ignore[arg-type]
    first_layout = {"mechanism": "corbin", "m": 10, "rounds": 2, "eps_p": 1.0, "dp": True}
    with pytest.raises(ValueError, match="no threat_models"):
        cli.privacy_table(first_layout)  # no longer read: the committed runs were rewritten


def test_summary_leaves_the_privacy_report_to_its_table() -> None:
    summary = {"num_params": 5, "privacy": _report("corbin"), "config": {"a": 1}}
    text = _render(cli.summary_table(summary), width=120)
    assert "num_params" in text and "privacy" not in text and "threat" not in text
    result = RunResult(
        ok=True,
        reason="completed",
        out_dir=Path("/tmp/x"),
        run_id=1,
        status="finished:completed",
        events=[],
        metrics=[],
        summary=summary,
        killed=[],
        node_ids={},
        processes=[],
        logs_dir=None,
        wall_seconds=1.0,
        exit_code=0,
    )
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    cli.print_report(console, result)
    text = console.export_text()
    assert "Privacy (corbin, eps_p = 0.5)" in text
    assert "server that sees every bit   no DP" in text
    assert max(len(line) for line in text.splitlines()) <= 80


# ------------------------------------------------------------------------- experiment reports


@pytest.fixture(scope="module")
def recorded() -> list:
    if not MECHANISMS_RUNS:
        pytest.skip("no committed mechanism runs in this checkout")
    runs = [load_run(p) for p in MECHANISMS_RUNS]
    assert len(runs) == 54
    assert {r.summary["privacy"]["mechanism"] for r in runs} == RECORDED_MECHANISMS
    return runs


def _cells(section: str) -> dict[str, list[str]]:
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[2:] == [f"{k}: {n}" for k, n in THREAT_MODELS.items()]
    return {
        cells[0]: cells
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])
    }


def _check_section(section: str) -> None:
    rows = _cells(section)
    assert set(rows) == RECORDED_MECHANISMS
    for mech in ("corbin", "augcorbin"):
        assert rows[mech][3].startswith("**no DP** (paired bits are not private against it)")
        assert rows[mech][5].startswith("**no DP**")
    for mech in ("fedavg", "cq"):
        assert all(cell.startswith("**no DP**") for cell in rows[mech][2:]), rows[mech]
        assert rows[mech][1] == "— (no DP)"
    for mech in ("ldpfl", "gaussian", "laplace", "ternary", "fedcad"):
        assert not any("no DP" in cell for cell in rows[mech]), rows[mech]
        assert "run (" in rows[mech][2]
    assert "update (" in rows["ldpfl"][2] and "update (" not in rows["fedcad"][2].split(";")[1]
    assert "The guarantees in words" in section and "- corbin: (B) the pair-joint" in section


def test_report_renders_the_committed_runs(recorded: list) -> None:
    section = privacy_section(group_results(recorded), varying_keys(recorded))
    _check_section(section)


def test_report_renders_the_current_layout(recorded: list) -> None:
    def current(run: object) -> object:
        summary = dict(run.summary)  # type: ignore[attr-defined]
        old = summary["privacy"]
        summary["privacy"] = privacy_report(
            old["mechanism"],
            old["eps_p"],
            1e-5,
            old["m"],
            old["rounds"],
            d=5,
            gamma=0.2,
            n=10,
            r=0.05,
        )
        return dataclasses.replace(run, summary=summary)  # type: ignore[type-var]

    runs = [current(r) for r in recorded]
    assert all("threat_models" in r.summary["privacy"] for r in runs)
    new = privacy_section(group_results(runs), varying_keys(runs))
    _check_section(new)
    # privacy_report today gives the numbers the committed runs store.
    old = privacy_section(group_results(recorded), varying_keys(recorded))
    assert _cells(new) == _cells(old)


def test_privacy_fields_of_the_committed_runs(recorded: list) -> None:
    for run in recorded:
        summary = run.summary
        mech = summary["privacy"]["mechanism"]
        fields = privacy_fields(summary)
        report = privacy_view(summary)
        assert report is not None and "threat_models" in report
        if mech in ("fedavg", "cq"):
            assert fields["eps_update"] is None and fields["delta_run"] is None
        else:
            run_a = report["threat_models"]["A"]["all_rounds"]
            assert fields["eps_run"] == run_a["eps"] and fields["delta_run"] == run_a["delta"]
        if mech in ("corbin", "augcorbin"):
            assert fields["pair_eps_update"] is None and fields["pair_delta_lower_bound"] == 1.0
    assert privacy_view({"privacy": None}) is None
    assert privacy_view({"privacy": {"mechanism": "magic", "m": 1, "rounds": 1}}) is None


# ------------------------------------------------------------------------- server


@pytest.mark.parametrize("mech", MECHANISMS)
def test_server_writes_the_per_threat_model_report(mech: str) -> None:
    from corbin_fl.config import RunConfig
    from corbin_fl.server.records import privacy_summary

    cfg = RunConfig(mechanism=mech, epsilon=0.5, num_rounds=3)
    report = privacy_summary(cfg, 3, 2_000, 4, 0.05)
    json.dumps(report, allow_nan=False)
    assert "error" not in report and "dp" not in report
    assert report["mechanism"] == mech and report["rounds"] == 3 and report["m"] == 2_000
    assert list(report["threat_models"]) == list(THREAT_MODELS)
    paired = mech in ("corbin", "augcorbin")
    no_dp = mech in ("fedavg", "cq", "signsgd")
    central = mech == "central-gaussian"  # the server adds the noise: no DP against it
    assert report["threat_models"]["B"]["dp"] is not (paired or no_dp or central)
    if paired:  # the server passes d, so the pair-joint bound is there
        assert report["threat_models"]["B"]["pair_joint"]["per_update"]["delta_lower_bound"] > 0
    assert ("delta" in report) is not no_dp

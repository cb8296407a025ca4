"""Secure aggregation refused with fewer than 3 clients or ``t < 2``, before anything starts
(issue 38): the run config's checks and ``corbin-fl local``'s exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.deploy import cli, processes


def errors(**run_config: Any) -> dict[str, str]:
    try:
        RunConfig.from_flower({"mechanism": "ldpfl", "secure-aggregation": True, **run_config})
    except ConfigError as exc:
        return dict(exc.errors)
    return {}


def test_run_config_refuses_fewer_than_3_clients_per_round_and_t_below_2() -> None:
    assert errors() == {}
    assert (
        "needs at least 3 clients per round, got 2"
        in errors(**{"clients-per-round": 2})["clients-per-round"]
    )
    assert "clients-per-round" in errors(**{"clients-per-round": 1})  # below min-clients too
    assert errors(**{"clients-per-round": 3}) == {}
    assert (
        "1-out-of-k Shamir share is the secret"
        in errors(**{"secagg-threshold": 1})["secagg-threshold"]
    )
    assert errors(**{"secagg-threshold": 2, "secagg-neighbours": 2}) == {}


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to start a process or a run."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a process was started: {args[:2]!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(processes.ProcessRegistry, "start", refuse)
    monkeypatch.setattr(cli, "run_local", refuse)
    monkeypatch.setattr(cli, "run_simulation", refuse)


def test_local_with_2_clients_and_secure_aggregation_exits_2_before_starting(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command: ``corbin-fl local --clients 2 --mechanism ldpfl --run-config
    'secure-aggregation=true'`` ran to the end without a word; now exit 2, the cause named."""
    out = tmp_path / "out"
    argv = ["local", "--clients", "2", "--mechanism", "ldpfl"]
    code = cli.main([*argv, "--run-config", "secure-aggregation=true", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE == 2, err
    assert "secure aggregation needs at least 3 clients, got --clients 2" in err
    assert not out.exists()
    # 3 clients pass this check (and would start: only the options are built here)
    options = cli.options_from_args(
        cli.build_parser().parse_args(
            [
                *argv[:2],
                "3",
                *argv[3:],
                "--run-config",
                "secure-aggregation=true",
                "--out",
                str(out),
            ]
        )
    )
    assert options.num_clients == 3

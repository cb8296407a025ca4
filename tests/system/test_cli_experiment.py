"""``corbin-fl experiment ...`` is dispatched to the experiment CLI."""

from __future__ import annotations

import pytest

from corbin_fl.deploy import cli


def test_experiment_subcommand_reaches_experiment_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["experiment", "--help"]) == 0
    assert "run,plan,report" in capsys.readouterr().out


def test_experiment_subcommand_rejects_missing_spec(tmp_path: object) -> None:
    assert cli.main(["experiment", "run", "/nonexistent/spec.toml"]) != 0

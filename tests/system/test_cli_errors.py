"""``corbin-fl local`` / ``simulate`` refuse impossible settings at once, with the cause.

Every error here must come before anything starts: the ``no_spawn`` fixture makes starting a
process (``subprocess.Popen``, :meth:`ProcessRegistry.start`) or a run fail the test, and each
test checks that the output folder was not even created. Every usage error has one style:
``corbin-fl <command>: error: <cause>`` and ``see corbin-fl <command> --help``, exit code 2.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.deploy import cli, flower, processes, run
from corbin_fl.deploy.flower import MissingDependencyError
from corbin_fl.deploy.run import LocalRunOptions


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to start a process or a run."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a process was started: {args[:2]!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(processes.ProcessRegistry, "start", refuse)
    monkeypatch.setattr(cli, "run_local", refuse)
    monkeypatch.setattr(cli, "run_simulation", refuse)


def _usage_error(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Run ``corbin-fl argv --out <tmp>/out``; assert exit 2, nothing created, the one error
    style; return the cause lines (without the ``... error:`` prefix and the hint)."""
    out = tmp_path / "out"
    code = cli.main([*argv, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_USAGE, captured
    assert not out.exists()
    return _error_lines(captured.err, f"corbin-fl {argv[0]}")


def _error_lines(err: str, prog: str) -> list[str]:
    lines = err.rstrip("\n").split("\n")
    assert lines[0].startswith(f"{prog}: error: "), err
    assert lines[-1] == f"see {prog} --help", err
    assert "usage:" not in err
    return [lines[0].removeprefix(f"{prog}: error: "), *lines[1:-1]]


# ====================================================================== impossible settings
def test_fewer_clients_than_min_clients(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cause,) = _usage_error(["local", "--clients", "1"], tmp_path, capsys)
    assert "--clients 1 is fewer than min-clients = 2" in cause
    assert "use --clients 2 or more" in cause and '"min-clients=1"' in cause
    # the run config may lower min-clients, and then one client is fine
    options = cli.options_from_args(
        cli.build_parser().parse_args(
            ["local", "--clients", "1", "--run-config", "min-clients=1", "--out", str(tmp_path)]
        )
    )
    assert options.num_clients == 1
    (cause,) = _usage_error(
        ["local", "--clients", "3", "--run-config", "min-clients=4"], tmp_path, capsys
    )
    assert "--clients 3 is fewer than min-clients = 4" in cause
    # simulate: the federation's num-supernodes is what counts
    (cause,) = _usage_error(
        ["simulate", "--federation-config", "num-supernodes=1"], tmp_path, capsys
    )
    assert "--federation-config num-supernodes 1 is fewer than min-clients = 2" in cause


def test_more_clients_per_round_than_clients(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local", "--clients", "3", "--run-config", "clients-per-round=5"]
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert "clients-per-round = 5 but only 3 SuperNodes" in cause
    assert "use --clients 5 or more, or clients-per-round <= 3" in cause


def test_kill_after_the_last_round(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local", "--rounds", "2", "--kill-client", "1@3"]
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert "--kill-client 1@3: the run has only 2 round(s)" in cause


def test_nodes_that_would_refuse_the_run_by_policy(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The nodes this command starts would refuse every round (their node config allows less
    than the run asks for): refused before anything starts, naming both settings."""
    argv = ["local", "--epsilon", "4", "--node-config", "corbin-max-epsilon=1"]
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert cause.startswith("the SuperNodes this command starts would refuse the run: ")
    assert "epsilon 4 is above this node's corbin-max-epsilon 1" in cause
    assert "the run's epsilon <= 1" in cause and "corbin-max-epsilon >= 4" in cause
    argv = ["local", "--mechanism", "ldpfl", "--node-config", "corbin-mechanisms=corbin"]
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert "mechanism 'ldpfl' is not allowed by this node" in cause
    # a node config that allows what the run asks is fine
    options = cli.options_from_args(
        cli.build_parser().parse_args(
            [
                "local",
                "--epsilon",
                "0.5",
                "--node-config",
                "corbin-max-epsilon=1",
                "--out",
                str(tmp_path / "ok"),
            ]
        )
    )
    options.validate()


def test_options_refuse_the_same_without_the_cli(repo_root: Path, tmp_path: Path) -> None:
    """``run_local`` callers get the check too (it runs in ``LocalRunOptions.validate``)."""
    options = LocalRunOptions(app_dir=repo_root, out_dir=tmp_path / "o", num_clients=1)
    with pytest.raises(ValueError, match="fewer than min-clients = 2"):
        run.run_local(options)
    assert not (tmp_path / "o").exists()


# ====================================================================== the simulation extra
def test_simulate_without_ray_names_the_install_command(
    no_spawn: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert flower.simulation_extra_missing() is None  # Ray is installed here
    real = flower._module_available
    monkeypatch.setattr(flower, "_module_available", lambda name: name != "ray" and real(name))
    (cause,) = _usage_error(["simulate"], tmp_path, capsys)
    assert "needs Ray (the [simulation] extra)" in cause
    assert 'pip install -e ".[tools,simulation]"' in cause
    with pytest.raises(MissingDependencyError, match="simulation"):
        run.run_simulation(
            LocalRunOptions(app_dir=cli.repo_root(), out_dir=tmp_path / "o", num_clients=2)
        )
    # `local` does not need Ray
    options = cli.options_from_args(
        cli.build_parser().parse_args(["local", "--out", str(tmp_path / "l")])
    )
    assert options.num_clients == cli.DEFAULT_CLIENTS


# ====================================================================== data-dir
def test_cifar10_needs_data_dir(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as exc:  # also in the ServerApp and the ClientApp
        AppConfig.from_flower({"dataset": "cifar10", "model": "resnet18"})
    assert list(exc.value.errors) == ["data-dir"]
    assert "cifar-10-batches-py" in exc.value.errors["data-dir"]
    with pytest.raises(ConfigError, match="MNIST IDX files"):
        AppConfig.from_flower({"dataset": "mnist-idx"})
    cause = _usage_error(["local", "--dataset", "cifar10"], tmp_path, capsys)
    assert any('data-dir: dataset "cifar10" reads the CIFAR-10' in ln for ln in cause), cause
    missing = tmp_path / "nowhere"
    argv = ["local", "--dataset", "cifar10", "--run-config", f'data-dir="{missing}"']
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert f'data-dir "{missing}" of dataset "cifar10" is not a folder' in cause


def test_data_dir_for_embedded_mnist_is_refused(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local", "--run-config", f'data-dir="{tmp_path}"']
    (cause,) = _usage_error(argv, tmp_path, capsys)
    assert 'dataset "mnist" is embedded' in cause and "would be ignored" in cause
    assert (
        "mnist-idx, cifar10, femnist, shakespeare (a local copy of the hub files) and "
        "hf:<hub-id> (as its download cache)"
    ) in " ".join(cause.split())
    AppConfig.from_flower({"dataset": "hf:ylecun/mnist", "data-dir": str(tmp_path)})  # a cache


# ====================================================================== d = 0, one error style
def test_d_zero_points_to_ldpfl(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["local", "--d", "0"])
    assert exc.value.code == cli.EXIT_USAGE
    (cause,) = _error_lines(capsys.readouterr().err, "corbin-fl local")
    assert cause.startswith("argument --d: d = 0 means no common randomness")
    assert "use --mechanism ldpfl" in cause
    # the same value through the run config gets the same pointer
    lines = _usage_error(["local", "--run-config", "d=0"], tmp_path, capsys)
    assert any('LDP-FL: mechanism = "ldpfl"' in ln for ln in lines), lines


@pytest.mark.parametrize(
    ("argv", "prog", "cause"),
    [
        (["local", "--clients", "0"], "corbin-fl local", "argument --clients: expected a posi"),
        (["simulate", "--rounds", "x"], "corbin-fl simulate", "argument --rounds: expected a p"),
        (["local", "--nope"], "corbin-fl local", "unrecognized arguments: --nope"),
        (["launch"], "corbin-fl", "argument {local,simulate,experiment}: invalid choice"),
    ],
)
def test_argparse_errors_are_one_line_and_a_hint(
    no_spawn: None,
    argv: list[str],
    prog: str,
    cause: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    (line,) = _error_lines(err, prog)
    assert line.startswith(cause), err
    assert len(err.splitlines()) == 2


def test_run_config_errors_have_the_same_style(
    no_spawn: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _usage_error(["local", "--run-config", "epsilonn=1.0"], tmp_path, capsys)
    assert lines[0] == "invalid run config (1 bad key(s)):"
    assert lines[1:] == ["  - epsilonn: unknown key; did you mean 'epsilon'?"]

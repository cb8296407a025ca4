"""The Flower release CorBin-FL runs on (corbin_fl.flower_version): one series everywhere, and a
mismatch fails before anything starts with a message that names both versions.

- every pin (pyproject's dependency and ``simulation`` extra, docker/requirements.txt, the
  Dockerfiles' and compose files' ``FLWR_VERSION``, the local bases, the build script, the
  quickstart example's dependency) is of :data:`FLOWER_SERIES`, and the tests run on it;
- :func:`check_flower` and :func:`check_app_requirement` accept that series and refuse another,
  naming both versions;
- ``corbin-fl local`` refuses a Flower of another series (installed, or asked for by the app's
  pyproject.toml) with a usage error (exit 2) before it starts any process;
- the ServerApp and the ClientApp check at their start, and the ServerApp's last log line is
  the run's outcome.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from corbin_fl import flower_version
from corbin_fl.flower_version import (
    FLOWER_REQUIREMENT,
    FLOWER_SERIES,
    FlowerVersionError,
    check_app_requirement,
    check_flower,
    supported,
)

REPO = Path(__file__).resolve().parents[2]


def _flwr_requirements(pyproject: Path) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        texts += extra
    return [Requirement(t) for t in texts if Requirement(t).name == "flwr"]


def test_pins_are_of_the_series_and_the_tests_run_on_it() -> None:
    series = f"{FLOWER_SERIES}.0"
    for pyproject in (REPO / "pyproject.toml", REPO / "examples/quickstart/pyproject.toml"):
        found = _flwr_requirements(pyproject)
        assert found, f"{pyproject}: no flwr requirement"
        for req in found:
            assert str(req.specifier) == f"=={FLOWER_SERIES}.*", (pyproject, str(req))
    requirements = (REPO / "docker/requirements.txt").read_text(encoding="utf-8")
    assert re.search(rf"^flwr=={re.escape(series)}$", requirements, re.M), requirements
    versions: dict[str, list[str]] = {}
    for path in [*REPO.glob("docker/Dockerfile*"), REPO / "docker/bases/Dockerfile.flwr"]:
        versions[path.name] = re.findall(r"ARG FLWR_VERSION=(\S+)", path.read_text())
    for path in REPO.glob("docker-compose*.yml"):
        versions[path.name] = re.findall(r'FLWR_VERSION:\s*"([^"]+)"', path.read_text())
    ci = (REPO / ".ci/run").read_text(encoding="utf-8")  # its Docker Hub probe
    versions[".ci/run"] = re.findall(r'docker pull -q "flwr/superlink:([\d.]+)"', ci)
    for path in ("docker/build-images.sh", "docker/bases/make-local-bases.sh"):
        text = (REPO / path).read_text()
        versions[path] = re.findall(r'(?i)flwr_version="(?:\$\{FLWR_VERSION:-)?([\d.]+)', text)
    assert all(v for k, v in versions.items() if not k.startswith("docker-compose")), versions
    assert versions["docker-compose.yml"], "docker-compose.yml builds with FLWR_VERSION"
    assert {v for vs in versions.values() for v in vs} == {series}, versions
    assert supported(metadata.version("flwr")), "the tests must run on the supported series"


@pytest.mark.parametrize("version", [f"{FLOWER_SERIES}.0", f"{FLOWER_SERIES}.7", "1.42.1rc1"])
def test_same_series_accepted(version: str) -> None:
    assert check_flower("ServerApp", version) == version


@pytest.mark.parametrize("version", ["1.41.0", "1.43.0", "2.42.0", "0.42.0"])
def test_other_series_refused_naming_both(version: str) -> None:
    with pytest.raises(FlowerVersionError) as err:
        check_flower("ClientApp", version)
    text = str(err.value)
    assert f"ClientApp runs on flwr {version}" in text
    assert f"Flower {FLOWER_SERIES}" in text and FLOWER_REQUIREMENT in text
    assert "606" in text


def test_installed_version_is_read() -> None:
    assert check_flower("corbin-fl") == metadata.version("flwr")


def test_flwr_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(flower_version.metadata, "version", missing)
    with pytest.raises(FlowerVersionError, match=re.escape(FLOWER_REQUIREMENT)):
        check_flower("corbin-fl")


@pytest.mark.parametrize(
    ("component", "version", "error"),
    [
        ("", "1.42.0", ValueError),
        ("ServerApp", "not-a-version", FlowerVersionError),
        ("ServerApp", 1.42, FlowerVersionError),
    ],
)
def test_bad_arguments(component: str, version: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_flower(component, version)


@pytest.mark.parametrize(
    "dependencies",
    [["flwr==1.42.*"], ["flwr[simulation]>=1.42,<1.43"], ["numpy>=1.26"], []],
)
def test_app_requirement_accepted(dependencies: list[str]) -> None:
    check_app_requirement(dependencies, "app/pyproject.toml", "1.42.0")


def test_app_requirement_refused_naming_both() -> None:
    with pytest.raises(FlowerVersionError) as err:
        check_app_requirement(["numpy", "flwr[simulation]==1.41.*"], "my/pyproject.toml", "1.42.0")
    text = str(err.value)
    assert "my/pyproject.toml requires 'flwr[simulation]==1.41.*'" in text
    assert "flwr 1.42.0 is installed" in text


def test_app_requirement_invalid() -> None:
    with pytest.raises(FlowerVersionError, match="invalid dependency"):
        check_app_requirement(["flwr["], "my/pyproject.toml", "1.42.0")


# --------------------------------------------------------------------------- where it is called


def _tiny_app(folder: Path, flwr: str) -> Path:
    folder.mkdir()
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "tiny"\nversion = "1.0.0"\ndependencies = ["{flwr}"]\n'
        '[tool.flwr.app]\npublisher = "t"\n[tool.flwr.app.components]\n'
        'serverapp = "a:s"\nclientapp = "a:c"\n[tool.flwr.app.config]\nnum-rounds = 1\n'
    )
    return folder


def test_corbin_fl_refuses_another_installed_flower(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corbin_fl.deploy import cli

    started: list[Any] = []
    monkeypatch.setattr(cli, "run_local", lambda *a, **k: started.append(a))
    monkeypatch.setattr(flower_version, "installed_flower_version", lambda: "1.41.0")
    code = cli.main(["local", "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and not started
    assert "corbin-fl local: error: corbin-fl runs on flwr 1.41.0" in err
    assert f"needs Flower {FLOWER_SERIES}" in err


def test_corbin_fl_refuses_an_app_asking_for_another_flower(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corbin_fl.deploy import cli

    started: list[Any] = []
    monkeypatch.setattr(cli, "run_local", lambda *a, **k: started.append(a))
    app = _tiny_app(tmp_path / "app", "flwr==1.41.*")
    code = cli.main(["local", "--app", str(app), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and not started
    assert f"{app / 'pyproject.toml'} requires 'flwr==1.41.*'" in err
    assert f"flwr {metadata.version('flwr')} is installed" in err


def test_corbin_fl_accepts_an_app_of_the_series(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from corbin_fl.deploy import flower

    app = _tiny_app(tmp_path / "app", FLOWER_REQUIREMENT)
    assert flower.check_flower_versions(app) == metadata.version("flwr")
    assert flower.check_flower_versions(tmp_path) == metadata.version("flwr")  # no pyproject


def test_server_app_checks_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ServerApp refuses another Flower before it reads its run config."""
    from corbin_fl.app import server_app

    monkeypatch.setattr(flower_version, "installed_flower_version", lambda: "1.41.0")

    class Context:
        @property
        def run_config(self) -> dict[str, Any]:
            raise AssertionError("the run config was read before the version check")

    with pytest.raises(FlowerVersionError, match=r"ServerApp runs on flwr 1\.41\.0"):
        server_app.main(None, Context())  # type: ignore[arg-type]


def test_client_app_lifespan_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    from corbin_fl.app import client_app

    monkeypatch.setattr(flower_version, "installed_flower_version", lambda: "1.41.0")
    with pytest.raises(FlowerVersionError, match=r"ClientApp runs on flwr 1\.41\.0"):
        next(iter(client_app.lifespan(None)))  # type: ignore[arg-type]
    monkeypatch.undo()
    started = iter(client_app.lifespan(None))  # type: ignore[arg-type]
    assert next(started) is None  # the installed Flower: the app starts


class _Context:
    def __init__(self, run_config: dict[str, Any]) -> None:
        self.run_config = run_config


def test_server_app_ends_on_its_outcome(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`flwr run --stream` and `flwr log` end on a line that says how the run ended."""
    from corbin_fl.app import server_app

    summary = {"rounds": 2, "final_test_accuracy": 0.91234}
    monkeypatch.setattr(server_app, "run_training", lambda grid, cfg: summary)
    monkeypatch.setattr(server_app, "configure_app_logging", lambda: None)
    with caplog.at_level("INFO", logger=server_app.logger.name):
        server_app.main(None, _Context({"num-rounds": 2, "out-dir": "/app/runs/demo"}))  # type: ignore[arg-type]
    assert caplog.records[-1].getMessage() == (
        "CorBin-FL run completed: 2/2 rounds, test accuracy 0.9123, results in /app/runs/demo"
    )

    def fails(grid: Any, cfg: Any) -> Any:
        raise RuntimeError("no round aggregated an update")

    monkeypatch.setattr(server_app, "run_training", fails)
    caplog.clear()
    with caplog.at_level("INFO", logger=server_app.logger.name), pytest.raises(RuntimeError):
        server_app.main(None, _Context({}))  # type: ignore[arg-type]
    last = caplog.records[-1]
    assert last.levelname == "ERROR"
    assert last.getMessage() == "CorBin-FL run failed: RuntimeError: no round aggregated an update"


def test_outcome_line_arguments() -> None:
    from corbin_fl.app.server_app import outcome_line
    from corbin_fl.config import RunConfig

    cfg = RunConfig.from_flower({})
    assert (
        outcome_line(cfg, {}) == "CorBin-FL run completed: ?/3 rounds, no out-dir (no result files)"
    )
    with pytest.raises(ValueError, match="exactly one"):
        outcome_line(cfg, None)
    with pytest.raises(ValueError, match="exactly one"):
        outcome_line(cfg, {}, RuntimeError("x"))

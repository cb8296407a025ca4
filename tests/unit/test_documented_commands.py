"""Every command line of README.md, docs/RUNNING.md, docs/DOCKER.md and
examples/quickstart/README.md is run by a test as written, or checked statically.

:data:`COVERAGE` is the inventory: each command line of a ``bash`` block (continuations joined,
comments dropped) must match exactly one entry, and each entry names the test that runs or checks
it, which must exist. A command added to a document without a test fails here, and so does an
entry whose command left the documents. The commands that need a second machine, a download or
``sudo``, and those whose run would stop other tests' processes, are checked here statically: their
flags are parsed by the real command-line parsers (Flower's ``flower-superlink`` and
``flower-supernode``, the ``flwr`` CLI, ``corbin-fl``, the benchmarks).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

REPO: Final[Path] = Path(__file__).resolve().parents[2]
DOCS: Final[tuple[str, ...]] = (
    "README.md",
    "docs/RUNNING.md",
    "docs/DOCKER.md",
    "examples/quickstart/README.md",
)
HERE: Final[str] = "tests/unit/test_documented_commands.py"

_CLI, _DEFAULTS = "tests/system/test_cli.py::", "tests/system/test_defaults_learn.py::"
_QS = "tests/system/test_quickstart.py::"
_QS_SIM = f"{_QS}test_quickstart_simulation_as_documented_learns_and_a_refused_run_fails"
_QS_DEP = f"{_QS}test_quickstart_deployment_as_documented_learns_and_survives_a_kill"
_RUNNING_SIM = f"{_DEFAULTS}test_flwr_run_with_only_rounds_and_epsilon_learns_in_simulation"
_PROD = f"{_DEFAULTS}test_documented_production_command_sets_only_rounds_budget_and_out_dir"
_HERE = f"{HERE}::"
_DOCKER, _COMPOSE = "tests/docker/", "tests/system/test_compose.py::"
_DOCKERFILES = "tests/unit/test_dockerfiles.py::"
_IMAGES = f"{_DOCKER}conftest.py::images"
_DEMO = f"{_DOCKER}test_demo.py::demo"
_DEMO_RUN = f"{_DOCKER}test_demo.py::test_documented_run_learns_through_a_kill_and_a_rejoin"
_MACHINES = f"{_DOCKER}test_machines.py::machines"
_MACHINES_RUN = f"{_DOCKER}test_machines.py::test_documented_run_learns_through_a_superlink_restart"

COVERAGE: Final[list[tuple[str, str, str]]] = [
    # (document, regex of a whole command line, the test that runs or checks it)
    # --- README.md: the two commands, also run by hand from a clean clone before every stop
    (
        "README.md",
        r"pip install torch==2\.13\.0 && pip install -e \"\.\[tools\]\" && corbin-fl local",
        f"{_HERE}test_readme_main_job_installs_what_it_runs",
    ),
    ("README.md", r"bash \.ci/run", f"{_HERE}test_readme_main_job_installs_what_it_runs"),
    # --- docs/RUNNING.md
    (
        "docs/RUNNING.md",
        r"pip install torch==2\.13\.0",
        f"{_HERE}test_install_lines_are_the_ci_ones",
    ),
    (
        "docs/RUNNING.md",
        r"pip install -e \"\.\[(tools|dev),simulation\]\"",
        f"{_HERE}test_install_lines_are_the_ci_ones",
    ),
    (
        "docs/RUNNING.md",
        r"python -m pytest -q -n 2 tests/unit",
        f"{_HERE}test_dev_extra_runs_the_tests",
    ),
    (
        "docs/RUNNING.md",
        r"corbin-fl (local|simulate)\b.*",
        f"{_CLI}test_documented_commands_run_the_app_defaults",
    ),
    (
        "docs/RUNNING.md",
        r"huggingface-cli download flwrlabs/\w+ .*",
        f"{_HERE}test_hub_downloads_land_where_the_next_command_reads",
    ),
    ("docs/RUNNING.md", r"flower-super(link|node) .*", f"{_HERE}test_flower_process_lines_parse"),
    (
        "docs/RUNNING.md",
        r"export FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0\.2",
        f"{_CLI}test_flower_env_polls_at_the_tuned_interval_unless_the_user_sets_it",
    ),
    ("docs/RUNNING.md", r"flwr run \. lab --stream .*", _PROD),
    ("docs/RUNNING.md", r"flwr (ls|log|stop|supernode list) .*", f"{_HERE}test_flwr_lines_parse"),
    ("docs/RUNNING.md", r"export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1", _RUNNING_SIM),
    ("docs/RUNNING.md", r"flwr run \. local --stream .*", _RUNNING_SIM),
    (
        "docs/RUNNING.md",
        r"python bench/bench_deployment\.py.*",
        f"{_HERE}test_benchmark_lines_parse",
    ),
    # --- examples/quickstart/README.md: run as written by tests/system/test_quickstart.py
    (
        "examples/quickstart/README.md",
        r"pip install -e \.",
        f"{_QS}test_readme_installs_both_apps_and_turns_off_runtime_installation",
    ),
    (
        "examples/quickstart/README.md",
        r"export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"
        r"|flwr (run \. local --stream .*|ls local --format json)",
        _QS_SIM,
    ),
    (
        "examples/quickstart/README.md",
        r"flower-super(link|node) .*|flwr (run \. quickstart --stream|ls quickstart --format json)",
        _QS_DEP,
    ),
    # --- docs/DOCKER.md: Parts A, B and C on a real engine (tests/docker, `pytest -m docker`;
    # Part C's machines are compose projects on separate networks), the GPU overrides and the
    # copying between machines (ssh, scp) statically on the rendered compose files
    ("docs/DOCKER.md", r"(sudo )?docker/(build-images|bases/make-local-bases)\.sh.*", _IMAGES),
    ("docs/DOCKER.md", r"docker compose (up -d|ps|down)", _DEMO),
    ("docs/DOCKER.md", r"flwr run \. docker --stream .*", _DEMO_RUN),
    ("docs/DOCKER.md", r"docker (kill corbin-fl-supernode-|compose ps -a ).*", _DEMO_RUN),
    ("docs/DOCKER.md", r"docker compose exec serverapp grep .*", _DEMO_RUN),
    (
        "docs/DOCKER.md",
        r"docker compose (exec serverapp tail .*|cp serverapp:.*)",
        f"{_COMPOSE}test_state_and_results_volumes",
    ),
    ("docs/DOCKER.md", r"mkdir -p runs", f"{_HERE}test_copy_destinations_exist"),
    (
        "docs/DOCKER.md",
        r"docker compose -f docker-compose\.yml -f docker-compose\.gpu\.yml up -d"
        r"|docker compose -f docker-compose\.client\.yml -f docker-compose\.client\.gpu\.yml .*",
        f"{_COMPOSE}test_gpu_reservation_only_in_overrides",
    ),
    (
        "docs/DOCKER.md",
        r"docker/certs/make-certs\.sh -n 3|sudo chgrp -R 49999 .*|chmod -R g\+rX .*"
        r"|docker compose -f docker-compose\.yml -f docker-compose\.tls\.yml up -d.*"
        r"|docker/certs/register-nodes\.sh docker-tls .*|flwr supernode list docker-tls"
        r"|flwr run \. docker-tls --stream .*",
        f"{_DOCKER}test_tls.py::test_documented_tls_run_completes",
    ),
    (
        "docs/DOCKER.md",
        r"docker/certs/make-certs\.sh -n 3 \S+ \S+",
        _MACHINES,
    ),
    # the one-host rehearsal of Part C (its table and these lines: test_machines.py reads them)
    ("docs/DOCKER.md", r"docker/certs/make-certs\.sh -n 3 HOST_IP", _MACHINES),
    (
        "docs/DOCKER.md",
        r"docker compose -p corbin-fl-client-\d -f docker-compose\.client\.yml"
        r" --env-file docker/client-\d\.env up -d",
        _MACHINES,
    ),
    (
        "docs/DOCKER.md",
        r"sudo cp -r docker/certs/out/node-\d docker/certs/client-\d && sudo chown .*",
        f"{_HERE}test_one_host_rehearsal_is_consistent",
    ),
    (
        "docs/DOCKER.md",
        r"docker compose -f docker-compose\.server\.yml .*",
        _MACHINES,
    ),
    (
        "docs/DOCKER.md",
        r"(ssh|scp) .*client1\.example\.org.*",
        f"{_COMPOSE}test_client_compose_takes_its_settings_from_env",
    ),
    (
        "docs/DOCKER.md",
        r"sudo chown -R 49999:49999 docker/certs/node"
        r"|docker compose -f docker-compose\.client\.yml (--env-file|logs) (?!.* restart ).*",
        _MACHINES,
    ),
    (
        "docs/DOCKER.md",
        r"cp docker/\.env\.example docker/\.env",
        _MACHINES,
    ),
    (
        "docs/DOCKER.md",
        r"docker/certs/register-nodes\.sh prod .*",
        _MACHINES,
    ),
    (
        "docs/DOCKER.md",
        r"flwr run \. prod --stream .*|docker kill corbin-fl-server-superlink-1"
        r"|flwr log <RUN_ID> prod --stream|flwr supernode list prod"
        r"|docker compose -f docker-compose\.client\.yml --env-file docker/\.env restart supernode",
        _MACHINES_RUN,
    ),
]


def documented_commands(doc: str) -> list[str]:
    """The command lines of ``doc``'s ``bash`` blocks (continuations joined, comments dropped)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(" ".join(line.split()))
    return out


def _entries(doc: str) -> list[tuple[str, str]]:
    return [(pattern, test) for d, pattern, test in COVERAGE if d == doc]


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_is_run_or_checked(doc: str) -> None:
    entries = _entries(doc)
    commands = documented_commands(doc)
    assert commands, f"{doc} has no bash block"
    for command in commands:
        hits = [test for pattern, test in entries if re.fullmatch(pattern, command)]
        assert len(hits) == 1, f"{doc}: {command!r} is covered by {hits or 'no test'}"
    for pattern, _test in entries:  # no entry for a command that has left the document
        assert any(re.fullmatch(pattern, c) for c in commands), f"{doc}: nothing matches {pattern}"


@pytest.mark.parametrize("test", sorted({test for _, _, test in COVERAGE}))
def test_every_named_test_exists(test: str) -> None:
    path, name = test.split("::")
    source = (REPO / path).read_text(encoding="utf-8")  # a test, or the fixture that runs it
    assert re.search(rf"^def {re.escape(name)}\(", source, flags=re.M), test


# ====================================================================== static checks
def test_readme_main_job_installs_what_it_runs() -> None:
    """The main job's install pins the CPU torch wheel .ci/run installs, its extra provides the
    ``corbin-fl`` command, and ``bash .ci/run`` is the CI entry point."""
    import tomllib

    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q torch==2.13.0" in ci
    with (REPO / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    assert project["scripts"]["corbin-fl"].startswith("corbin_fl.deploy.cli:")
    assert "tools" in project["optional-dependencies"]


def test_dev_extra_runs_the_tests() -> None:
    """The documented test command needs pytest and pytest-xdist (``-n``), which only the ``dev``
    extra installs, and the install line before it asks for that extra."""
    import tomllib

    with (REPO / "pyproject.toml").open("rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in extras["dev"]}
    assert {"pytest", "pytest-xdist", "ruff", "mypy"} <= names, names
    assert not any(r.startswith("pytest") for name, e in extras.items() if name != "dev" for r in e)
    commands = documented_commands("docs/RUNNING.md")
    test = commands.index("python -m pytest -q -n 2 tests/unit")
    assert commands[test - 1] == 'pip install -e ".[dev,simulation]"', commands[test - 1]


def test_copy_destinations_exist() -> None:
    """A documented ``docker compose cp SRC ./a/b`` copies into a folder that exists in a fresh
    clone or that the command before it makes: ``docker cp`` does not create ``./a``."""
    commands = documented_commands("docs/DOCKER.md")
    copies = [i for i, c in enumerate(commands) if c.startswith("docker compose cp ")]
    assert copies
    for i in copies:
        parent = str(Path(shlex.split(commands[i])[-1]).parent)
        made = shlex.split(commands[i - 1])
        tracked = (REPO / parent).is_dir() and parent not in (".", "runs")
        assert parent == "." or tracked or made == ["mkdir", "-p", parent], commands[i - 1 : i + 1]


def test_one_host_rehearsal_is_consistent() -> None:
    """DOCKER.md's one-host rehearsal of Part C: one project, settings file and pair of
    subnets per machine, all distinct (the server's project is docker-compose.server.yml's
    name); each client's `up -d` is Part C's with its own project and settings file; each
    client's node folder is copied from its own node-K and given to uid 49999."""
    import ipaddress

    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8")
    section = doc.split("## Rehearsing Part C on one host", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"server|client \d", cells[0]):
            rows[cells[0]] = cells[1:]
    assert set(rows) == {"server", "client 1", "client 2", "client 3"}, rows
    server_name = re.search(r"(?m)^name: (\S+)", (REPO / "docker-compose.server.yml").read_text())
    assert server_name and rows["server"][0] == server_name.group(1)
    nets = [ipaddress.ip_network(cell) for row in rows.values() for cell in row[2:4]]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :]), nets
    assert len({row[0] for row in rows.values()}) == len({row[1] for row in rows.values()}) == 4
    assert [rows[f"client {k}"][4] for k in (1, 2, 3)] == ["0", "1", "2"]
    commands = documented_commands("docs/DOCKER.md")
    (part_c_up,) = {
        c
        for c in commands
        if c.startswith("docker compose -f docker-compose.client.yml --env")
        and c.endswith(" up -d")
    }
    for k in (1, 2, 3):
        project, settings = rows[f"client {k}"][:2]
        up = part_c_up.replace("docker/.env", settings).replace(
            "compose -f", f"compose -p {project} -f"
        )
        assert up in commands, up
        copy = (
            f"sudo cp -r docker/certs/out/node-{k} docker/certs/client-{k} && "
            f"sudo chown -R 49999:49999 docker/certs/client-{k}"
        )
        assert copy in commands, copy
    assert "docker/certs/make-certs.sh -n 3 HOST_IP" in commands


def test_install_lines_are_the_ci_ones() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "torch==2.13.0" in ci and "simulation" in ci


def test_hub_downloads_land_where_the_next_command_reads() -> None:
    """``huggingface-cli download X --local-dir D`` is followed by a run that reads ``D``."""
    commands = documented_commands("docs/RUNNING.md")
    for i, command in enumerate(commands):
        if command.startswith("huggingface-cli download"):
            argv = shlex.split(command)
            local_dir = argv[argv.index("--local-dir") + 1]
            assert argv[argv.index("--repo-type") + 1] == "dataset"
            assert f'data-dir="{local_dir}"' in commands[i + 1], commands[i + 1]


def test_flower_process_lines_parse() -> None:
    """Flower's own parsers accept every documented ``flower-superlink`` / ``flower-supernode``
    line (a second machine runs them)."""
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    parsers = {
        "flower-superlink": _parse_args_run_superlink,
        "flower-supernode": _parse_args_run_supernode,
    }
    seen = set()
    for doc in DOCS:
        for command in documented_commands(doc):
            argv = shlex.split(command)
            if argv[0] in parsers:
                args = parsers[argv[0]]().parse_args(argv[1:])
                assert args.insecure, command
                if argv[0] == "flower-superlink":  # Flower must not install the app at run time
                    assert "--disable-runtime-dependency-installation" in argv, command
                seen.add(argv[0])
    assert seen == set(parsers)


def test_flwr_lines_parse() -> None:
    """The ``flwr`` subcommands of docs/RUNNING.md exist with the documented arguments (``--help``
    after them: Flower's CLI checks the path, nothing is sent)."""
    from flwr.cli.app import app
    from typer.testing import CliRunner

    runner = CliRunner()
    checked = 0
    for command in documented_commands("docs/RUNNING.md"):
        argv = shlex.split(command.replace("<run-id>", "1"))
        if argv[0] == "flwr" and argv[1] in ("ls", "log", "stop", "supernode"):
            res = runner.invoke(app, [*argv[1:], "--help"])
            assert res.exit_code == 0, (command, res.output[-800:])
            checked += 1
    assert checked >= 4


def test_benchmark_lines_parse() -> None:
    """Every documented benchmark command's flags parse (``--help`` after them)."""
    for doc in DOCS:
        for command in documented_commands(doc):
            argv = shlex.split(command)
            if argv[:2] == ["python", "bench/bench_deployment.py"]:
                res = subprocess.run(
                    [sys.executable, *argv[1:], "--help"],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
                assert res.returncode == 0, (command, res.stderr[-800:])


def test_the_flag_tables_defaults_are_the_parsers() -> None:
    """Each ``(default N)`` of docs/RUNNING.md's flag table is the ``corbin-fl local`` parser's
    default of the flag named last before it (``--kill-delay`` inside ``--kill-client``'s row),
    or, for a flag that sets a run-config key (the parser's default None), the app's default of
    that key; a flag whose row says "Default none fixed" has no default."""
    import dataclasses

    from corbin_fl.app.config import AppConfig
    from corbin_fl.deploy import cli

    local = cli.build_parser().parse_args(["local"])
    app_defaults = {f.name: f.default for f in dataclasses.fields(AppConfig)}
    rows = [
        line
        for line in (REPO / "docs/RUNNING.md").read_text().splitlines()
        if line.startswith("| `--")
    ]
    checked = 0
    for row in rows:
        for m in re.finditer(r"\(default (\d+(?:\.\d+)?)\)", row):
            flag = re.findall(r"`(--[a-z-]+)", row[: m.start()])[-1]
            value = getattr(local, flag[2:].replace("-", "_"))
            if value is None and (key := re.search(r"run config `([a-z-]+)`", row)):
                value = app_defaults[key.group(1).replace("-", "_")]
            assert value is not None and float(value) == float(m.group(1)), (flag, value, row)
            checked += 1
        if "Default none fixed" in row:
            flag = re.findall(r"`(--[a-z-]+)", row)[0]
            assert getattr(local, flag[2:].replace("-", "_")) is None, row
            checked += 1
    assert checked >= 5


def test_the_documented_pace_is_the_code_s() -> None:
    """docs/RUNNING.md's figures for a run without ``--timeout`` and for a quiet stream are
    ``deploy/pace.py``'s constants (and ``corbin-fl local --help`` prints the same)."""
    from corbin_fl.deploy import cli
    from corbin_fl.deploy.pace import PACE_FACTOR, PACE_SLACK_S, STATUS_CHECK_MIN_S

    text = " ".join((REPO / "docs/RUNNING.md").read_text().split())
    pace = f"{PACE_FACTOR:g} x the slowest round each, plus {PACE_SLACK_S:g} s"
    assert pace in text
    assert f"the slowest round so far (at least {STATUS_CHECK_MIN_S:g} s)" in text
    local = cli.build_parser().parse_args(["local"])._cli_parser
    assert pace in " ".join(local.format_help().split())

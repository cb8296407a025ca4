"""What ``pip install corbin-fl`` puts in site-packages: one top-level name, ``corbin_fl``.

The project's top-level folders (``server/``, ``client/``, ``mechanisms/``, ``deploy/``,
``experiments/``) are installed as ``corbin_fl.server`` and so on (pyproject's
``[tool.setuptools.package-dir]``), so a user's own Flower app with its own ``client`` and
``server`` packages installs this project beside them and uses its building block.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

from waits import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]

# A throwaway Flower app with its own `client` and `server` packages, as a user writes it.
APP_FILES = {
    "client/__init__.py": 'OWNER = "the user\'s client package"\n',
    "client/app.py": textwrap.dedent(
        """\
        from flwr.clientapp import ClientApp

        from corbin_fl import corbin_mod

        app = ClientApp(mods=[corbin_mod])
        """
    ),
    "server/__init__.py": 'OWNER = "the user\'s server package"\n',
    "server/app.py": textwrap.dedent(
        """\
        from flwr.serverapp import ServerApp
        from flwr.serverapp.strategy import FedAvg

        from corbin_fl import CorBin

        strategy = CorBin(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), epsilon=1.0)
        app = ServerApp()
        """
    ),
}

CHECK = textwrap.dedent(
    """\
    import json, sys
    from pathlib import Path

    from flwr.supercore.object_ref import load_app

    import client, server
    import corbin_fl.client.mod, corbin_fl.mechanisms.quantizers, corbin_fl.server.strategy

    client_app = load_app("client.app:app", ValueError, Path.cwd())
    server_app = load_app("server.app:app", ValueError, Path.cwd())
    print(json.dumps({
        "client": client.__file__, "server": server.__file__, "client_owner": client.OWNER,
        "server_owner": server.OWNER, "corbin_fl": corbin_fl.__file__,
        "corbin_fl.server": corbin_fl.server.strategy.__file__,
        "mod": corbin_fl.client.mod.corbin_mod.__name__,
        "strategy": type(sys.modules["server.app"].strategy).__name__,
        "apps": [type(client_app).__name__, type(server_app).__name__],
    }))
    """
)


def test_the_wheel_installs_one_top_level_name_beside_a_users_client_and_server(
    tmp_path: Path,
) -> None:
    # Built from a copy of the checkout's files: a build in the checkout leaves build/lib, whose
    # stale modules setuptools would ship again.
    src = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True, timeout=HANG_GUARD_S,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        if (REPO / rel).is_file() and not rel.startswith("docs/"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / rel, src / rel)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(src)],
        check=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    (wheel,) = wheels.glob("corbin_fl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"corbin_fl"}, top
    # Every package of the tree is in the wheel (a subpackage missing from pyproject's list would
    # import from a checkout and fail once installed).
    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in folders["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(REPO / folder).as_posix()
            inside = package.replace(".", "/") + ("" if sub == "." else f"/{sub}")
            assert f"{inside}/__init__.py" in names, f"{init} is not in the wheel"
    assert "corbin_fl/mvu_tables/" in "\n".join(names)  # package data travels too

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    app = tmp_path / "app"
    for rel, text in APP_FILES.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    # The user's app folder first, then the installed copy: never this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app), str(site)])}
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=app, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["client_owner"] == "the user's client package"
    assert seen["server_owner"] == "the user's server package"
    assert Path(seen["client"]).parent == app / "client"
    assert Path(seen["server"]).parent == app / "server"
    assert Path(seen["corbin_fl"]).parent == site / "corbin_fl"
    assert Path(seen["corbin_fl.server"]) == site / "corbin_fl" / "server" / "strategy.py"
    assert seen["mod"] == "corbin_mod"
    assert seen["strategy"] == "CorBin"
    assert seen["apps"] == ["ClientApp", "ServerApp"]

"""CorBin-FL on Flower: differentially private FL with correlated one-bit quantization
(arXiv 2409.13133).

The building block any Flower app adopts::

    from corbin_fl import CorBin, corbin_mod

    strategy = CorBin(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), epsilon=1.0)  # ServerApp
    app = ClientApp(mods=[corbin_mod])                                                # ClientApp

:class:`corbin_fl.server.strategy.CorBin` wraps a Flower Message-API strategy;
:func:`corbin_fl.client.mod.corbin_mod` is the ClientApp mod. Both are imported on first use, so
``import corbin_fl`` stays cheap.

One installed name
------------------
The project's top-level folders are subpackages of this one: ``server/`` is ``corbin_fl.server``,
``client/`` is ``corbin_fl.client``, ``mechanisms/`` is ``corbin_fl.mechanisms``, ``deploy/`` and
``experiments/`` (the tooling) are ``corbin_fl.deploy`` and ``corbin_fl.experiments``. An installed
copy has them inside this folder (``[tool.setuptools.package-dir]`` in ``pyproject.toml``), so
``pip install corbin-fl`` adds no generic top-level name beside a user's own ``client`` or
``server`` package. A source tree (this checkout on ``sys.path``, or the app bundle that Flower
unpacks on a SuperNode, which ships the folders as they are) has them beside this folder: the
tree's root is then searched for this package's subpackages as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

_HERE = Path(__file__).resolve().parent
if not (_HERE / "server").is_dir() and (_HERE.parent / "server" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # a source tree: corbin_fl.server is ../server

if TYPE_CHECKING:
    from corbin_fl.client.mod import corbin_mod
    from corbin_fl.server.strategy import CorBin

__all__ = ["CorBin", "corbin_mod"]


def __getattr__(name: str) -> Any:
    # Imported on first use (PEP 562), not at the top: every ``import corbin_fl.<module>`` runs
    # this file first, and a ClientApp process must not load the strategy for it, nor a
    # ServerApp the mod (``import corbin_fl`` stays cheap: the module docstring).
    if name == "CorBin":
        from corbin_fl.server.strategy import CorBin

        return CorBin
    if name == "corbin_mod":
        from corbin_fl.client.mod import corbin_mod

        return corbin_mod
    raise AttributeError(f"module 'corbin_fl' has no attribute {name!r}")

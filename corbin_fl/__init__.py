"""CorBin-FL on Flower: differentially private FL with correlated one-bit quantization
(arXiv 2409.13133).

The building block any Flower app adopts::

    from corbin_fl import CorBin, corbin_mod

    strategy = CorBin(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), epsilon=1.0)  # ServerApp
    app = ClientApp(mods=[corbin_mod])                                                # ClientApp

:class:`server.strategy.CorBin` wraps a Flower Message-API strategy; :func:`client.mod.corbin_mod`
is the ClientApp mod. Both are imported on first use, so ``import corbin_fl`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.mod import corbin_mod
    from server.strategy import CorBin

__all__ = ["CorBin", "corbin_mod"]


def __getattr__(name: str) -> Any:
    if name == "CorBin":
        from server.strategy import CorBin

        return CorBin
    if name == "corbin_mod":
        from client.mod import corbin_mod

        return corbin_mod
    raise AttributeError(f"module 'corbin_fl' has no attribute {name!r}")

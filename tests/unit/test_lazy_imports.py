"""What a ClientApp process imports before it trains: no torch.

Flower starts a fresh ClientApp process for every instruction, and most instructions (key
generation, the pair relay, the secure-aggregation stages, evaluation on a node without a model)
need no torch, whose import costs about 2 CPU-s per process on the development machine and 4.6 s
on the H100 machine's host (docs/BENCHMARKS.md). Only the training handler and the encoder import
it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

NO_TORCH = [
    "corbin_fl.app.client_app",
    "corbin_fl.client.mod",
    "corbin_fl.client.secure_update",
    "corbin_fl.registry",
    "corbin_fl.config",
    "corbin_fl.wire",
    "corbin_fl.mechanisms",
    "corbin_fl.mechanisms.categories",
    "corbin_fl.secagg.client",
    "corbin_fl.secagg.node",
]


def _imports_torch(module: str) -> bool:
    code = textwrap.dedent(
        f"""
        import sys
        import {module}
        print("torch" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return out.strip() == "True"


@pytest.mark.parametrize("module", NO_TORCH)
def test_the_clientapp_path_does_not_import_torch(module: str) -> None:
    assert not _imports_torch(module), f"importing {module} imports torch"


def test_the_control_imports_torch() -> None:
    """The check can fail: the quantizers need torch, and importing them loads it."""
    assert _imports_torch("corbin_fl.mechanisms.quantizers")


def test_the_lazy_reexports_are_the_submodules_objects() -> None:
    import corbin_fl.mechanisms as mech
    from corbin_fl.mechanisms import packing, quantizers, randomness

    assert sorted(mech.__all__) == sorted(mech._SOURCE)
    assert mech.corbinq is quantizers.corbinq
    assert mech.pack_bits is packing.pack_bits
    assert mech.PROTOCOL_VERSION == randomness.PROTOCOL_VERSION
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = mech.nope


@pytest.mark.parametrize(
    "module", ["corbin_fl.mechanisms.accounting", "corbin_fl.mechanisms.analytic_gaussian"]
)
def test_the_accountant_does_not_import_torch(module: str) -> None:
    """Every ``corbin-fl experiment`` command imports the accountant (experiments/plots.py reads
    its THREAT_MODELS); torch would add about 1.3 CPU-s to each."""
    assert not _imports_torch(module), f"importing {module} imports torch"

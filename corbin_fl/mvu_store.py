"""Where the I-MVU designs live on disk: shipped with the app, else solved once and cached.

The design for ``(eps, bits, inputs)`` (``mechanisms.baselines.imvu.solve_mvu``, searched from the
design with the next smaller budget, which it is never worse than) takes from seconds (1 and 2
bits) to minutes (4 bits). :func:`mvu_table` looks it up, in order, in the tables
shipped with the app (:data:`SHIPPED`, solved ahead by ``bench/solve_mvu_tables.py`` for the
experiments' eps grid), in the user's cache (``$CORBIN_FL_CACHE/imvu/``, default
``~/.cache/corbin-fl/imvu/``), else solves it and stores it in the cache. Every file holds its
inputs; one whose inputs differ or whose table fails ``MVUTable.check`` (stochastic, unbiased,
exactly eps-LDP) is ignored, so a tampered file cannot weaken the privacy. An unwritable cache
only costs the solve next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from corbin_fl.fsio import CACHE_ENV, atomic_write_json, cache_root
from corbin_fl.mechanisms.baselines.imvu import (
    IMVU_BITS,
    INPUT_POINTS,
    SOLVER_VERSION,
    MVUTable,
    solve_mvu,
)
from corbin_fl.mechanisms.validate import integer, positive

__all__ = ["CACHE_ENV", "SHIPPED", "mvu_table", "write_table"]

logger = logging.getLogger(__name__)

SHIPPED = Path(__file__).with_name("mvu_tables")
"""Tables solved ahead for the experiments' eps grid (``bench/solve_mvu_tables.py``)."""


def cache_dir() -> Path:
    """``imvu/`` under :func:`corbin_fl.fsio.cache_root` (``$CORBIN_FL_CACHE``)."""
    return cache_root() / "imvu"


def _file_name(eps: float, bits: int, inputs: int) -> str:
    key = json.dumps([SOLVER_VERSION, float(eps).hex(), bits, inputs])
    return f"mvu-b{bits}-n{inputs}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _table_of(doc: Any, eps: float, bits: int, inputs: int) -> MVUTable | None:
    """The checked table in ``doc`` if it was solved for these inputs, else None."""
    if (doc["version"], doc["eps"], doc["bits"], doc["inputs"]) != (
        SOLVER_VERSION,
        eps,
        bits,
        inputs,
    ):
        return None
    table = MVUTable(
        eps,
        bits,
        inputs,
        np.array(doc["transition"], dtype=np.float64),
        np.array(doc["values"], dtype=np.float64),
        float(doc["mean_variance"]),
    )
    table.check()
    return table


def read_table(path: Path, eps: float, bits: int, inputs: int) -> MVUTable | None:
    """The table stored at ``path`` if it is for these inputs and passes the check, else None."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("MVU table %s unreadable (%s)", path, exc)
        return None
    try:
        table = _table_of(doc, eps, bits, inputs)
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("MVU table %s refused (%s)", path, exc)
        return None
    if table is None:
        logger.warning("MVU table %s holds other inputs", path)
    return table


def write_table(table: MVUTable, folder: Path) -> Path:
    """Store ``table`` with its inputs in ``folder`` (atomic, durable); returns the file."""
    doc = {
        "version": SOLVER_VERSION,
        "eps": table.eps,
        "bits": table.bits,
        "inputs": table.inputs,
        "transition": table.transition.tolist(),
        "values": table.values.tolist(),
        "mean_variance": table.mean_variance,
    }
    path = Path(folder) / _file_name(table.eps, table.bits, table.inputs)
    atomic_write_json(path, doc, allow_nan=False)
    return path


@lru_cache(maxsize=64)
def mvu_table(eps: float, bits: int, inputs: int = INPUT_POINTS) -> MVUTable:
    """The MVU design for ``(eps, bits, inputs)``, solved at most once per machine (module
    docstring); a solve starts from this function's design with the next smaller budget."""
    e, b, n = positive(eps), integer(bits, "bits", 1), integer(inputs, "inputs", 2)
    if b not in IMVU_BITS:
        raise ValueError(f"bits must be one of {IMVU_BITS}, got {b}")
    for folder in (SHIPPED, cache_dir()):
        table = read_table(folder / _file_name(e, b, n), e, b, n)
        if table is not None:
            return table
    below = [c for c in IMVU_BITS if c < b]
    table = solve_mvu(e, b, n, lower=mvu_table(e, below[-1], n) if below else None)
    try:
        write_table(table, cache_dir())
    except OSError as exc:
        logger.warning("MVU cache %s not written (%s)", cache_dir(), exc)
    return table

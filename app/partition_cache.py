"""Clients' partitions kept on disk, so a fresh ClientApp process skips ``flwr_datasets``.

A partition is a pure function of its inputs: the training indices in their order, their labels
(and writers / roles for ``natural``), the number of partitions, the partitioner, ``alpha``, the
seed, the minimum size, and the versions of ``flwr-datasets`` and ``datasets`` that computed it.
Computing it needs the ``flwr_datasets`` partitioners, whose import (Hugging Face ``datasets``,
pandas, pyarrow) costs a fresh process 2-4 CPU-seconds; Flower starts one such process for the
first training message of every node in every run. :func:`load` and :func:`store` keep every
partition of one set of inputs in ``<cache root>/partitions/<sha256 of the inputs>.npz``
(:func:`corbin_fl.fsio.cache_root`).

A file is only a shortcut: it is used when it holds the same input digest and its partitions are
disjoint subsets of the training indices of the expected count, each of at least the minimum
size; anything else (a missing, truncated, foreign or edited file) is ignored and recomputed. An
unwritable cache costs only the recomputation. The cache holds indices into data the node
already has, nothing more.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from corbin_fl.fsio import atomic_write_bytes, cache_root

__all__ = ["digest", "load", "store"]

logger = logging.getLogger(__name__)

_FORMAT = 1


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def digest(
    train: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray | None,
    *,
    num_partitions: int,
    partitioner: str,
    alpha: float,
    seed: int,
    min_partition_size: int,
) -> str:
    """SHA-256 (hex) of every input of a partitioning, library versions included."""
    h = hashlib.sha256()
    head = [
        _FORMAT,
        _version("flwr-datasets"),
        _version("datasets"),
        num_partitions,
        partitioner,
        float(alpha).hex(),
        seed,
        min_partition_size,
        groups is not None,
    ]
    h.update(json.dumps(head).encode())
    for arr in (train, labels) if groups is None else (train, labels, groups):
        h.update(np.int64(arr.size).tobytes())
        h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_root() / "partitions" / f"{key}.npz"


def load(
    key: str, train: np.ndarray, num_partitions: int, min_partition_size: int
) -> tuple[np.ndarray, ...] | None:
    """The partitions stored for ``key``, if present and consistent with ``train``, else None."""
    path = _path(key)
    try:
        with np.load(path, allow_pickle=False) as doc:
            stored = str(doc["key"])
            parts = tuple(np.asarray(doc[f"p{i}"]) for i in range(num_partitions))
            extra = len(doc.files) != num_partitions + 1
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        logger.debug("partition cache %s ignored: %s", path, exc)
        return None
    if stored != key or extra:
        problem: str | None = "it was written for other inputs"
    else:
        problem = _check(parts, train, min_partition_size)
    if problem is not None:
        logger.warning("partition cache %s ignored: %s", path, problem)
        return None
    for part in parts:
        part.flags.writeable = False
    return parts


def _check(parts: tuple[np.ndarray, ...], train: np.ndarray, min_size: int) -> str | None:
    """Why ``parts`` cannot be partitions of ``train``, or None."""
    if any(p.ndim != 1 or p.dtype != np.int64 or p.size < min_size for p in parts):
        return f"a partition is not a 1-D int64 array of >= {min_size} indices"
    rows = np.concatenate(parts)
    if np.unique(rows).size != rows.size or not np.isin(rows, train).all():
        return "the partitions are not disjoint subsets of the training indices"
    return None


def store(key: str, parts: tuple[np.ndarray, ...]) -> None:
    """Write ``parts`` for ``key`` atomically; a failure is logged, never raised."""
    path = _path(key)
    buf = io.BytesIO()
    named: dict[str, Any] = {f"p{i}": p for i, p in enumerate(parts)}  # Any: savez's stubs
    np.savez(buf, key=np.array(key), **named)
    try:
        atomic_write_bytes(path, buf.getvalue())  # creates the folder
    except OSError as exc:
        logger.warning("partition cache %s not written (%s)", path, exc)

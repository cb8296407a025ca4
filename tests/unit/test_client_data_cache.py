"""The ClientApp keeps its partition rows in ``context.state`` (no partitioner in later rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from corbin_fl.app import data
from corbin_fl.app import train as client_train
from corbin_fl.app.config import AppConfig


def _context() -> Context:
    return Context(1, 7, {"partition-id": 1, "num-partitions": 3}, RecordDict(), {})


def test_rows_cached_in_state_and_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AppConfig.from_flower({})
    ctx = _context()
    first = client_train.local_dataset(cfg, ctx, 1, 3)
    expected = data.client_dataset(cfg.dataset, 1, 3, data_seed=cfg.data_seed)
    assert np.array_equal(first.tensors[1].numpy(), expected.tensors[1].numpy())
    assert np.array_equal(first.tensors[0].numpy(), expected.tensors[0].numpy())

    def no_partitioner(*args: object, **kwargs: object) -> None:
        raise AssertionError("partitioner called although the rows are in context.state")

    monkeypatch.setattr(data, "client_rows", no_partitioner)
    again = client_train.local_dataset(cfg, ctx, 1, 3)
    assert np.array_equal(again.tensors[1].numpy(), expected.tensors[1].numpy())


def test_cache_key_change_recomputes(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context()
    client_train.local_dataset(AppConfig.from_flower({}), ctx, 1, 3)
    calls: list[int] = []
    real = data.client_rows

    def counting(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "client_rows", counting)
    client_train.local_dataset(AppConfig.from_flower({"data-seed": 5}), ctx, 1, 3)
    assert calls == [1]


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (np.array([[1, 2]]), "1-D integer"),
        (np.array([0.5]), "1-D integer"),
        (np.array([], dtype=np.int64), "empty"),
        (np.array([-1]), r"lie in \[0"),
        (np.array([10**9]), r"lie in \[0"),
        (np.array([3, 3]), "distinct"),
    ],
)
def test_dataset_rows_validates(rows: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        data.dataset_rows("mnist", rows)

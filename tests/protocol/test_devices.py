"""The training device of each client in the run's records (``metrics.jsonl``, ``summary.json``).

This project's train handler names the device it trained on in its reply
(``train-info{device}``, :func:`corbin_fl.devices.device_label`); the server checks the name as
untrusted input (:func:`server.metrics.client_device`: a bounded string of a known shape), records
it per client, and never drops a node or fails a round over it. The CUDA cases run where a CUDA
device exists (``-m device``; ``bench/gpu_check.py`` runs them).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Message, RecordDict

# In-process harness: Flower task identity, tiny model and stub training (autouse fixtures).
from harness import InProcessGrid, make_cfg, reply_hook, run

from corbin_fl import wire
from corbin_fl.app import train as client_train
from corbin_fl.devices import device_label
from corbin_fl.server import metrics as server_metrics
from corbin_fl.server.metrics import INVALID_DEVICE, RunFiles, client_device, client_devices

N_NODES = 3
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _run(grid: InProcessGrid) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The whole run over ``grid``: its ``metrics.jsonl`` rows and ``summary.json``."""
    rows: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunFiles, "metrics", lambda self, rec: rows.append(copy.deepcopy(rec)))
        summary = run(grid)
    return rows, summary


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.device, CUDA])])
def test_each_client_s_device_is_recorded(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import corbin_fl.app.training
    from corbin_fl.app.training import TrainResult

    def fake_train(model: torch.nn.Module, dataset: Any, *, seed: int, **_: Any) -> TrainResult:
        """The protocol stub's seeded noise, drawn on the CPU and added on the model's device."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_((1e-3 * torch.randn(p.shape, generator=gen)).to(p.device))
        return TrainResult(loss=1.0, num_examples=64, steps=1, seconds=0.0, examples_seen=64)

    monkeypatch.setattr(corbin_fl.app.training, "train_local", fake_train)
    grid = InProcessGrid(make_cfg(num_rounds=2, device=device), N_NODES)
    rows, summary = _run(grid)
    expected = device_label(torch.device(device))
    if device == "cuda":
        assert re.fullmatch(r"cuda:\d+ \(.+\)", expected), expected
    nodes = [str(n) for n in grid.node_ids]
    assert [row["devices"] for row in rows] == [dict.fromkeys(nodes, expected)] * 2
    assert summary["client_devices"] == dict.fromkeys(nodes, expected)
    # The handler's seconds and their parts (means over the clients), in every row.
    for row in rows:
        secs = row["clientapp_seconds"]
        parts = [secs[k] for k in ("import", "device", "model", "data", "setup", "train")]
        assert all(v is not None and v >= 0.0 for v in [*parts, secs["handler"], secs["encode"]])
        assert sum(parts) <= secs["handler"] + 1e-9, secs
    # The device starts once per process: the second round's handlers (same process) skip it.
    assert rows[1]["clientapp_seconds"]["device"] == 0.0


def test_device_label() -> None:
    assert device_label(torch.device("cpu")) == "cpu"
    assert client_device(RecordDict({"i": ConfigRecord({"device": "cpu"})})) == "cpu"


@pytest.mark.device
@CUDA
def test_device_label_of_cuda() -> None:
    label = device_label(torch.device("cuda"))
    index = torch.cuda.current_device()
    assert label.startswith(f"cuda:{index} (") and len(label) <= server_metrics.MAX_DEVICE_CHARS
    assert label == device_label(torch.device(f"cuda:{index}"))
    assert client_device(RecordDict({"i": ConfigRecord({"device": label})})) == label


@pytest.mark.parametrize(
    ("value", "recorded"),
    [
        ("cpu", "cpu"),
        ("cuda:0 (NVIDIA H100 80GB HBM3)", "cuda:0 (NVIDIA H100 80GB HBM3)"),
        ("cuda", "cuda"),
        ("mps", "mps"),
        ("xpu:1 (Intel Data Center GPU Max 1550)", "xpu:1 (Intel Data Center GPU Max 1550)"),
        ("cuda:0 (" + "A" * 80 + ")", "cuda:0 (" + "A" * 80 + ")"),
        ("cuda:0 (" + "A" * 81 + ")", INVALID_DEVICE),  # longer than a name may be
        ("cuda:0 ()", INVALID_DEVICE),
        ("cuda:0 (x) (y)", INVALID_DEVICE),
        ("cuda:0 (evil\nlog line)", INVALID_DEVICE),
        ("gpu", INVALID_DEVICE),
        ("CPU", INVALID_DEVICE),
        ("", INVALID_DEVICE),
        ("x" * 1000, INVALID_DEVICE),  # (the reply's app records stay under MAX_APP_BYTES)
        (7, INVALID_DEVICE),
        (b"cpu", INVALID_DEVICE),
        (["cpu"], INVALID_DEVICE),
        (None, None),  # no device named: an app that does not report it
    ],
    ids=lambda v: repr(v)[:24],
)
def test_a_client_s_device_name_is_untrusted(value: Any, recorded: str | None) -> None:
    """Whatever a client names, the round goes on: the name is recorded if it has the known
    shape, as ``invalid`` if not, and not at all if absent."""
    grid = InProcessGrid(make_cfg(num_rounds=1), N_NODES)
    liar = grid.node_ids[1]

    def rename(instruction: Message, reply: Message) -> list[Message]:
        content = copy.deepcopy(reply.content)
        if value is None:
            del content[client_train.TRAIN_INFO]
        else:
            content[client_train.TRAIN_INFO] = ConfigRecord({"device": value})
        return [Message(content, reply_to=instruction)]

    grid.hooks.append(reply_hook(wire.UPDATE, liar, rename))
    rows, summary = _run(grid)
    assert len(rows) == 1 and rows[0]["participants"] == N_NODES and rows[0]["dropped"] == {}
    devices = rows[0]["devices"]
    assert devices == {str(n): "cpu" if n != liar else recorded for n in grid.node_ids}
    expected = {str(n): "cpu" for n in grid.node_ids if n != liar}
    if recorded is not None:
        expected[str(liar)] = recorded
    assert summary["client_devices"] == expected


def test_client_devices_over_rows() -> None:
    rows: list[dict[str, Any]] = [
        {"round": 1},  # a row written before devices were recorded (an older checkpoint)
        {"round": 2, "devices": {"5": "cpu", "9": "cuda:0 (A)"}},
        {"round": 3, "devices": {"5": "cuda:1 (B)", "9": None, "11": "cpu"}},
        {"round": 4, "devices": "cpu"},
    ]
    assert client_devices(rows) == {"5": "cpu, cuda:1 (B)", "9": "cuda:0 (A)", "11": "cpu"}

"""Fixtures of every protocol test (autouse): Flower's task identity, quiet logs, and stubbed
data, model, training and evaluation (a test named in ``REAL_TRAINING`` keeps the real ones)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity
from harness import RUN_ID, SERVER_NODE


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Flower's ServerApp runtime sets before ``main`` runs (Message() needs it)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", RUN_ID)
    monkeypatch.setattr(TaskIdentity, "_node_id", SERVER_NODE)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


# ============================================================================ fixtures
REAL_TRAINING = {"test_real_training_and_evaluation_in_process"}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


@pytest.fixture(autouse=True)
def _stub_training(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Protocol tests need neither SGD nor a real model: the model is a 7,850-parameter linear
    layer, local training adds seeded noise to it, the data is 64 random images and evaluation a
    fixed score (one test keeps the real CNN, data, training and evaluation)."""
    if request.node.originalname in REAL_TRAINING:
        from corbin_fl.app import train as client_train

        monkeypatch.setattr(client_train.LocalTask, "_cache", {})
        return
    import corbin_fl.app.data
    import corbin_fl.app.models
    import corbin_fl.app.training
    from corbin_fl.app import train as client_train
    from corbin_fl.app.training import EvalResult, TrainResult

    def fake_data(cfg: Any, context: Any, partition_id: int, num_partitions: int) -> Any:
        gen = torch.Generator().manual_seed(partition_id)
        x = torch.randn(64, 1, 28, 28, generator=gen)
        return torch.utils.data.TensorDataset(x, torch.randint(0, 10, (64,), generator=gen))

    def fake_train(model: torch.nn.Module, dataset: Any, *, seed: int, **_: Any) -> TrainResult:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=gen))
        return TrainResult(loss=1.0, num_examples=64, steps=1, seconds=0.0, examples_seen=64)

    def fake_eval(model: torch.nn.Module, dataset: Any, **_: Any) -> EvalResult:
        return EvalResult(loss=2.0, accuracy=0.5, num_examples=10)

    def tiny_model(name: str, in_channels: int, num_classes: int, **kw: Any) -> torch.nn.Module:
        gen = torch.Generator().manual_seed(int(kw.get("seed") or 0))
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, num_classes))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        return model

    monkeypatch.setattr(corbin_fl.app.models, "build_model", tiny_model)
    monkeypatch.setattr(corbin_fl.app.models, "empty_model", tiny_model)  # the client's skeleton
    monkeypatch.setattr(client_train.LocalTask, "_cache", {})
    monkeypatch.setattr(client_train, "local_dataset", fake_data)
    monkeypatch.setattr(corbin_fl.app.data, "server_datasets", lambda *a, **k: (None, None))
    monkeypatch.setattr(corbin_fl.app.training, "train_local", fake_train)
    monkeypatch.setattr(corbin_fl.app.training, "evaluate", fake_eval)

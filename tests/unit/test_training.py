"""Tests of corbin_fl.app.training: device choice, the local training loop, evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from corbin_fl import devices
from corbin_fl import layout as flat
from corbin_fl.app import data, models, training


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run single-threaded: faster than 2 threads on a shared 2-core machine."""
    before = torch.get_num_threads()
    devices.set_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny_dataset(n: int = 40, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


# --------------------------------------------------------------------------- devices
def test_pick_device() -> None:
    auto = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert devices.pick_device() == auto
    assert devices.pick_device("auto") == auto
    assert devices.pick_device("") == auto
    assert devices.pick_device("CPU") == torch.device("cpu")
    assert devices.pick_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"invalid device|unsupported device"):
        devices.pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            devices.pick_device("cuda:0")
    else:
        with pytest.raises(ValueError, match="device"):
            devices.pick_device(f"cuda:{torch.cuda.device_count()}")


def test_set_threads_validation() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        devices.set_threads(0)
    with pytest.raises(TypeError, match="int"):
        devices.set_threads(1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- train_local
def test_train_local_seeded_and_counts(one_thread: None) -> None:
    ds = tiny_dataset(17)
    runs = []
    for seed in (7, 7, 8):
        model = models.build_model("cnn", 1, 10, seed=0)
        res = training.train_local(model, ds, epochs=2, batch_size=8, seed=seed, device="cpu")
        runs.append(flat.flatten(model))
        # 17 = 2 * 8 + 1: the trailing single-example batch is skipped in each epoch
        assert (res.steps, res.examples_seen, res.num_examples) == (4, 32, 17)
        assert math.isfinite(res.loss) and res.loss > 0 and res.seconds > 0
        assert model.training
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_train_local_max_steps_and_sgd(one_thread: None) -> None:
    ds = tiny_dataset(64)
    model = models.build_model("cnn", 1, 10, seed=1)
    model.eval()
    res = training.train_local(
        model, ds, epochs=5, batch_size=16, seed=0, device="cpu", max_steps=3
    )
    assert (res.steps, res.examples_seen) == (3, 48)
    assert not model.training  # mode restored
    before = flat.flatten(model)
    res = training.train_local(
        model, ds, epochs=1, batch_size=16, seed=0, device="cpu", optimizer="sgd", lr=0.05
    )
    assert res.steps == 4 and not torch.equal(before, flat.flatten(model))


def test_train_local_memorises_small_batch(one_thread: None) -> None:
    """Adam with the defaults drives the loss on 32 fixed examples well below log(10)."""
    ds = tiny_dataset(32, seed=3)
    model = models.build_model("cnn", 1, 10, seed=2)
    first = training.train_local(model, ds, epochs=1, batch_size=32, seed=0, device="cpu")
    last = training.train_local(model, ds, epochs=15, batch_size=32, seed=0, device="cpu")
    assert first.loss == pytest.approx(math.log(10), rel=0.15)
    assert training.evaluate(model, ds, device="cpu").loss < 0.5 * last.loss + 0.5 * first.loss
    assert training.evaluate(model, ds, device="cpu").accuracy > 0.8


def test_train_local_raises_on_divergence(one_thread: None) -> None:
    ds = tiny_dataset(16)
    ds.tensors[0][3, 0, 0, 0] = float("nan")
    model = models.build_model("cnn", 1, 10, seed=0)
    with pytest.raises(FloatingPointError, match="not finite"):
        training.train_local(model, ds, epochs=1, batch_size=16, seed=0, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"epochs": 0}, ValueError, "epochs"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"optimizer": "rmsprop"}, ValueError, "optimizer"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"weight_decay": -1.0}, ValueError, "weight_decay"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"seed": -3}, ValueError, "seed"),
        ({"max_steps": 0}, ValueError, "max_steps"),
        ({"device": "tpu"}, ValueError, "device"),
    ],
)
def test_train_local_validation(kwargs: dict, exc: type, message: str) -> None:
    args = {"epochs": 1, "batch_size": 4, "seed": 0, "device": "cpu"} | kwargs
    model = models.build_model("cnn", 1, 10, seed=0)
    with pytest.raises(exc, match=message):
        training.train_local(model, tiny_dataset(8), **args)


def test_dataset_validation() -> None:
    model = models.build_model("cnn", 1, 10, seed=0)
    x = torch.zeros(4, 1, 28, 28)
    with pytest.raises(TypeError, match="TensorDataset"):
        training.evaluate(model, [(x[0], 0)], device="cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int64"):
        training.evaluate(model, TensorDataset(x, torch.zeros(4, dtype=torch.int32)), device="cpu")
    with pytest.raises(TypeError, match="floating-point images or int64 letter indices"):
        training.evaluate(model, TensorDataset(x.int(), torch.zeros(4).long()), device="cpu")
    with pytest.raises(ValueError, match="empty"):
        training.evaluate(model, TensorDataset(x[:0], torch.zeros(0).long()), device="cpu")


# --------------------------------------------------------------------------- evaluate
def test_evaluate_against_hand_computation() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 3, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0], [-1.0, -1.0], [1.0, 1.5], [0.5, 0.0]])
    y = torch.tensor([0, 1, 2, 0, 2])
    # logits: [2,0,-2], [0,3,-3], [-1,-1,2], [1,1.5,-2.5], [0.5,0,-0.5] -> argmax 0,1,2,1,0
    logits = x @ model[1].weight.detach().T
    expected_loss = (
        sum(float(torch.logsumexp(logits[i], 0) - logits[i, y[i]]) for i in range(5)) / 5
    )
    model.train()
    res = training.evaluate(model, TensorDataset(x, y), batch_size=2, device="cpu")
    assert res.accuracy == pytest.approx(3 / 5)
    assert res.loss == pytest.approx(expected_loss, rel=1e-6)
    assert res.num_examples == 5
    assert model.training  # mode restored


# --------------------------------------------------------------------------- real MNIST
def test_small_cnn_learns_embedded_mnist(one_thread: None) -> None:
    """~1,070 real digits, 2 epochs: validation accuracy far above chance (0.1)."""
    train = data.client_dataset("mnist", 0, 3, data_seed=0)
    val, _ = data.server_datasets("mnist", data_seed=0)
    assert 1000 <= len(train) <= 1100
    model = models.build_model("cnn", 1, 10, seed=0)
    res = training.train_local(model, train, epochs=2, batch_size=32, seed=0, device="cpu")
    after = training.evaluate(model, val, device="cpu")
    assert res.num_examples == len(train) and res.steps == 2 * math.ceil(len(train) / 32)
    assert after.accuracy > 0.75, after
    assert after.loss < 0.5 * math.log(10), after  # the untrained model is at ~log(10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_and_evaluate_on_cuda() -> None:
    ds = tiny_dataset(40)  # CPU tensors: batches go through pinned memory
    model = models.build_model("cnn", 1, 10, seed=0)
    res = training.train_local(model, ds, epochs=2, batch_size=8, seed=0, device="cuda")
    assert res.steps == 10 and math.isfinite(res.loss)
    assert next(model.parameters()).device.type == "cuda"
    ev = training.evaluate(model, ds, device=devices.pick_device("cuda"))
    assert ev.num_examples == 40 and 0.0 <= ev.accuracy <= 1.0
    on_gpu = TensorDataset(*(t.cuda() for t in ds.tensors))  # data already on the device
    res2 = training.train_local(model, on_gpu, epochs=1, batch_size=8, seed=0, device="cuda")
    assert res2.steps == 5

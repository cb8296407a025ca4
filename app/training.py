"""Local training and evaluation (one code path for CPU and CUDA).

Defaults follow the project's reference setup: Adam with learning rate ``1e-3`` and (coupled, L2)
weight decay ``3e-3``, cross-entropy loss, batch size 64 (paper, Sec. V-2: "The batch size is 64
for all experiments except for Figure 2c, where it is taken to be 32"). The training data is an
in-memory :class:`~torch.utils.data.TensorDataset`; each epoch visits it in the order of a
``torch.randperm`` drawn from a CPU ``torch.Generator`` seeded with ``seed``, and batches are
moved to the device one at a time (through pinned memory when the device is CUDA).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

from corbin_fl.app.optimizer import LocalOptimizer
from corbin_fl.devices import pick_device
from corbin_fl.mechanisms.validate import require, why_at_least

logger = logging.getLogger(__name__)

__all__ = [
    "OPTIMIZERS",
    "EvalResult",
    "StepBound",
    "TrainResult",
    "evaluate",
    "step_bound",
    "train_local",
]

#: Optimizer names accepted by :func:`train_local`.
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")


@dataclass(frozen=True)
class TrainResult:
    """Summary of one :func:`train_local` call.

    Attributes
    ----------
    loss : float
        Mean cross-entropy over all examples seen (every step weighted by its batch size).
    num_examples : int
        Size of the local dataset (the FedAvg weight).
    steps : int
        Optimizer steps taken.
    seconds : float
        Wall-clock time of the training loop.
    examples_seen : int
        Examples processed, summed over steps.
    """

    loss: float
    num_examples: int
    steps: int
    seconds: float
    examples_seen: int


@dataclass(frozen=True)
class EvalResult:
    """Summary of one :func:`evaluate` call.

    Attributes
    ----------
    loss : float
        Mean cross-entropy.
    accuracy : float
        Fraction of examples whose arg-max logit is the label.
    num_examples : int
        Size of the evaluated dataset.
    """

    loss: float
    accuracy: float
    num_examples: int


def _check_dataset(dataset: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(dataset, TensorDataset) or len(dataset.tensors) != 2:
        raise TypeError("dataset must be a TensorDataset of (inputs, labels)")
    x, y = dataset.tensors
    if not (x.is_floating_point() or x.dtype == torch.int64):
        raise TypeError(
            f"inputs must be floating-point images or int64 letter indices, got {x.dtype}"
        )
    if y.dtype != torch.int64 or y.ndim != 1:
        raise TypeError(f"labels must be a 1-D int64 tensor, got {y.dtype} {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("the dataset is empty")
    return x, y


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    require(name, why_at_least(value, 1))
    return value


def _check_nonneg_float(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {value}")
    return v


def _check_counts(
    epochs: object, batch_size: object, seed: object, max_steps: object
) -> tuple[int, int, int | None]:
    """``(epochs, batch_size, max_steps)`` of :func:`train_local`, checked (each ``>= 1``,
    ``max_steps`` may be None), and its ``seed`` checked (an int ``>= 0``)."""
    epochs = _check_positive_int("epochs", epochs)
    batch_size = _check_positive_int("batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    require("seed", why_at_least(seed, 0))
    steps = None if max_steps is None else _check_positive_int("max_steps", max_steps)
    return epochs, batch_size, steps


def _check_optimizer(
    optimizer: object, lr: object, weight_decay: object, momentum: object
) -> tuple[float, float, float]:
    """``(lr, weight_decay, momentum)`` of :func:`train_local`, checked (``lr > 0``,
    ``weight_decay >= 0``, ``0 <= momentum < 1``), and the optimizer's name checked."""
    lr = _check_nonneg_float("lr", lr, positive=True)
    weight_decay = _check_nonneg_float("weight_decay", weight_decay)
    momentum = _check_nonneg_float("momentum", momentum)
    if momentum >= 1:
        raise ValueError(f"momentum must be < 1, got {momentum}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    return lr, weight_decay, momentum


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move one batch; through pinned memory (asynchronous copy) when going CPU -> CUDA."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def train_local(
    model: nn.Module,
    dataset: TensorDataset,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    device: torch.device | str,
    optimizer: str = "adam",
    lr: float = 1e-3,
    weight_decay: float = 3e-3,
    momentum: float = 0.9,
    max_steps: int | None = None,
) -> TrainResult:
    """Train ``model`` in place on a local dataset with mini-batch cross-entropy.

    Each epoch draws a permutation ``pi`` of ``range(n)`` from a CPU ``torch.Generator`` seeded
    with ``seed`` (one generator for the whole call, so epochs differ) and takes one optimizer
    step per batch ``pi[s : s + batch_size]``. A final batch of a single example is skipped when
    ``n > 1`` (BatchNorm cannot normalise one example in training mode).

    Parameters
    ----------
    model : torch.nn.Module
        Moved to ``device`` in place; its training/eval mode is restored afterwards.
    dataset : torch.utils.data.TensorDataset
        ``(images float N x C x H x W, labels int64 N)``, on any device.
    epochs : int
        Passes over the data, ``>= 1``.
    batch_size : int
        ``>= 1``.
    seed : int
        Shuffling seed, ``>= 0``.
    device : torch.device or str
        Compute device (see :func:`pick_device`).
    optimizer : {"adam", "sgd"}
        ``torch.optim.Adam(lr, weight_decay)`` or ``torch.optim.SGD(lr, momentum, weight_decay)``
        (their arithmetic, through :class:`~corbin_fl.app.optimizer.LocalOptimizer`).
    lr : float
        Learning rate, ``> 0``.
    weight_decay : float
        L2 penalty coefficient, ``>= 0``.
    momentum : float
        SGD momentum in ``[0, 1)``; ignored by Adam.
    max_steps : int, optional
        Stop after this many optimizer steps in total (benchmarks).

    Returns
    -------
    TrainResult

    Raises
    ------
    TypeError, ValueError
        Invalid arguments.
    FloatingPointError
        The training loss became NaN or infinite (the model then holds diverged weights).
    """
    x, y = _check_dataset(dataset)
    epochs, batch_size, max_steps = _check_counts(epochs, batch_size, seed, max_steps)
    lr, weight_decay, momentum = _check_optimizer(optimizer, lr, weight_decay, momentum)
    dev = pick_device(device) if isinstance(device, str) else device
    if not isinstance(dev, torch.device):
        raise TypeError(f"device must be a torch.device or str, got {type(device).__name__}")

    model.to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    # torch's Adam / SGD arithmetic without torch.optim.Optimizer's import of torch._dynamo
    # (seconds per ClientApp process, so per round: app/optimizer.py).
    opt = LocalOptimizer(params, optimizer, lr=lr, weight_decay=weight_decay, momentum=momentum)
    was_training = model.training
    model.train()
    t0 = time.perf_counter()
    try:
        loss_sum, steps, seen = _run_epochs(
            model,
            x,
            y,
            opt,
            dev,
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
            max_steps=max_steps,
        )
        mean_loss = float(loss_sum.item()) / max(seen, 1)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - t0
    return _result(mean_loss, x.shape[0], steps, seen, seconds, dev, lr)


def _result(
    mean_loss: float, n: int, steps: int, seen: int, seconds: float, dev: torch.device, lr: float
) -> TrainResult:
    """The :class:`TrainResult` of a :func:`train_local` call (logged at debug level).

    Raises
    ------
    FloatingPointError
        The mean training loss is NaN or infinite.
    """
    if not math.isfinite(mean_loss):
        raise FloatingPointError(
            f"training loss is not finite ({mean_loss}) after {steps} steps (lr={lr})"
        )
    logger.debug(
        "trained %d steps (%d examples) on %s in %.2fs, loss %.4f",
        steps,
        seen,
        dev,
        seconds,
        mean_loss,
    )
    return TrainResult(
        loss=mean_loss, num_examples=n, steps=steps, seconds=seconds, examples_seen=seen
    )


def _run_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    opt: LocalOptimizer,
    dev: torch.device,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    max_steps: int | None,
) -> tuple[torch.Tensor, int, int]:
    """The optimizer steps of :func:`train_local` (its arguments checked, ``model`` in training
    mode on ``dev``): ``epochs`` passes in the order of permutations drawn from one CPU
    generator seeded with ``seed``, a final batch of one example skipped when ``n > 1``, at most
    ``max_steps`` steps in total.

    Returns ``(loss sum over the examples seen, float64 on dev; steps; examples seen)``.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    n = x.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    steps = seen = 0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            if idx.numel() == 1 and n > 1:
                continue
            idx = idx.to(x.device)
            xb = _to_device(x.index_select(0, idx), dev)
            yb = _to_device(y.index_select(0, idx), dev)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.detach().double() * idx.numel()
            steps += 1
            seen += idx.numel()
            if max_steps is not None and steps >= max_steps:
                break
        if max_steps is not None and steps >= max_steps:
            break
    return loss_sum, steps, seen


@dataclass(frozen=True)
class StepBound:
    """A public bound on how far one round of local Adam training moves a weight.

    Attributes
    ----------
    steps : int
        ``S``, the optimizer steps of one round (see :func:`step_bound`).
    radius : float
        ``R = S * lr``.
    source : str
        How ``S`` was obtained, for the run's summary.
    """

    steps: int
    radius: float
    source: str


def step_bound(
    *,
    lr: float,
    local_epochs: int,
    batch_size: int,
    max_steps: int,
    train_size: int,
    num_clients: int,
) -> StepBound:
    """``R = S * lr``: the update radius of ``range-mode = "update"`` from public settings only.

    A fresh Adam optimizer (one per round, as :func:`train_local` makes it) moves each weight by
    ``lr * |m_hat / (sqrt(v_hat) + eps)|`` per step, which is exactly ``lr`` on the first step
    and about ``lr`` or less afterwards (Kingma & Ba 2015, Sec. 2.1: the effective step is
    bounded by about ``lr``). ``S`` steps therefore move a weight by at most about ``S * lr``, so
    ``[-R, R]`` holds the whole local update and the mechanism clips almost nothing, while ``R``
    stays as small as that bound allows (the one-bit noise scales with ``R``, Theorem 1).

    ``S`` is public: ``max-steps`` when it is set and smaller, else one client's share of the
    public training split, ``S = local-epochs * ceil(train_size / (num_clients * batch_size))``
    (the IID share; a client that holds more data takes more steps and may clip, which its
    clip fraction shows). No client's own data enters: ``train_size`` is the size of the run's
    public training split and ``num_clients`` the number of nodes the server sees.

    Parameters
    ----------
    lr : float
        Adam learning rate, ``> 0``.
    local_epochs, batch_size : int
        Local training settings, ``>= 1``.
    max_steps : int
        Public cap on the steps of a round (0 = none).
    train_size : int
        Examples in the public training split, ``>= 1``.
    num_clients : int
        Clients the split is shared among, ``>= 1``.

    Returns
    -------
    StepBound
    """
    lr = _check_nonneg_float("lr", lr, positive=True)
    local_epochs = _check_positive_int("local_epochs", local_epochs)
    batch_size = _check_positive_int("batch_size", batch_size)
    train_size = _check_positive_int("train_size", train_size)
    num_clients = _check_positive_int("num_clients", num_clients)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(f"max_steps must be an int >= 0, got {max_steps!r}")
    share = math.ceil(train_size / num_clients)
    steps = local_epochs * math.ceil(share / batch_size)
    source = (
        f"{local_epochs} epoch(s) x ceil({share} / {batch_size}) steps "
        f"({train_size} training examples / {num_clients} clients)"
    )
    if 0 < max_steps < steps:
        steps, source = max_steps, f"max-steps = {max_steps}"
    return StepBound(steps=steps, radius=steps * lr, source=source)


def evaluate(
    model: nn.Module,
    dataset: TensorDataset,
    *,
    batch_size: int = 512,
    device: torch.device | str,
) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``dataset`` (in eval mode, no grad).

    Parameters
    ----------
    model : torch.nn.Module
        Moved to ``device`` in place; its training/eval mode is restored afterwards.
    dataset : torch.utils.data.TensorDataset
        ``(images, labels)`` as for :func:`train_local`.
    batch_size : int
        ``>= 1``.
    device : torch.device or str

    Returns
    -------
    EvalResult
        ``loss = (1/N) sum_i CE(f(x_i), y_i)``, ``accuracy = (1/N) #{i : argmax f(x_i) = y_i}``.
    """
    x, y = _check_dataset(dataset)
    batch_size = _check_positive_int("batch_size", batch_size)
    dev = pick_device(device) if isinstance(device, str) else device
    if not isinstance(dev, torch.device):
        raise TypeError(f"device must be a torch.device or str, got {type(device).__name__}")
    model.to(dev)
    was_training = model.training
    model.eval()
    n = x.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    try:
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                xb = _to_device(x[start : start + batch_size], dev)
                yb = _to_device(y[start : start + batch_size], dev)
                logits = model(xb)
                loss_sum += nn.functional.cross_entropy(
                    logits.float(), yb, reduction="sum"
                ).double()
                correct += (logits.argmax(dim=1) == yb).sum()
        loss = float(loss_sum.item()) / n
        acc = int(correct.item()) / n
    finally:
        model.train(was_training)
    return EvalResult(loss=loss, accuracy=acc, num_examples=n)

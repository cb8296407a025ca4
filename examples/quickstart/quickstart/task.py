"""The PyTorch part of the app: a small CNN, its data loaders, and its train and test loops.

Nothing here knows about federated learning or privacy; it is what a centralised PyTorch
script would have.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from quickstart.data import load_partition, load_test


class Net(nn.Module):
    """LeNet-style CNN for 28x28 digits (44,426 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of flattened (``(n, 784)``) or image-shaped digits."""
        x = x.view(-1, 1, 28, 28)
        x = self.pool(functional.relu(self.conv1(x)))
        x = self.pool(functional.relu(self.conv2(x)))
        x = x.flatten(1)
        x = functional.relu(self.fc1(x))
        x = functional.relu(self.fc2(x))
        return self.fc3(x)


def _loader(x: object, y: object, batch_size: int, shuffle: bool) -> DataLoader:
    dataset = TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


def load_data(partition_id: int, num_partitions: int, batch_size: int) -> DataLoader:
    """A shuffling loader over this client's IID share of the training digits."""
    x, y = load_partition(partition_id, num_partitions)
    return _loader(x, y, batch_size, shuffle=True)


def load_test_data(batch_size: int = 500) -> DataLoader:
    """A loader over the server's held-out test digits."""
    x, y = load_test()
    return _loader(x, y, batch_size, shuffle=False)


def train(net: nn.Module, loader: DataLoader, epochs: int, lr: float, device: str) -> float:
    """Train ``net`` in place for ``epochs`` epochs of SGD with momentum; the mean batch loss.

    The step is ``torch.optim.SGD(lr=lr, momentum=0.9)``'s: ``b <- 0.9 b + g`` (``b = g`` at the
    first step), ``w <- w - lr b``. It is written out because constructing a ``torch.optim``
    optimizer imports ``torch._dynamo`` (seconds of CPU), and Flower starts a fresh process for
    every message, so that would be paid every round.
    """
    net.to(device)
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    momenta = [torch.zeros_like(p) for p in params]
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            net.zero_grad()
            loss = functional.cross_entropy(net(x.to(device)), y.to(device))
            loss.backward()
            with torch.no_grad():
                for p, b in zip(params, momenta, strict=True):
                    b.mul_(0.9).add_(p.grad)
                    p.add_(b, alpha=-lr)
            total += loss.item()
            batches += 1
    return total / max(batches, 1)


def test(net: nn.Module, loader: DataLoader, device: str) -> tuple[float, float]:
    """``(mean loss, accuracy)`` of ``net`` on the digits of ``loader``."""
    net.to(device)
    net.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = net(x)
            loss += functional.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum().item())
            count += len(y)
    return loss / count, correct / count

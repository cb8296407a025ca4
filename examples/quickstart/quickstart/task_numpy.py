"""The numpy-only part of the app: softmax regression with its train and test loops.

No PyTorch anywhere: the model is two float64 arrays, ``W`` ``(784, 10)`` and ``b`` ``(10,)``,
shipped in an ``ArrayRecord`` as numpy arrays (7,850 parameters).
"""

from __future__ import annotations

import numpy as np

NUM_FEATURES, NUM_CLASSES = 784, 10
DTYPE = np.float64
"""The model's dtype; float64 on purpose, to show that the mod takes any float dtype."""


def init_model() -> list[np.ndarray]:
    """``[W, b]``, all zeros (softmax regression needs no random start)."""
    return [np.zeros((NUM_FEATURES, NUM_CLASSES), DTYPE), np.zeros(NUM_CLASSES, DTYPE)]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def train(
    model: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int | None = None,
) -> tuple[list[np.ndarray], float]:
    """Mini-batch SGD on the cross-entropy; ``(trained [W, b], mean batch loss)``.

    ``seed`` fixes the order of the batches (a fresh random order when None).
    """
    w, b = (a.astype(DTYPE, copy=True) for a in model)
    x = x.astype(DTYPE)
    rng = np.random.default_rng(seed)
    total, batches = 0.0, 0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            probs = _softmax(x[idx] @ w + b)
            total += float(-np.log(probs[np.arange(len(idx)), y[idx]] + 1e-12).mean())
            batches += 1
            probs[np.arange(len(idx)), y[idx]] -= 1.0
            grad = probs / len(idx)
            w -= lr * (x[idx].T @ grad)
            b -= lr * grad.sum(axis=0)
    return [w, b], total / max(batches, 1)


def test(model: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``[W, b]`` on ``(x, y)``."""
    w, b = (a.astype(DTYPE) for a in model)
    probs = _softmax(x.astype(DTYPE) @ w + b)
    loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((probs.argmax(axis=1) == y).mean())

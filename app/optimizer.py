"""The local optimizer: torch's Adam and SGD updates, without ``torch.optim.Optimizer``'s start-up.

Flower runs a fresh ClientApp process for every round's instruction, so whatever a process pays
once, a node pays every round. Constructing any ``torch.optim.Optimizer`` pays for importing
``torch._dynamo`` (and with it ``sympy``): ``Optimizer.add_param_group`` is wrapped by
``torch._disable_dynamo``, whose first call imports it. That import took 1.9 s of CPU on the
2-core development machine and 5.9 s on the H100 machine's host, against milliseconds of training
on that GPU (docs/BENCHMARKS.md, "The GPU check").

:class:`LocalOptimizer` keeps the same state as ``torch.optim.Adam`` / ``torch.optim.SGD`` and
calls the functions their ``step`` calls (``torch.optim.adam.adam``, ``torch.optim.sgd.sgd``),
with the same defaults (``foreach`` chosen by torch per device, no ``fused``, no
``capturable``), so its steps are the library's own arithmetic: bit for bit the same weights
(``tests/unit/test_optimizer.py`` compares them step by step on the CPU and on CUDA).

Adam (Kingma and Ba, arXiv 1412.6980, Algorithm 1, with coupled L2 weight decay ``lambda``):
``g_t = grad + lambda * theta``, ``m_t = beta1 m + (1 - beta1) g_t``, ``v_t = beta2 v + (1 - beta2)
g_t^2``, ``theta -= lr * (m_t / (1 - beta1^t)) / (sqrt(v_t / (1 - beta2^t)) + eps)``.
SGD with momentum ``mu`` (torch's form): ``g_t = grad + lambda * theta``, ``b_t = mu b + g_t``
(``b_1 = g_1``), ``theta -= lr * b_t``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

__all__ = ["LocalOptimizer"]


class LocalOptimizer:
    """Adam or SGD over ``params``, as ``torch.optim.Adam(params, lr, weight_decay=...)`` or
    ``torch.optim.SGD(params, lr, momentum, weight_decay=...)`` with every other argument left
    at its default.

    A parameter whose ``grad`` is ``None`` at a step is skipped, and its state is created at its
    first step with a gradient, as ``torch.optim`` does.

    Raises
    ------
    ValueError
        An unknown ``kind``, or a complex or sparse parameter (the models here have neither).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        kind: str,
        *,
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if kind not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {kind!r}")
        self.params = list(params)
        if any(torch.is_complex(p) for p in self.params):
            raise ValueError("complex parameters are not supported")
        self.kind = kind
        self.lr, self.weight_decay, self.momentum = lr, weight_decay, momentum
        self.betas, self.eps = betas, eps
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        """Drop every gradient (``set_to_none=True``, ``torch.optim``'s default)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        with_grad = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if any(p.grad is not None and p.grad.is_sparse for _, p in with_grad):
            raise ValueError("sparse gradients are not supported")
        params: list[torch.Tensor] = [p for _, p in with_grad]
        grads: list[torch.Tensor] = [p.grad for _, p in with_grad if p.grad is not None]
        if self.kind == "adam":
            self._adam(with_grad, params, grads)
        else:
            self._sgd(with_grad, params, grads)

    def _adam(
        self,
        with_grad: list[tuple[int, torch.nn.Parameter]],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        for i, p in with_grad:
            if i not in self.state:
                # torch.optim.Adam keeps `step` on the CPU unless capturable or fused.
                self.state[i] = {
                    "step": torch.tensor(0.0, dtype=torch.get_default_dtype()),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
        states = [self.state[i] for i, _ in with_grad]
        adam(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            amsgrad=False,
            beta1=self.betas[0],
            beta2=self.betas[1],
            lr=self.lr,
            weight_decay=self.weight_decay,
            eps=self.eps,
            maximize=False,
        )

    def _sgd(
        self,
        with_grad: list[tuple[int, torch.nn.Parameter]],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        buffers: list[torch.Tensor | None] = [
            self.state.get(i, {}).get("momentum_buffer") for i, _ in with_grad
        ]
        sgd(
            params,
            grads,
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if self.momentum != 0:
            for (i, _), buf in zip(with_grad, buffers, strict=True):
                if buf is not None:
                    self.state[i] = {"momentum_buffer": buf}

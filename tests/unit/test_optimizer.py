"""The local optimizer takes torch.optim's steps bit for bit, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from device_params import DEVICES
from torch import nn

from corbin_fl.app.optimizer import LocalOptimizer

CASES = [
    ("adam", {"lr": 1e-3, "weight_decay": 3e-3}),
    ("adam", {"lr": 0.05}),
    ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    ("sgd", {"lr": 0.1}),
]


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10), nn.Linear(10, 3)
    ).to(device)


def _torch_optimizer(params: list[nn.Parameter], kind: str, **kw: float) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, **kw)
    return torch.optim.SGD(params, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "kw"), CASES)
def test_the_steps_are_torch_optims_bit_for_bit(device: str, kind: str, kw: dict) -> None:
    """30 steps of the same batches: every weight equal to torch.optim's, bit for bit; the last
    layer gets no gradient in the first 10 steps (its state starts late, as torch.optim's)."""
    ours, ref = _model(device), _model(device)
    opt = LocalOptimizer(list(ours.parameters()), kind, **kw)
    ref_opt = _torch_optimizer(list(ref.parameters()), kind, **kw)
    gen = torch.Generator().manual_seed(1)
    for step in range(30):
        x = torch.randn(16, 1, 8, 8, generator=gen).to(device)
        y = torch.randint(0, 3, (16,), generator=gen).to(device)
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            out = model(x)
            if step < 10:  # skip the last layer: its parameters get no gradient
                out = model[3](model[2](model[1](model[0](x))))[:, :3]
            nn.functional.cross_entropy(out, y).backward()
            o.step()
        for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: weights differ"
    assert len(opt.state) == len(ref_opt.state)


def test_bad_arguments_are_refused() -> None:
    p = nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="optimizer must be"):
        LocalOptimizer([p], "adagrad", lr=0.1)
    with pytest.raises(ValueError, match="complex"):
        LocalOptimizer([nn.Parameter(torch.zeros(2, dtype=torch.complex64))], "sgd", lr=0.1)


def test_a_step_does_not_import_torch_dynamo() -> None:
    """What the class is for: in a fresh interpreter, building it and stepping leave
    ``torch._dynamo`` unimported (``torch.optim.Adam`` alone imports it: the control)."""
    code = textwrap.dedent(
        """
        import sys
        import torch
        from corbin_fl.app.optimizer import LocalOptimizer
        m = torch.nn.Linear(3, 2)
        for kind in ("adam", "sgd"):
            opt = LocalOptimizer(list(m.parameters()), kind, lr=0.1, momentum=0.5)
            m(torch.ones(1, 3)).sum().backward()
            opt.step()
        print("ours", "torch._dynamo" in sys.modules)
        torch.optim.Adam(m.parameters())
        print("torch.optim", "torch._dynamo" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["ours False", "torch.optim True"], out

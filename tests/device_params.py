"""The devices a parametrised test runs on: the CPU always, CUDA where the machine has it.

The CUDA case is marked ``device`` (``pytest -m device``; ``bench/gpu_check.py`` runs it on a GPU
machine) and skips elsewhere with the reason.
"""

from __future__ import annotations

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.device,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
        ],
    ),
]

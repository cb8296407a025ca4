"""The compute device of a process: chosen from a run's ``device`` setting, named for records.

Building-block code (the mod's encoder, the strategy's server-side decoding) and this project's
task (training, evaluation) choose the device the same way.
"""

from __future__ import annotations

import re

import torch

from corbin_fl.mechanisms.validate import require, why_at_least

__all__ = ["device_label", "pick_device", "set_threads"]


def pick_device(override: str | torch.device | None = None) -> torch.device:
    """Choose the compute device.

    Parameters
    ----------
    override : str or torch.device, optional
        ``None``, ``""`` or ``"auto"``: CUDA when available, else CPU. ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"`` (must exist), ``"mps"`` (must be available).

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        Unparseable device string, or a device that is not available here.
    """
    if override is None or (isinstance(override, str) and override.strip().lower() in ("", "auto")):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(override, str | torch.device):
        raise TypeError(f"device override must be a str, got {type(override).__name__}")
    try:
        dev = torch.device(override.strip().lower() if isinstance(override, str) else override)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {override!r}: {exc}") from exc
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {override!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {override!r} requested but only {torch.cuda.device_count()} CUDA "
                "device(s) exist"
            )
        return dev
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {override!r} requested but MPS is not available")
        return dev
    raise ValueError(f"unsupported device {override!r}: expected auto, cpu, cuda[:N] or mps")


def device_label(device: torch.device) -> str:
    """A short name of ``device`` for the run's records: ``"cpu"``, ``"mps"``, or
    ``"cuda:N (model name)"`` (the name as the driver reports it, printable ASCII without
    parentheses, at most 80 characters; ``cuda`` without an index names the current device)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = re.sub(r"[^\x20-\x27\x2a-\x7e]", "", torch.cuda.get_device_name(index))
        name = name[:80].strip()
        return f"cuda:{index} ({name})" if name else f"cuda:{index}"
    return str(device) if device.index is not None else device.type


def set_threads(n: int) -> None:
    """Set the number of intra-op CPU threads torch uses in this process.

    Parameters
    ----------
    n : int
        ``>= 1`` (e.g. cores / processes when several clients share a machine).
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"thread count must be an int, got {type(n).__name__}")
    require("thread count", why_at_least(n, 1))
    torch.set_num_threads(n)

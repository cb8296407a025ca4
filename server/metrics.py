"""What the server writes to ``out-dir``: ``events.jsonl``, ``metrics.jsonl``, ``summary.json``.

The files are the contract with the ``corbin-fl local`` launcher, which shows progress from them:

- ``events.jsonl``: one JSON object per line, appended and flushed as it happens:
  ``{"event": "run_start", ...}``, ``{"event": "round_start", "round": t, "time": unix}``,
  ``{"event": "stage_end", "round": t, "stage": name, "seconds": s, "replies": k,
  "dropped": [...]}``, ``{"event": "checkpoint", "round": t, "time": unix}`` (the round is
  durable in ``checkpoint/``), ``{"event": "round_end", "round": t, ...}``,
  ``{"event": "resume", "from_round": t, ...}``, ``{"event": "run_end"}``.
- ``metrics.jsonl``: one JSON object per round (see
  :func:`corbin_fl.server.records.round_record`); after a resume it holds exactly one row per
  completed round (:meth:`RunFiles.rewrite_metrics`).
  Its ``devices`` maps each accepted client's node id to the device it trained on, as the client
  names it (:func:`client_device`); ``summary.json``'s ``client_devices`` collects them.
- ``summary.json``: written once at the end (atomically: temp file + rename).

With ``out-dir = ""`` nothing is written and every method is a no-op.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from corbin_fl.fsio import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from flwr.app import RecordDict

logger = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"

DEVICE_KEY: Final[str] = "device"
"""Key of an app ConfigRecord of an update reply that names the device the client trained on
(this project's train handler sends ``{"train-info": {"device": "cuda:0 (NVIDIA H100 ...)"}}``)."""
MAX_DEVICE_CHARS: Final[int] = 96
"""Longest device name recorded."""
INVALID_DEVICE: Final[str] = "invalid"
"""What is recorded for a device name that is not of the known shape."""
_DEVICE_RE: Final[re.Pattern[str]] = re.compile(
    r"(cpu|mps|(cuda|xpu)(:[0-9]{1,3})?)( \([\x20-\x27\x2a-\x7e]{1,80}\))?"
)
"""``cpu``, ``mps``, ``cuda[:N]`` or ``xpu[:N]``, optionally `` (model name)`` in printable ASCII
without parentheses."""


def client_device(records: RecordDict, node: int | str = "?") -> str | None:
    """The training device a client names in its reply's app records, checked as untrusted input.

    Returns the name (``"cpu"``, ``"cuda:0 (NVIDIA H100 80GB HBM3)"``, ...), None when no app
    ConfigRecord has :data:`DEVICE_KEY` (an app that does not report it), or
    :data:`INVALID_DEVICE` for anything else (a non-string, too long, an unknown shape): it is
    only recorded, so a bad value never fails the round.
    """
    for rec in records.config_records.values():
        if DEVICE_KEY not in rec:
            continue
        value = rec[DEVICE_KEY]
        if (
            isinstance(value, str)
            and len(value) <= MAX_DEVICE_CHARS
            and _DEVICE_RE.fullmatch(value) is not None
        ):
            return value
        logger.warning("node %s: unrecognised device name %.64r, recorded as invalid", node, value)
        return INVALID_DEVICE
    return None


def client_devices(history: list[dict[str, Any]]) -> dict[str, str]:
    """The device of each client in ``metrics.jsonl`` rows (their ``devices``), by node id; a
    client that reported different ones over the run gets them joined by ``", "`` in order."""
    seen: dict[str, list[str]] = {}
    for row in history:
        devices = row.get("devices")
        if not isinstance(devices, dict):
            continue  # a row of a run before devices were recorded
        for node, device in devices.items():
            if isinstance(device, str):
                names = seen.setdefault(str(node), [])
                if device not in names:
                    names.append(device)
    return {node: ", ".join(names) for node, names in seen.items()}


def jsonable(value: Any) -> Any:
    """Turn ``value`` into plain JSON: dict keys to str, tuples/sets to lists, NaN/inf to None,
    numpy scalars to Python numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        seq = sorted(value) if isinstance(value, set | frozenset) else value
        return [jsonable(v) for v in seq]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):  # numpy / torch scalar
        return jsonable(value.item())
    return str(value)


class RunFiles:
    """Append-only writers of the run's output files.

    Parameters
    ----------
    out_dir : str
        Output folder (created if missing); ``""`` disables all output.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir: Path | None = Path(out_dir) if out_dir else None
        self._events: IO[str] | None = None
        self._metrics: IO[str] | None = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._events = open(self.out_dir / EVENTS_FILE, "a", encoding="utf-8")  # noqa: SIM115
            self._metrics = open(self.out_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    @staticmethod
    def _write(stream: IO[str] | None, obj: dict[str, Any]) -> None:
        if stream is None:
            return
        stream.write(json.dumps(jsonable(obj), allow_nan=False) + "\n")
        stream.flush()
        os.fsync(stream.fileno())

    def event(self, name: str, **fields: Any) -> None:
        """Append ``{"event": name, **fields}`` to ``events.jsonl`` and flush."""
        self._write(self._events, {"event": name, **fields})

    def round_start(self, rnd: int) -> None:
        """``{"event": "round_start", "round": t, "time": unix}``."""
        self.event("round_start", round=rnd, time=time.time())

    def stage_end(
        self, rnd: int, stage: str, seconds: float, replies: int, dropped: list[int]
    ) -> None:
        """``{"event": "stage_end", "round", "stage", "seconds", "replies", "dropped"}``."""
        self.event(
            "stage_end",
            round=rnd,
            stage=stage,
            seconds=seconds,
            replies=replies,
            dropped=sorted(dropped),
        )

    def metrics(self, record: dict[str, Any]) -> None:
        """Append one round's metrics to ``metrics.jsonl`` and flush."""
        self._write(self._metrics, record)

    def rewrite_metrics(self, records: list[dict[str, Any]]) -> None:
        """Replace ``metrics.jsonl`` by ``records`` (one row each) atomically, keep appending.

        Used on resume: the file then holds exactly the checkpoint's rows ``1..t``; a row of a
        round after the checkpoint (written before a crash) is dropped, and the round is redone.
        """
        if self.out_dir is None:
            return
        if self._metrics is not None and not self._metrics.closed:
            self._metrics.close()
        text = "".join(json.dumps(jsonable(r), allow_nan=False) + "\n" for r in records)
        atomic_write_text(self.out_dir / METRICS_FILE, text)
        self._metrics = open(self.out_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically and durably (:mod:`corbin_fl.fsio`)."""
        if self.out_dir is None:
            return
        atomic_write_json(
            self.out_dir / SUMMARY_FILE, jsonable(summary), sort_keys=False, allow_nan=False
        )

    def close(self) -> None:
        """Close the streams (idempotent)."""
        for stream in (self._events, self._metrics):
            if stream is not None and not stream.closed:
                stream.close()

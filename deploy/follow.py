"""Following a run from the files its ServerApp writes (``events.jsonl``, ``metrics.jsonl``,
``summary.json`` in the run config's ``out-dir``): live progress and the final result.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from deploy.local import KilledNode
from deploy.processes import ProcessRef, is_alive

logger = logging.getLogger(__name__)

RUN_FILES: Final[tuple[str, ...]] = ("events.jsonl", "metrics.jsonl", "summary.json")
"""What the ServerApp writes into ``out-dir`` (the launcher's contract with the app)."""


# ====================================================================== following a run
class JsonlTail:
    """Incrementally read complete lines of a growing JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        """Records appended since the last call (a torn last line waits for the next call)."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("skipping malformed line in %s: %r", self.path, line[:200])
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


@dataclass
class RunProgress:
    """What a progress display needs; updated in place while a run goes on."""

    phase: str = "starting"
    """``starting`` -> ``ready`` -> ``running`` -> ``finished`` | ``failed``."""
    run_id: int | None = None
    num_rounds: int | None = None
    current_round: int = 0
    last_stage: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    killed: list[KilledNode] = field(default_factory=list)
    node_ids: dict[int, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    message: str = ""
    num_clients: int = 0
    """SuperNodes deployed (virtual ones in a simulation)."""
    stage_drops: list[tuple[int, str, int]] = field(default_factory=list)
    """``(round, stage, node id)`` of every drop a ``stage_end`` event reported, in order (the
    reason comes with the round's ``metrics.jsonl`` row)."""

    @property
    def elapsed(self) -> float:
        """Seconds since the launcher started."""
        return time.monotonic() - self.started

    @property
    def finished_round(self) -> int:
        """The last round with a ``metrics.jsonl`` row (0 before the first)."""
        return max((as_int(m.get("round")) or 0 for m in self.metrics), default=0)

    def active_nodes(self) -> int | None:
        """Nodes taking part, as the ServerApp reports them (None before anything is known).

        With ``S`` the nodes sampled in the last finished round and ``D`` the nodes dropped in
        it (its ``metrics.jsonl`` row), and ``D'`` the nodes the ``stage_end`` events of the
        rounds after it have dropped so far: ``S - |D| - |D' \\ D|``. Before the first row,
        ``S`` is the number of SuperNodes deployed (the launcher waits for all of them). A node
        dropped again after it was dropped in the last round is not counted twice; a killed
        node the SuperLink no longer lists is not sampled, and stays uncounted.
        """
        done = self.finished_round
        rows = [m for m in self.metrics if (as_int(m.get("round")) or 0) == done]
        if rows:
            last = rows[-1]
            before = _dropped_ids(last.get("dropped"))
            sampled = as_int(last.get("sampled"))
            base = (
                sampled - len(before) if sampled is not None else _count(last.get("participants"))
            )
        else:
            before, base = set(), (self.num_clients or None)
        if base is None:
            return None
        since = {nid for rnd, _, nid in self.stage_drops if rnd > done} - before
        return max(0, base - len(since))

    def drop_count(self) -> int:
        """Drops in the run so far: every finished round's ``dropped`` plus the drops the
        ``stage_end`` events of the round in flight have reported."""
        done = self.finished_round
        finished = sum(len(_dropped_ids(m.get("dropped"))) for m in self.metrics)
        return finished + sum(1 for rnd, _, _ in self.stage_drops if rnd > done)


def _dropped_ids(value: Any) -> set[int]:
    """Node ids of a ``dropped`` field (a ``{node: reason}`` dict or a list of ids)."""
    items = value.keys() if isinstance(value, Mapping) else value if isinstance(value, list) else []
    return {n for n in (as_int(item) for item in items) if n is not None}


def _count(value: Any) -> int | None:
    """A count field that may be a number or a list (``participants``)."""
    return len(value) if isinstance(value, list) else as_int(value)


@dataclass
class RunResult:
    """Outcome of :func:`run_local` / :func:`run_simulation`."""

    ok: bool
    reason: str
    out_dir: Path
    run_id: int | None
    status: str | None
    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    killed: list[KilledNode]
    node_ids: dict[int, int]
    processes: list[ProcessRef]
    """Every process the deployment started or saw below one (for leak checks)."""
    logs_dir: Path | None
    """Where the logs are (None if they were removed after a successful run)."""
    wall_seconds: float
    exit_code: int

    def leftover_processes(self) -> list[ProcessRef]:
        """Processes of this run still alive (should be empty)."""
        return [ref for ref in self.processes if is_alive(ref)]


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file (empty if it does not exist)."""
    return JsonlTail(Path(path)).read_new()

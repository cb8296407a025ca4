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

from corbin_fl.deploy.local import KilledNode
from corbin_fl.deploy.processes import ProcessRef, is_alive

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
    """``starting`` -> ``ready`` -> ``running`` -> ``stopping`` -> ``finished`` | ``failed``."""
    run_id: int | None = None
    num_rounds: int | None = None
    current_round: int = 0
    """The round of the last ``round_start`` event (0 before the first)."""
    last_stage: str | None = None
    """The last stage of ``current_round`` that ended (its ``stage_end`` event), None before
    the first."""
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
    waiting: str = ""
    """What the launcher waits for while it starts the deployment (``starting the
    SuperLink``, ``waiting for 4 SuperNodes to register``, ...); empty once it is up."""

    @property
    def elapsed(self) -> float:
        """Seconds since the launcher started."""
        return time.monotonic() - self.started

    # ------------------------------------------------------------------ reading the files
    def apply_event(self, ev: Mapping[str, Any]) -> None:
        """Record one ``events.jsonl`` record and update the round, stage and drops from it.

        ``round_start`` sets :attr:`current_round` and clears :attr:`last_stage`;
        ``stage_end`` of the current round sets :attr:`last_stage` and records its drops (a
        ``stage_end`` of another round only its drops).
        """
        self.events.append(dict(ev))
        kind, rnd = ev.get("event"), as_int(ev.get("round"))
        if kind == "round_start" and rnd is not None:
            self.current_round, self.last_stage = rnd, None
        elif kind == "stage_end":
            stage = str(ev.get("stage"))
            if rnd is None or rnd == self.current_round:
                self.last_stage = stage
            for nid in ev.get("dropped") or []:
                if rnd is not None and (node := as_int(nid)) is not None:
                    self.stage_drops.append((rnd, stage, node))

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Record ``metrics.jsonl`` rows (one per finished round, in order)."""
        self.metrics.extend(rows)

    @property
    def accuracy(self) -> Any:
        """``test_accuracy`` of the last finished round (None before the first)."""
        return self.metrics[-1].get("test_accuracy") if self.metrics else None

    def waiting_for(self) -> str | None:
        """What the run waits for before its first round starts (None once one has).

        While starting: :attr:`waiting` (``preparing the deployment`` before its first step);
        then ``submitting the run`` until ``flwr run`` names the run, ``waiting for the
        ServerApp`` until its ``run_start`` event, and ``ServerApp preparing round r`` (data,
        model, the initial evaluation; ``r`` is 1, or the round after the checkpoint of a
        resumed run) until its ``round_start``.
        """
        if self.current_round or self.phase in ("stopping", "finished", "failed"):
            return None
        if self.phase == "starting":
            return self.waiting or "preparing the deployment"
        if self.run_id is None:
            return "submitting the run"
        kinds = {str(ev.get("event")): ev for ev in self.events}
        if "run_start" not in kinds:
            return "waiting for the ServerApp"
        resumed = as_int(kinds["resume"].get("from_round")) if "resume" in kinds else None
        return f"ServerApp preparing round {(resumed or 0) + 1}"

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
    """All records of a JSON-lines file (empty if it does not exist): the one reader of the
    ServerApp's ``metrics.jsonl`` and ``events.jsonl`` (following a run, the experiments, the
    recomputed privacy reports, the GPU check). A malformed line is skipped with a warning, a
    torn last line (no newline yet) is left for the writer to finish."""
    return JsonlTail(Path(path)).read_new()

"""A followed run's pace: how long a run without a fixed ``--timeout`` may take, and when a quiet
``flwr run --stream`` gets a status query. Both derive from the run's own round times (the
``round_seconds`` of ``metrics.jsonl``), never from a fixed guess of this machine's speed."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

PACE_FACTOR: Final[float] = 3.0
"""A run without ``--timeout`` may take this many times its slowest round per round left."""
PACE_SLACK_S: Final[float] = 600.0
"""... plus these seconds (the last evaluation, the summary, a slow checkpoint)."""
STATUS_CHECK_MIN_S: Final[float] = 30.0
"""A quiet ``flwr run`` stream gets a status query after this many seconds (or after the slowest
round so far, when that is longer)."""


def round_times(rounds: Sequence[Mapping[str, Any]]) -> list[float]:
    """The ``round_seconds`` of the rows that have one."""
    return [float(t) for row in rounds if isinstance(t := row.get("round_seconds"), int | float)]


def derived_deadline(
    now: float, rounds: Sequence[Mapping[str, Any]], num_rounds: int | None
) -> float:
    """The limit of a run without a fixed ``timeout``: ``now + (R - r) * 3 * max_i t_i + 600``
    seconds, with ``t_i`` the ``round_seconds`` of the ``r`` rounds ended so far (the rows of
    ``metrics.jsonl``) and ``R`` the run's rounds; ``inf`` before a round has ended or when
    ``R`` is unknown (the ServerApp's own stage timeouts stop a run whose nodes do not answer).
    """
    times = round_times(rounds)
    if not times or num_rounds is None:
        return math.inf
    left = max(num_rounds - len(rounds), 0)
    return now + left * PACE_FACTOR * max(times) + PACE_SLACK_S


class QuietStream:
    """When to ask the SuperLink whether a run whose ``flwr run --stream`` has gone quiet is over.

    Flower 1.42's log stream has no read timeout (``flwr/supercore/protobuf/client.py``,
    ``_unary_stream``), so a stream can stay open after its run finished. Once the stream's log
    and the run's files have shown nothing new for ``q = max(min_s, max_i t_i)`` seconds
    (``t_i`` the ``round_seconds`` so far), a status query is due, then again every ``q``
    seconds while the quiet lasts. A run that is merely between two slow rounds is never
    queried before it has been quiet for a whole slowest round.
    """

    def __init__(
        self, min_s: float = STATUS_CHECK_MIN_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.min_s, self.clock = min_s, clock
        self.activity: tuple[int, ...] = ()
        self.quiet_s = min_s
        self.since = self.last_check = clock()

    def due(self, activity: tuple[int, ...], rounds: Sequence[Mapping[str, Any]]) -> bool:
        """Whether a status query is due, given the current ``activity`` (counters that grow
        while the run shows signs of life, the number of ``rounds`` among them) and the round
        rows so far; ``q`` is recomputed only when the activity changes."""
        now = self.clock()
        if activity != self.activity:
            self.activity, self.since = activity, now
            self.quiet_s = max([self.min_s, *round_times(rounds)])
            return False
        if now - self.since < self.quiet_s or now - self.last_check < self.quiet_s:
            return False
        self.last_check = now
        return True

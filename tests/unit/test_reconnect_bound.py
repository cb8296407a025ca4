"""``reconnect_after``: how long after the SuperLink's return a live SuperNode is back, by the
outage's length (``server/stages.py``), held against gRPC's connection back-off simulated.

gRPC's channel (its ``doc/connection-backoff.md``) tries to connect at ``t_{k+1} = t_k + B_k (1 +
u_k)``, ``B_k = min(1.6^k, 120)``, ``u_k ~ U(-0.2, 0.2)``, from its first failure on. The bound's
channel part, ``1.2 min(120, 0.75 L + 1)``, must cover the wait from the return to the next try
for every outage length ``L`` and every start of the node's back-off within the outage; and it
must not be loose by much more than the jitter, or live nodes wait for nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from corbin_fl.server.stages import GRPC_BACKOFF_S, RECONNECT_S, RETRY_S, reconnect_after

INITIAL, MULTIPLIER, JITTER, MOST = GRPC_BACKOFF_S


def _gaps(away: float, rng: np.random.Generator, samples: int) -> np.ndarray:
    """Seconds from the return (``away`` after the outage began) to the channel's next try,
    for ``samples`` nodes whose first failure is uniform in the outage's first 3 s (a node
    pulls every 3 s) and whose tries follow gRPC's schedule with its jitter."""
    t = rng.uniform(0.0, min(3.0, away), samples)  # first failure: try 0
    backoff = np.full(samples, INITIAL)
    gaps = np.full(samples, np.nan)
    for _ in range(200):  # 120 s tries: the loop ends long before
        t = t + backoff * (1.0 + rng.uniform(-JITTER, JITTER, samples))
        first_after = np.isnan(gaps) & (t >= away)
        gaps[first_after] = t[first_after] - away
        if not np.isnan(gaps).any():
            return gaps
        backoff = np.minimum(backoff * MULTIPLIER, MOST)
    raise AssertionError("the simulated back-off never passed the return")


@pytest.mark.parametrize("away", [0.5, 2.0, 5.0, 10.0, 20.0, 32.0, 60.0, 120.0, 300.0, 900.0])
def test_the_bound_covers_grpc_back_off_and_is_not_loose(away: float) -> None:
    rng = np.random.default_rng(int(away * 10))
    gaps = _gaps(away, rng, 20_000)
    channel = reconnect_after(away) - RETRY_S  # the bound's channel part (above the floor)
    print(f"outage {away:g} s: largest gap {gaps.max():.2f} s, bound {channel:.2f} s")
    assert gaps.max() <= channel
    # Not loose: the bound is a worst case over the jitter; the largest sampled gap reaches a
    # third of it at every length here (its slack: the 0.8 / 1.2 jitter ends taken together,
    # and an outage that ends right at a try).
    assert gaps.max() >= channel / 3


def test_the_floor_and_the_docker_restart_case() -> None:
    assert reconnect_after(0.0) >= RECONNECT_S == 27.5
    assert RETRY_S == 30.0
    # The outage that dropped three live SuperNodes at 27.5 s: the bound is now 60 s.
    assert reconnect_after(32.0) == pytest.approx(1.2 * (1 + 0.75 * 32.0) + 30.0)
    assert reconnect_after(1e6) == pytest.approx(1.2 * 120.0 + 30.0)
    lengths = np.linspace(0.0, 500.0, 101)
    assert np.all(np.diff([reconnect_after(x) for x in lengths]) >= 0)

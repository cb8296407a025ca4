"""Fixtures of the real-process tests: waits derived from this machine, now (``waits.py``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from waits import ClientAppTiming, StartupTiming, measure_clientapp, measure_startup


@pytest.fixture
def clientapp_timing() -> Callable[[Mapping[str, Any], int], ClientAppTiming]:
    """``f(run_config, num_partitions)``: measure a ClientApp update on this machine, now.

    Real-process tests derive their stage timeouts and start-up waits from it (and from
    Flower's fixed poll periods), never from a quiet machine's timing. Each call costs one
    update's worth of CPU (a few seconds idle).
    """

    def measure(run_config: Mapping[str, Any], num_partitions: int) -> ClientAppTiming:
        timing = measure_clientapp(run_config, num_partitions)
        print(f"ClientApp probe: {timing}")  # shown by pytest -rA / on failure
        return timing

    return measure


@pytest.fixture
def flower_startup() -> StartupTiming:
    """The start-up of a Flower process on this machine, now (:func:`measure_startup`).

    For real-process tests of apps without torch (the tiny test apps); see
    :func:`clientapp_timing` for CorBin-FL itself.
    """
    timing = StartupTiming(startup=measure_startup(), cores=os.cpu_count() or 1)
    print(f"Flower start-up probe: {timing}")
    return timing


@pytest.fixture
def rearm_timeout(request: pytest.FixtureRequest) -> Callable[[float], None]:
    """``f(seconds)``: move this test's pytest-timeout limit to ``seconds`` from now.

    A real-process test marks a static limit that covers its probe, then calls this with the
    bound it derived from the probe (its run's waits plus clean-up), so the limit that fails the
    test is the derived one. Without a pytest-timeout timer on the test it does nothing.
    """

    def rearm(seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds}")
        item = request.node
        cancel = getattr(item, "cancel_timeout", None)
        if cancel is None:
            return
        from pytest_timeout import Settings

        cancel()
        method = "signal" if hasattr(signal, "SIGALRM") else "thread"
        item.config.hook.pytest_timeout_set_timer(
            item=item, settings=Settings(seconds, method, False, False)
        )
        print(f"pytest-timeout limit now {seconds:.0f} s")

    return rearm

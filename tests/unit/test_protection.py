"""The words a report prints beside an epsilon (mechanisms/protection.py, issue 38 item 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from corbin_fl.mechanisms.protection import (
    MEANINGFUL_EPS,
    NO_PROTECTION,
    per_parameter_text,
    protection,
)


def test_protection_marks_exactly_the_eps_above_the_threshold() -> None:
    assert MEANINGFUL_EPS == 10.0 and math.exp(MEANINGFUL_EPS) == pytest.approx(22_026.47, 1e-6)
    for eps, words in ((0.5, ""), (10.0, ""), (10.0001, NO_PROTECTION), (4.3e5, NO_PROTECTION)):
        assert protection(eps) == words
    assert protection(math.inf) == NO_PROTECTION and protection(None) == ""
    assert protection(np.float64(11.0)) == NO_PROTECTION
    with pytest.raises(ValueError, match="NaN"):
        protection(math.nan)
    with pytest.raises(TypeError, match="real number"):
        protection("12")  # type: ignore[arg-type]


def test_per_parameter_text_keeps_the_digit_that_shows_the_gain() -> None:
    """0.99997 at eps_p = 1 (ldpfl, n = 3, with secure aggregation) is no gain; 4 digits would
    print it as 1, 5 digits show it, and the words say it."""
    assert per_parameter_text(0.999974405, 1.0) == "0.99997 (no better than eps_p = 1)"
    assert per_parameter_text(0.4078, 1.0) == "0.4078"
    assert per_parameter_text(0.4078, None) == "0.4078"
    with pytest.raises(TypeError):
        per_parameter_text(None, 1.0)  # type: ignore[arg-type]


def test_central_gaussian_headline_says_it_when_the_target_protects_nothing() -> None:
    from corbin_fl import registry  # noqa: F401  (declares the privacy categories)
    from corbin_fl.mechanisms.report import privacy_report

    high = privacy_report("central-gaussian", 20.0, 1e-5, 100, 5)["threat_models"]["C"]
    assert high["dp"] is True and high["headline"] == f"{NO_PROTECTION}: central eps 20"
    assert "formally DP and practically none" in high["guarantee"]
    low = privacy_report("central-gaussian", 2.0, 1e-5, 100, 5)["threat_models"]["C"]
    assert low["headline"] == "(2, 1e-05) central, 5 rounds"
    assert "practically" not in low["guarantee"]

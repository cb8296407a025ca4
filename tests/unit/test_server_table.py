"""Tests of experiments/server_table.py: the sum-seeing server's table, rows from the registry."""

from __future__ import annotations

import math

from corbin_fl import registry
from corbin_fl.experiments import server_table as st
from corbin_fl.mechanisms import secure_sum as ss

DELTA = 1e-5


def test_table_rows_small() -> None:
    rows = st.server_table((10,), m=50, rounds=2, trials=2)
    by = {r["mechanism"].split()[0]: r for r in rows}
    assert by["ldpfl"]["dp"] is True and math.isfinite(by["ldpfl"]["all_rounds_eps"])
    assert by["corbin"]["dp"] is False
    assert by["pbm"]["bits"] == 2
    assert by["augcorbin"]["note"].endswith("2 of 10 independent (floor(gamma n + 1/2))")
    assert "Thm 3" not in st.format_table(rows) and "mechanism" in st.format_table(rows)
    # the plain word where the run's eps bounds nothing (eps > 10), and only there
    for row in rows:
        words = "no meaningful protection" in row["note"]
        assert words is (row["dp"] and row["all_rounds_eps"] > 10), row


def test_the_rows_are_the_registered_mechanisms_with_the_accountants_figures() -> None:
    """One row per number of binomial trials (every mechanism and setting with it), one per
    independent share at gamma, one per other paired mechanism; the figures are the
    accountant's, unchanged."""
    rows = st.server_table((10,), m=50, rounds=2, gamma=0.5, trials=3)
    labels = [r["mechanism"] for r in rows]
    assert labels == [
        "ldpfl / pbm pbm-trials=1 / rqm rqm-levels=2",
        "pbm pbm-trials=3",
        "augcorbin gamma=0.5",
        "corbin",
    ]
    one = ss.one_bit_guarantee(1.0, 10, 50, 2, DELTA)
    three = ss.binomial_guarantee(1.0, 3, 10, 50, 2, DELTA)
    for row, g in ((rows[0], one), (rows[1], three)):
        assert row["all_rounds_eps"] == g["all_rounds"]["eps"]
        assert row["per_parameter_eps"] == g["per_parameter"]["eps"]
    exact = registry.get("augcorbin").category.exact_sum()
    assert exact is not None
    ac = exact(1.0, 10, 0.5, 50, 2, DELTA)
    assert rows[2]["per_update_eps"] == ac["exact"]["per_update"]["eps"]
    assert [r["bits"] for r in rows] == [1, 2, 1, 1]


def test_a_registered_mechanism_with_binomial_symbols_gets_a_row() -> None:
    """A mechanism registered later joins the row of its trials, by its registered name."""
    toy = registry.Mechanism(
        "toy-sum",
        "a bit with P(1) in the range of randomized response",
        registry.one_bit,
        "corbin_fl.client.encode:encode_one_bit",
        "corbin_fl.server.aggregation:BitsAggregator",
        sum_levels=lambda cfg: 1,
        sum_trials=lambda cfg: 1,
    )
    registry.register(toy)
    try:
        assert st.binomial_settings([1])[1].endswith(" / toy-sum")
        assert st.binomial_settings([1, 7])[7] == "pbm pbm-trials=7"  # the toy has 1 trial only
    finally:
        registry.unregister("toy-sum")
    assert "toy-sum" not in st.binomial_settings([1])[1]

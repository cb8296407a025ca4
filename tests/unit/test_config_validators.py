"""``corbin_fl.validate``: the one copy of the configuration's range and choice checks (issue 41
item 4), its message format, NaN, and that it imports nothing of the project."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from corbin_fl import validate

SOURCE = Path(validate.__file__)


@pytest.mark.parametrize(
    ("why", "want"),
    [
        (validate.interval(1.5, 0.0, 1.0, hi_open=True), "must be in [0.0, 1.0), got 1.5"),
        (validate.interval(0, 1, 16), "must be in [1, 16], got 0"),
        (validate.probability(0.0), "must be in (0.0, 1.0), got 0.0"),
        (validate.probability(1.0, lo_open=False), "must be in [0.0, 1.0), got 1.0"),
        (validate.at_least(-1, 0, note="0 = default"), "must be >= 0 (0 = default), got -1"),
        (validate.at_least(-0.5, 0.0), "must be >= 0.0, got -0.5"),
        (validate.positive(0.0), "must be > 0, got 0.0"),
        (validate.above(2, 2), "must be > 2, got 2"),
        (validate.at_most(11, 10), "must be <= 10, got 11"),
        (validate.one_of(3, (1, 2, 4)), "must be 1, 2 or 4, got 3"),
        (validate.one_of(5, (2,)), "must be 2, got 5"),
        (
            validate.one_of("rely", ("relay", "derived", "exact")),
            "must be one of relay, derived, exact, got 'rely'; did you mean 'relay'?",
        ),
        (validate.one_of("zzz", ("relay", "exact")), "must be one of relay, exact, got 'zzz'"),
    ],
)
def test_each_check_names_the_cause_and_the_value(why: str | None, want: str) -> None:
    assert why == want


def test_valid_values_pass_and_nan_fails_every_numeric_check() -> None:
    assert validate.interval(0.0, 0.0, 1.0) is None and validate.interval(1.0, 0.0, 1.0) is None
    assert validate.probability(0.5) is None and validate.one_of("a", ("a",)) is None
    assert validate.at_least(0, 0) is None and validate.positive(1e-9) is None
    assert validate.at_most(10, 10) is None and validate.above(3, 2) is None
    nan = math.nan
    checks = [
        validate.interval(nan, 0.0, 1.0),
        validate.probability(nan),
        validate.at_least(nan, 0),
        validate.positive(nan),
        validate.above(nan, 0),
        validate.at_most(nan, 1),
    ]
    assert all(why is not None and why.endswith("got nan") for why in checks)


def test_it_imports_nothing_of_the_project() -> None:
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert modules <= {"__future__", "difflib", "collections.abc", "typing"}


def test_reasons_keeps_the_keys_with_a_reason_and_the_last_one_wins() -> None:
    got = validate.reasons(
        ("d", validate.interval(0, 1, 16)),
        ("lr", validate.positive(1e-3)),
        ("d", validate.interval(17, 1, 16)),
    )
    assert got == {"d": "must be in [1, 16], got 17"}


def test_require_raises_with_the_name_first_and_passes_a_valid_value() -> None:
    validate.require("n", validate.at_least(1, 1))
    with pytest.raises(ValueError, match=r"^num_clients must be >= 1, got 0$"):
        validate.require("num_clients", validate.at_least(0, 1))
    with pytest.raises(KeyError, match="d must be in"):
        validate.require("d", validate.interval(0, 1, 16), KeyError)

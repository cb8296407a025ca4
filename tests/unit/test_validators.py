"""``corbin_fl.mechanisms.validate``: the project's one module of value checks (issue 41 item 4):
the configuration's reasons (``why_*``), their message format, NaN, the math's guards written on
the same rules, and that the module imports nothing of the project."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from corbin_fl.mechanisms import validate

SOURCE = Path(validate.__file__)


@pytest.mark.parametrize(
    ("why", "want"),
    [
        (validate.why_interval(1.5, 0.0, 1.0, hi_open=True), "must be in [0.0, 1.0), got 1.5"),
        (validate.why_interval(0, 1, 16), "must be in [1, 16], got 0"),
        (validate.why_probability(0.0), "must be in (0.0, 1.0), got 0.0"),
        (validate.why_probability(1.0, lo_open=False), "must be in [0.0, 1.0), got 1.0"),
        (validate.why_at_least(-1, 0, note="0 = default"), "must be >= 0 (0 = default), got -1"),
        (validate.why_at_least(-0.5, 0.0), "must be >= 0.0, got -0.5"),
        (validate.why_positive(0.0), "must be > 0, got 0.0"),
        (validate.why_above(2, 2), "must be > 2, got 2"),
        (validate.why_at_most(11, 10), "must be <= 10, got 11"),
        (validate.why_one_of(3, (1, 2, 4)), "must be 1, 2 or 4, got 3"),
        (validate.why_one_of(5, (2,)), "must be 2, got 5"),
        (
            validate.why_one_of("rely", ("relay", "derived", "exact")),
            "must be one of relay, derived, exact, got 'rely'; did you mean 'relay'?",
        ),
        (validate.why_one_of("zzz", ("relay", "exact")), "must be one of relay, exact, got 'zzz'"),
    ],
)
def test_each_check_names_the_cause_and_the_value(why: str | None, want: str) -> None:
    assert why == want


def test_valid_values_pass_and_nan_fails_every_numeric_check() -> None:
    assert (
        validate.why_interval(0.0, 0.0, 1.0) is None
        and validate.why_interval(1.0, 0.0, 1.0) is None
    )
    assert validate.why_probability(0.5) is None and validate.why_one_of("a", ("a",)) is None
    assert validate.why_at_least(0, 0) is None and validate.why_positive(1e-9) is None
    assert validate.why_at_most(10, 10) is None and validate.why_above(3, 2) is None
    nan = math.nan
    checks = [
        validate.why_interval(nan, 0.0, 1.0),
        validate.why_probability(nan),
        validate.why_at_least(nan, 0),
        validate.why_positive(nan),
        validate.why_above(nan, 0),
        validate.why_at_most(nan, 1),
    ]
    assert all(why is not None and why.endswith("got nan") for why in checks)


def test_it_imports_nothing_of_the_project() -> None:
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in modules if m.split(".")[0] == "corbin_fl"}
    stdlib = {"__future__", "collections.abc", "difflib", "math", "numbers", "secrets", "sys"}
    assert modules <= stdlib | {"typing", "numpy", "numpy.typing", "torch"}
    top_level = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    top_level |= {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert "torch" not in top_level  # only under TYPE_CHECKING or inside the torch checks


def test_reasons_keeps_the_keys_with_a_reason_and_the_last_one_wins() -> None:
    got = validate.reasons(
        ("d", validate.why_interval(0, 1, 16)),
        ("lr", validate.why_positive(1e-3)),
        ("d", validate.why_interval(17, 1, 16)),
    )
    assert got == {"d": "must be in [1, 16], got 17"}


def test_require_raises_with_the_name_first_and_passes_a_valid_value() -> None:
    validate.require("n", validate.why_at_least(1, 1))
    with pytest.raises(ValueError, match=r"^num_clients must be >= 1, got 0$"):
        validate.require("num_clients", validate.why_at_least(0, 1))
    with pytest.raises(KeyError, match="d must be in"):
        validate.require("d", validate.why_interval(0, 1, 16), KeyError)


def test_the_guards_raise_on_the_same_rules() -> None:
    """:func:`~validate.integer` raises the reasons' messages; :func:`~validate.interval` shares
    their rule and prints its bounds with ``:g``."""
    assert validate.integer(16, "d", 1, 16) == 16
    with pytest.raises(ValueError, match=r"^d must be in \[1, 16\], got 0$"):
        validate.integer(0, "d", 1, 16)
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        validate.integer(0, "n", lo=1)
    with pytest.raises(ValueError, match=r"^n must be <= 3, got 4$"):
        validate.integer(4, "n", hi=3)
    assert validate.probability(0.5, "p") == 0.5
    with pytest.raises(ValueError, match=r"^p must be in \(0, 1\), got 1\.0$"):
        validate.probability(1.0, "p")
    with pytest.raises(ValueError, match=r"^p must be in \[0, 1\], got 1\.5$"):
        validate.interval(1.5, "p", 0.0, 1.0, lo_open=False, hi_open=False)

"""The reports' accuracy targets are data: ``experiments/targets.toml`` by default, a spec's own
``[[target]]`` tables otherwise (``experiments/spec.py``), checked by
``experiments/report.py::federated_targets``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from test_experiments import _seeded_groups

from corbin_fl.experiments.report import federated_targets
from corbin_fl.experiments.spec import (
    TARGETS_FILE,
    SpecError,
    TargetSpec,
    default_targets,
    parse_spec,
)

REPO = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "experiment": {"name": "t"},
    "base": {"num-rounds": 2},
    "grid": {"mechanism": ["corbin", "ldpfl"], "epsilon": [0.5, 1.0]},
}


def _spec(**extra: Any) -> dict[str, Any]:
    return {**BASE, **extra}


def test_the_default_targets_are_the_packaged_file() -> None:
    names = [t.name for t in default_targets()]
    assert names == [
        "CorBin-FL > LDP-FL at every eps_p <= 1",
        "CorBin-FL >= LDP-FL + 5 points at eps_p = 0.5",
        "CorBin-FL at eps_p = 1 within 5 points of FedAvg",
    ]
    assert TARGETS_FILE.parent == REPO / "experiments"
    fedavg = default_targets()[2]
    assert (fedavg.claim, fedavg.margin, fedavg.eps, fedavg.any_epsilon) == ("within", 5, 1, True)
    assert not default_targets()[0].any_epsilon  # LDP-FL is matched at the same eps_p
    assert default_targets()[0].reference_name == "LDP-FL"  # its registered title
    assert parse_spec(_spec()).targets == default_targets()


def test_the_readmes_spec_example_parses_with_its_target() -> None:
    text = (REPO / "experiments" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Spec format\n\n```toml\n(.*?)```", text, flags=re.S)
    assert block is not None
    spec = parse_spec(tomllib.loads(block.group(1)), source="README")
    (target,) = spec.targets
    assert target == TargetSpec(
        name="CorBin-FL > LDP-FL at every eps_p <= 1",
        mechanism="corbin",
        reference="ldpfl",
        claim="above",
        margin=0.0,
        eps_max=1.0,
    )
    assert target.mechanism_label == "CorBin-FL"


def test_a_specs_own_targets_replace_the_defaults(tmp_path: Path) -> None:
    assert parse_spec(_spec(target=[])).targets == ()
    own = {"name": "AugCorBin ahead", "mechanism": "augcorbin", "reference": "corbin"}
    spec = parse_spec(_spec(target=[{**own, "claim": "above", "eps": 0.5, "margin": 1}]))
    groups = _seeded_groups(
        tmp_path,
        [("augcorbin", 0.5, [0.70, 0.71, 0.72]), ("corbin", 0.5, [0.60, 0.61, 0.62])],
    )
    (t,) = federated_targets(groups, spec.targets)
    assert t.status == "PASS"  # 10 points ahead, interval well above 1
    assert t.detail.startswith("AugCorBin-FL 71.00 ± 1.00 - CorBin-FL 61.00 ± 1.00 = +10.00")
    (t,) = federated_targets(groups[1:], spec.targets)
    assert (t.status, t.detail) == ("N/A", "no matching groups")


def test_within_a_reference_without_dp_matches_any_epsilon(tmp_path: Path) -> None:
    within = {"name": "w", "mechanism": "corbin", "reference": "fedavg", "claim": "within"}
    spec = parse_spec(_spec(target=[{**within, "eps": 0.5, "margin": 5}]))
    groups = _seeded_groups(
        tmp_path,
        [("corbin", 0.5, [0.70, 0.71, 0.72]), ("fedavg", 3.0, [0.90, 0.91, 0.92])],
    )
    (t,) = federated_targets(groups, spec.targets)
    assert t.status == "MISS"  # FedAvg 20 points ahead: resolved above the 5 allowed
    assert t.detail.startswith("FedAvg 91.00 ± 1.00 - CorBin-FL 71.00 ± 1.00 = +20.00 points")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            {"mechanism": "corbin", "reference": "ldpfl", "claim": "above", "eps": 1},
            "name: missing",
        ),
        (
            {"name": "x", "mechanism": "corbn", "reference": "ldpfl", "claim": "above", "eps": 1},
            "'corbn' is not a registered mechanism",
        ),
        (
            {"name": "x", "mechanism": "corbin", "reference": "ldpfl", "claim": "above"},
            "give exactly one of eps",
        ),
        (
            {
                "name": "x",
                "mechanism": "corbin",
                "reference": "ldpfl",
                "claim": "above",
                "eps": 1,
                "eps-max": 1,
            },
            "give exactly one of eps",
        ),
        (
            {"name": "x", "mechanism": "corbin", "reference": "ldpfl", "claim": "over", "eps": 1},
            "claim",
        ),
        (
            {"name": "x", "mechanism": "corbin", "reference": "ldpfl", "claim": "above", "eps": 0},
            "eps",
        ),
        (
            {
                "name": "x",
                "mechanism": "corbin",
                "reference": "ldpfl",
                "claim": "above",
                "eps": 1,
                "threshold": 2,
            },
            "unknown key(s) threshold",
        ),
    ],
)
def test_a_bad_target_names_its_key(target: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        parse_spec(_spec(target=[target]), source="s.toml")
    assert "s.toml: target[0]" in str(err.value)


def test_targets_are_an_array_of_tables_with_distinct_names_and_federated_only() -> None:
    one = {"name": "x", "mechanism": "corbin", "reference": "ldpfl", "claim": "above", "eps": 1}
    with pytest.raises(SpecError, match="expected an array of tables"):
        parse_spec(_spec(target=one))
    with pytest.raises(SpecError, match="duplicate values"):
        parse_spec(_spec(target=[one, one]))
    mse = {"experiment": {"name": "m", "kind": "mse"}, "mse": {}, "target": [one]}
    with pytest.raises(SpecError, match='not used by kind = "mse"'):
        parse_spec(mse)


def test_covers_one_eps_or_every_eps_up_to_eps_max() -> None:
    one = TargetSpec(name="a", mechanism="corbin", reference="ldpfl", claim="above", eps=0.5)
    assert one.covers(0.5) and not one.covers(0.3)
    upto = TargetSpec(name="b", mechanism="corbin", reference="ldpfl", claim="above", eps_max=1)
    assert upto.covers(0.1) and upto.covers(1.0) and not upto.covers(3.0)
    neither = TargetSpec(name="c", mechanism="corbin", reference="ldpfl", claim="above")
    with pytest.raises(ValueError, match="give one of eps and eps_max"):
        neither.covers(1.0)


def test_a_report_names_its_targets_scale(tmp_path: Path) -> None:
    """The default targets are the quick scale's ("Quick-scale targets"); a spec's own are
    "Accuracy targets", with no scale in their table's header (the paper's specs)."""
    from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

    from corbin_fl.experiments import cli as ex

    own = TINY + (
        '\n[[target]]\nname = "mine"\nmechanism = "corbin"\nreference = "ldpfl"\n'
        'claim = "above"\neps-max = 1.0\n'
    )
    for text, heading, header in (
        (TINY, "## Quick-scale targets", "target (quick scale, reported, not asserted)"),
        (own, "## Accuracy targets", "target (reported, not asserted)"),
    ):
        (root := tmp_path / heading.split()[1]).mkdir()
        out = ex.run(
            spec_from(text), root, app_dir=fake_app_dir(root), backend=FakeBackend(), progress=False
        )
        report = out.report.read_text(encoding="utf-8") if out.report else ""
        assert heading in report and f"| {header} |" in report
        assert ("Quick-scale" in report) == (text is TINY)

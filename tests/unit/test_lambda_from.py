"""Lambda taken from another spec (``[lambda-from]``): a grid without its own ``lambda-grid``
runs each setting only at the lambda chosen for its counterpart in the other spec, and waits
until that choice is made; the plan, the runner and the report agree (issue 40: the paper's
other mechanisms and secure aggregation at the main table's choices)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from corbin_fl.experiments import cli as ex
from corbin_fl.experiments.results import choose_lambda, load_run
from corbin_fl.experiments.spec import ExperimentSpec, SpecError, load_spec
from corbin_fl.experiments.sweep import POOL_DIR, RunState, expand_runs, table_size

SOURCE = TINY.replace("seeds = [0, 1]\n", "seeds = [0, 1, 2]\nlambda-seeds = [0]\n").replace(
    "lambda-grid = [0.5, 1.0]", "lambda-grid = [0.25, 0.5, 1.0]"
)
BORROWER = """
seeds = [0, 1]

[lambda-from]
spec = "source.toml"
ignore = ["secure-aggregation", "secagg-threshold", "secagg-neighbours"]
mechanism = { augcorbin = "corbin" }

[experiment]
name = "borrower"
retry-delay-s = 0

[base]
clients = 4
num-rounds = 4
d = 5

[grid]                             # at CorBin-FL's and LDP-FL's choices in source.toml
mechanism = ["augcorbin", "ldpfl"]
epsilon = [0.5, 1.0]

[[extra-grid]]                     # LDP-FL with secure aggregation: LDP-FL's choice
mechanism = ["ldpfl"]
epsilon = [0.5]
secure-aggregation = [true]

[[extra-grid]]                     # no counterpart: chooses its own
mechanism = ["central-gaussian"]
epsilon = [1.0]
lambda-grid = [0.5, 1.0]

[plots]
figures = ["accuracy-vs-epsilon"]
"""
BORROWING_SETTINGS = 5  # augcorbin and ldpfl at two eps, ldpfl with secure aggregation
SECURE_GRID = """
[[extra-grid]]                     # LDP-FL with secure aggregation: LDP-FL's choice
mechanism = ["ldpfl"]
epsilon = [0.5]
secure-aggregation = [true]
"""


def _specs(tmp_path: Path, borrower: str = BORROWER) -> tuple[ExperimentSpec, ExperimentSpec]:
    """The source spec and the borrowing one, as files side by side (the path is relative)."""
    (tmp_path / "source.toml").write_text(SOURCE, encoding="utf-8")
    (path := tmp_path / "borrower.toml").write_text(borrower, encoding="utf-8")
    return spec_from(SOURCE, str(tmp_path / "source.toml")), spec_from(borrower, str(path))


def test_a_borrowing_setting_runs_at_its_counterparts_candidates_and_chooses_nothing(
    tmp_path: Path,
) -> None:
    source, spec = _specs(tmp_path)
    theirs = {r.setting_key: r for r in expand_runs(source)}
    runs = expand_runs(spec)
    borrowing = [r for r in runs if r.counterpart is not None]
    own = [r for r in runs if r.counterpart is None]
    assert {r.run_config["mechanism"] for r in own} == {"central-gaussian"}
    assert all(r.selects for r in own) and not any(r.selects for r in borrowing)
    assert len(borrowing) == BORROWING_SETTINGS * 3 * 2  # the source's 3 lambdas x 2 seeds
    for r in borrowing:
        other = theirs[r.counterpart]  # the counterpart is a setting of the source spec
        mech = "corbin" if r.run_config["mechanism"] == "augcorbin" else "ldpfl"
        assert other.run_config["mechanism"] == mech
        assert other.run_config["epsilon"] == r.run_config["epsilon"]
        assert "secure-aggregation" not in other.run_config
    secure = {r.counterpart for r in borrowing if r.run_config.get("secure-aggregation")}
    plain = {r.counterpart for r in borrowing if r.run_config["mechanism"] == "ldpfl"}
    assert len(secure) == 1 and secure < plain  # the same counterpart as LDP-FL at eps 0.5
    # the table: each borrowing setting on each seed once, central Gaussian 2 lambdas x 2 seeds
    assert table_size(spec, runs) == BORROWING_SETTINGS * 2 + 2 * 2
    assert spec.all_lambdas == (0.25, 0.5, 1.0)


def test_the_plan_waits_for_the_counterparts_choice_then_runs_only_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # without secure aggregation: its report's server table at n = 1,000 takes minutes of CPU
    assert SECURE_GRID in BORROWER
    source, spec = _specs(tmp_path, BORROWER.replace(SECURE_GRID, ""))
    settings = BORROWING_SETTINGS - 1
    root, app, backend = tmp_path / "r", fake_app_dir(tmp_path), FakeBackend()
    planned = ex.plan(spec, root)
    assert {s for r, s in planned if r.counterpart is not None} == {RunState.WAITING}
    assert ex.plan_counts(spec, planned) == (
        "borrower: 12 runs (0 done, 0 partial, 4 to do, 8 then at the lambda chosen for their "
        "counterpart in source.toml)"
    )
    first = ex.run(spec, root, app_dir=app, backend=backend, progress=False)
    assert first.executed == 4  # central Gaussian; the others wait
    command = f"corbin-fl experiment run {tmp_path / 'source.toml'} --results {root}"
    assert f"their counterpart's in tiny (run it first: `{command}`)" in caplog.text
    # the source chooses on seed 0; its seeds 1 and 2 need not run for the choice to be made
    ex.run(source, root, app_dir=app, backend=backend, progress=False, max_runs=15)
    planned = ex.plan(spec, root)
    assert RunState.WAITING not in {s for _, s in planned}
    todo = [r for r, s in planned if s is RunState.MISSING]
    # plain LDP-FL here is the source's own setting: its seed-0 run at the choice is the
    # source's, done already in the shared pool
    shared = [r for r, s in planned if s is RunState.DONE and r.counterpart is not None]
    assert {(r.run_config["mechanism"], r.run_config["seed"]) for r in shared} == {("ldpfl", 0)}
    assert all(r.setting_key == r.counterpart for r in shared) and len(shared) == 2
    assert len(todo) == settings * 2 - len(shared)
    theirs = expand_runs(source)
    for r in todo:  # at the lambda the report's rule picks from the counterpart's seed-0 runs
        mine = [o for o in theirs if o.setting_key == r.counterpart and o.selects]
        chosen, _ = choose_lambda([load_run(root / POOL_DIR / o.run_id) for o in mine])
        assert r.run_config["global-lr"] == chosen
    calls = len(backend.calls)
    second = ex.run(spec, root, app_dir=app, backend=backend, progress=False)
    assert (second.executed, second.total, second.failed) == (6, 12, {})
    assert sorted(backend.calls[calls:]) == sorted(r.run_id for r in todo)
    report = second.report.read_text(encoding="utf-8") if second.report else ""
    assert "runs: 12 of 12 finished (complete)" in report
    assert "not chosen here, each setting runs at the lambda chosen for its counterpart in " in (
        " ".join(report.split())
    )
    assert "`source.toml`" in report and "augcorbin as corbin" in report
    assert "chosen here: extra-grid[0]: [0.5, 1.0]" in report


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (('spec = "source.toml"', 'spec = "nowhere.toml"'), "nowhere.toml does not exist"),
        (('spec = "source.toml"', 'spec = "borrower.toml"'), "cannot borrow from itself"),
        (('augcorbin = "corbin"', 'augcorbin = "corbn"'), "'corbn' is not a registered"),
        (('ignore = ["secure-aggregation", ', 'ignore = ["colour", '), "not run-config keys"),
        (("ignore", "ignor"), "unknown key"),
        (('spec = "source.toml"\n', ""), "lambda-from.spec: missing"),
        (("seeds = [0, 1]\n", "seeds = [0, 1]\nlambda-grid = [1.0]\n"), "lambda-grid: the grids"),
        (("seeds = [0, 1]\n", "seeds = [0, 1]\nlambda-seeds = [0]\n"), "lambda-seeds: not"),
        (("d = 5", "d = 3"), "has no setting that agrees with it"),
        (('ignore = ["secure-aggregation", ', 'ignore = ["mechanism", '), "matched through"),
        (('augcorbin = "corbin"', 'augcorbin = ["corbin"]'), "expected a mechanism's name"),
        (('augcorbin = "corbin" }', 'augcorbin = "corbin", rqm = "pbm" }'), "\\['rqm'\\] name"),
        (("secure-aggregation = [true]", "secure-aggregation = [true]\nlambda-grid = [1.0]"), ""),
    ],
    ids=[
        "missing-file",
        "itself",
        "unknown-mechanism",
        "unknown-ignored-key",
        "unknown-key",
        "no-spec",
        "top-level-grid",
        "lambda-seeds",
        "no-counterpart",
        "ignore-mechanism",
        "mapped-to-a-list",
        "unused-mapping",
        "fine",
    ],
)
def test_bad_lambda_from_fails_before_anything_runs(
    tmp_path: Path, edit: tuple[str, str], match: str
) -> None:
    text = BORROWER.replace(*edit)
    assert text != BORROWER
    if not match:  # a control: the same spec, one more grid choosing its own
        assert len(expand_runs(_specs(tmp_path, text)[1])) > 0
        return
    with pytest.raises(SpecError, match=match):
        expand_runs(_specs(tmp_path, text)[1])


def test_a_counterpart_must_be_one_setting_and_the_source_must_choose(tmp_path: Path) -> None:
    ambiguous = BORROWER.replace('ignore = ["secure-aggregation", ', 'ignore = ["epsilon", ')
    with pytest.raises(SpecError, match="2 settings that agree with it"):
        expand_runs(_specs(tmp_path, ambiguous)[1])
    mutual = tmp_path / "mutual.toml"  # borrows from a spec that borrows from it: no recursion
    mutual.write_text(BORROWER.replace('"source.toml"', '"other.toml"'), encoding="utf-8")
    (tmp_path / "other.toml").write_text(
        BORROWER.replace('"source.toml"', '"mutual.toml"'), encoding="utf-8"
    )
    with pytest.raises(SpecError, match="without \\[lambda-from\\]"):
        spec_from(mutual.read_text(encoding="utf-8"), str(mutual))
    chained = tmp_path / "chained.toml"
    chained.write_text(BORROWER.replace('"source.toml"', '"borrower.toml"'), encoding="utf-8")
    _specs(tmp_path)  # writes borrower.toml, which itself borrows
    with pytest.raises(SpecError, match="without \\[lambda-from\\]"):
        spec_from(chained.read_text(encoding="utf-8"), str(chained))
    every = BORROWER.replace("[grid]  ", "[grid]\nlambda-grid = [1.0]\n#").replace(
        "epsilon = [0.5]\nsecure-aggregation = [true]",
        "epsilon = [0.5]\nsecure-aggregation = [true]\nlambda-grid = [1.0]",
    )
    with pytest.raises(SpecError, match="none borrows"):
        _specs(tmp_path, every)
    with pytest.raises(SpecError, match='only used with kind = "federated"'):
        spec_from(
            '[lambda-from]\nspec = "source.toml"\n[experiment]\nname = "m"\nkind = "mse"\n',
            str(tmp_path / "m.toml"),
        )


def test_the_readmes_lambda_from_example_is_the_paper_specs() -> None:
    """experiments/README.md shows `fashion-cpu-rest.toml`'s own [lambda-from] table."""
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "experiments" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(\[lambda-from\].*?)```", text, flags=re.S)
    assert block is not None
    shown = tomllib.loads(block.group(1))["lambda-from"]
    rest = repo / "experiments" / "paper" / "fashion-cpu-rest.toml"
    assert tomllib.loads(rest.read_text(encoding="utf-8"))["lambda-from"] == shown
    spec = load_spec(rest)
    assert spec.lambda_from is not None and spec.lambda_from.path == shown["spec"]
    assert dict(spec.lambda_from.mechanism) == shown["mechanism"]


def test_a_finished_run_at_a_lambda_no_longer_chosen_waits_and_is_not_reported(
    tmp_path: Path,
) -> None:
    """The source's grid extended after a borrowing run finished: until the new choice is
    made, the borrowing setting's runs wait (its finished one is not counted, nor reported);
    then only the run at the new choice counts."""
    source, spec = _specs(tmp_path, BORROWER.replace(SECURE_GRID, ""))
    root, app, backend = tmp_path / "r", fake_app_dir(tmp_path), FakeBackend()
    ex.run(source, root, app_dir=app, backend=backend, progress=False, max_runs=15)
    ex.run(spec, root, app_dir=app, backend=backend, progress=False)
    assert ex.plan_counts(spec, ex.plan(spec, root)).startswith("borrower: 12 runs (12 done")
    wider = SOURCE.replace("lambda-grid = [0.25, 0.5, 1.0]", "lambda-grid = [0.1, 0.25, 0.5, 1.0]")
    (tmp_path / "source.toml").write_text(wider, encoding="utf-8")
    spec = spec_from(BORROWER.replace(SECURE_GRID, ""), str(tmp_path / "borrower.toml"))
    planned = ex.plan(spec, root)
    # central Gaussian's 4 runs stay done; each borrowing setting and seed waits, once
    assert ex.plan_counts(spec, planned) == (
        "borrower: 12 runs (4 done, 0 partial, 0 to do, 8 then at the lambda chosen for their "
        "counterpart in source.toml)"
    )
    finished = ex.load_finished(spec, root)
    assert {r.setting["mechanism"] for r in finished} == {"central-gaussian"}
    ex.run(
        spec_from(wider, str(tmp_path / "source.toml")),
        root,
        app_dir=app,
        backend=backend,
        progress=False,
        max_runs=5,
    )  # the new lambda's seed-0 runs: the choice is made again
    planned = ex.plan(spec, root)
    assert RunState.WAITING not in {s for _, s in planned}
    assert sum(s is RunState.DONE for _, s in planned) + len(ex.to_do(planned)) == 12

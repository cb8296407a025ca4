"""The report's table against eps_p (the paper's table): one row per setting of the other swept
keys, one column per eps_p, the settings without privacy on a line of their own."""

from __future__ import annotations

from pathlib import Path

from fake_experiments import TINY, FakeBackend, fake_app_dir, spec_from

from corbin_fl.experiments import cli as ex
from corbin_fl.experiments.report import against_table
from corbin_fl.experiments.results import group_results, varying_keys


def test_the_table_against_epsilon_has_a_column_per_eps_and_fedavg_apart(tmp_path: Path) -> None:
    spec, root = spec_from(TINY), tmp_path / "r"
    out = ex.run(spec, root, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(), progress=False)
    results = ex.load_finished(spec, root)
    groups, keys = group_results(results), varying_keys(results)
    lines = against_table(groups, keys, "epsilon")
    assert lines[0] == "### Test accuracy against epsilon (at the validation-selected round)"
    text = "\n".join(lines)
    assert "| setting | epsilon=0.5 | epsilon=1 |" in text
    by_cell = {(g.setting["mechanism"], g.setting.get("epsilon")): g.test.fmt() for g in groups}
    for mech in ("ldpfl", "corbin"):  # each row holds that mechanism's two settings, in order
        row = f"| {mech} | {by_cell[(mech, 0.5)]} | {by_cell[(mech, 1.0)]} |"
        assert row in text
    fedavg = next(g for g in groups if g.setting["mechanism"] == "fedavg")
    assert f"Not reading epsilon: fedavg {fedavg.test.fmt()}." in text
    assert "| fedavg |" not in text
    report = out.report.read_text(encoding="utf-8") if out.report else ""
    assert text in report
    # a key that does not vary, or varies over one value, gives no table
    assert against_table(groups, keys, "d") == []
    one_eps = [g for g in groups if g.setting.get("epsilon") != 0.5]
    assert against_table(one_eps, keys, "epsilon") == []


def test_the_results_table_gives_the_uplink_bits_per_parameter(tmp_path: Path) -> None:
    spec, root = spec_from(TINY), tmp_path / "r"
    out = ex.run(spec, root, app_dir=fake_app_dir(tmp_path), backend=FakeBackend(), progress=False)
    report = out.report.read_text(encoding="utf-8") if out.report else ""
    results_table = report.split("## Results", 1)[1].split("###", 1)[0]
    assert "| uplink bits / parameter |" in results_table
    for g in group_results(ex.load_finished(spec, root)):
        run = g.runs[0]  # bytes up per client and round over the model's parameters
        clients = sum(row["participants"] for row in run.rows)
        bits = 8 * run.uplink_bytes / (clients * run.summary["num_params"])
        assert f"| {bits:.4g} |" in results_table

"""The app's run config (:class:`corbin_fl.app.config.AppConfig`: the protocol's ``RunConfig`` and
the task's fields): parsing, validation and the pyproject defaults; the protocol's alone."""

from __future__ import annotations

import dataclasses
import io
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from corbin_fl import registry
from corbin_fl.app.config import AppConfig
from corbin_fl.config import MECHANISMS, ConfigError, RunConfig

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_app_bundle_holds_the_app_code_and_nothing_else() -> None:
    """`flwr run` ships this FAB to every SuperNode: results, docs and tests of the checkout stay
    out of it (Flower refuses a FAB over 10 MiB), and both apps' modules are in it."""
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(PYPROJECT.parent)
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert {n.split("/")[0] for n in names} == {
        ".info",
        "pyproject.toml",
        "client",
        "server",
        "mechanisms",
        "app",
        "corbin_fl",
    }
    tool = tomllib.loads(PYPROJECT.read_text())["tool"]
    folders = tool["setuptools"]["package-dir"]  # installed name -> the tree's folder
    for ref in tool["flwr"]["app"]["components"].values():
        package, _, module = ref.split(":")[0].rpartition(".")
        assert f"{folders[package]}/{module}.py" in names
    assert len(fab) < 2 * 1024 * 1024


def test_the_app_bundle_imports_only_the_app_and_its_dependencies() -> None:
    """The tooling (deploy/, experiments/, rich, tomli-w, pandas, matplotlib) stays out of the
    app: no module of the FAB imports it, even lazily, so a SuperNode never needs it."""
    import ast
    import sys

    from flwr.cli.build import build_fab_from_disk

    fab = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(PYPROJECT.parent)))
    roots: dict[str, set[str]] = {}
    for name in fab.namelist():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(fab.read(name))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module]
            else:
                continue
            for module in found:
                parts = module.split(".")  # corbin_fl.<subpackage> is this project's room
                root = ".".join(parts[:2]) if parts[0] == "corbin_fl" else parts[0]
                roots.setdefault(root, set()).add(name)
    third_party = {r: sorted(f) for r, f in roots.items() if r not in sys.stdlib_module_names}
    app = {"corbin_fl", "corbin_fl.client", "corbin_fl.server", "corbin_fl.mechanisms"}
    app |= {"corbin_fl.app"}
    app |= {f"corbin_fl.{path.stem}" for path in (PYPROJECT.parent / "corbin_fl").iterdir()}
    runtime = {"flwr", "numpy", "torch", "cryptography", "scipy", "mlxtend", "flwr_datasets"}
    runtime |= {"datasets"}  # flwr-datasets' own dependency (the LEAF and hub loaders)
    runtime |= {"packaging"}  # declared: corbin_fl/flower_version.py compares Flower versions
    # dp_accounting only where the privacy-loss math asks for it (lazy imports): privacy_loss.py
    # with method="dp_accounting", the composition against the server (secure_sum.py,
    # server_pld.py) and the lower bounds the printed guarantees are tested against
    optional = {
        "dp_accounting": [
            "mechanisms/lower_bounds.py",
            "mechanisms/privacy_loss.py",
            "mechanisms/secure_sum.py",
            "mechanisms/server_pld.py",
        ]
    }
    unexpected = {r: f for r, f in third_party.items() if r not in app | runtime | set(optional)}
    assert not unexpected, f"the app imports tooling or undeclared packages: {unexpected}"
    for root, files in optional.items():
        assert third_party.get(root, files) == files


def test_pyproject_defaults_equal_dataclass_defaults() -> None:
    """Every key of pyproject's table has its AppConfig default (a mechanism's parameter: its
    registered default); a key missing there can only be a parameter of a mechanism registered
    later, which takes the default of its registry entry."""
    table = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    defaults = AppConfig.defaults()
    assert table == {key: defaults[key] for key in table}
    assert set(table) <= set(AppConfig.keys())
    assert set(AppConfig.keys()) - set(table) <= set(registry.param_specs())
    for key, spec in registry.param_specs().items():
        assert table.get(key, spec.default) == spec.default, key
    assert AppConfig.from_flower(table) == AppConfig()


def test_empty_config_gives_defaults_and_round_trips() -> None:
    cfg = AppConfig.from_flower({})
    assert cfg == AppConfig()
    assert AppConfig.from_flower(cfg.to_flower()) == cfg
    assert all("_" not in key for key in cfg.to_flower())


def test_kebab_keys_map_to_fields() -> None:
    cfg = AppConfig.from_flower(
        {"num-rounds": 7, "cr-mode": "derived", "p-x": 0.25, "test-z-digest": True}
    )
    assert (cfg.num_rounds, cfg.cr_mode, cfg.p_x, cfg.test_z_digest) == (7, "derived", 0.25, True)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_mechanism_is_accepted(mechanism: str) -> None:
    assert AppConfig.from_flower({"mechanism": mechanism}).mechanism == mechanism


def test_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({"num-round": 3})
    assert "num-round" in info.value.errors
    assert "did you mean 'num-rounds'" in str(info.value)


def test_all_bad_keys_are_listed_at_once() -> None:
    bad = {"mechansim": "corbin", "epsilon": -1, "d": True, "cr-mode": "rely", "lr": "fast"}
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower(bad)
    assert set(info.value.errors) == set(bad)
    text = str(info.value)
    assert "5 bad key(s)" in text
    assert "did you mean 'relay'" in text
    assert "did you mean 'mechanism'" in text


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("num-rounds", 1.5, "expected an integer"),
        ("num-rounds", True, "got a bool"),
        ("epsilon", "1", "expected a number"),
        ("epsilon", float("inf"), "finite"),
        ("mechanism", 3, "expected a string"),
        ("test-z-digest", 1, "expected a bool"),
    ],
)
def test_type_errors(key: str, value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({key: value})
    assert fragment in info.value.errors[key]


def test_integral_float_and_int_coercions() -> None:
    cfg = AppConfig.from_flower({"num-rounds": 4.0, "epsilon": 2, "test-z-digest": "true"})
    assert cfg.num_rounds == 4 and isinstance(cfg.num_rounds, int)
    assert cfg.epsilon == 2.0 and isinstance(cfg.epsilon, float)
    assert cfg.test_z_digest is True


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num-rounds", 0),
        ("epsilon", 0.0),
        ("delta", 1.0),
        ("delta", 0.0),
        ("d", 0),
        ("d", 17),
        ("gamma", 1.5),
        ("p-x", 0.0),
        ("p-x", 1.0),
        ("global-lr", 0.0),
        ("global-lr", 1.1),
        ("radius-margin", -0.1),
        ("min-radius", 0.0),
        ("range-quantile", 0.5),
        ("range-quantile", 1.01),
        ("range-mode", "weights"),
        ("update-radius", -0.01),
        ("update-radius", float("nan")),
        ("dirichlet-alpha", 0.0),
        ("local-epochs", 0),
        ("batch-size", 0),
        ("lr", 0.0),
        ("weight-decay", -1.0),
        ("max-steps", -1),
        ("seed", -1),
        ("min-clients", 0),
        ("clients-per-round", -1),
        ("stage-timeout", 0.0),
        ("first-stage-timeout", -1.0),
        ("poll-interval", 0.0),
        ("checkpoint-patience", -1),
        ("ternary-sparsity", 1.0),
        ("ternary-encoding", "nibbles"),
        ("fedcad-clip", 0.0),
        ("fedcad-gamma", 2.0),
        ("fedcad-diff-init", 1.0),
        ("dropout-prob", 1.0),
        ("mechanism", "corbinn"),
        ("dataset", "imagenet"),
        ("partitioner", "shards"),
        ("model", "vgg"),
        ("optimizer", "rmsprop"),
        ("device", "tpu"),
    ],
)
def test_range_errors_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({key: value})
    assert list(info.value.errors) == [key]
    assert key in str(info.value)


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({"min-clients": 4, "clients-per-round": 2})
    assert "clients-per-round" in info.value.errors
    with pytest.raises(ConfigError) as info:
        AppConfig.from_flower({"fedcad-diff-init": 0.1, "fedcad-diff-floor": 0.2})
    assert "fedcad-diff-floor" in info.value.errors
    assert AppConfig.from_flower({"min-clients": 4, "clients-per-round": 0}).clients_per_round == 0


def test_hub_datasets_are_accepted() -> None:
    assert AppConfig.from_flower({"dataset": "hf:ylecun/mnist"}).dataset == "hf:ylecun/mnist"
    with pytest.raises(ConfigError):
        AppConfig.from_flower({"dataset": "hf:"})


def test_non_mapping_and_non_string_keys_are_type_errors() -> None:
    with pytest.raises(TypeError):
        AppConfig.from_flower([("epsilon", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AppConfig.from_flower({1: 2})  # type: ignore[dict-item]


def test_frozen_and_replace_revalidates() -> None:
    cfg = AppConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epsilon = 3.0  # type: ignore[misc]
    assert cfg.replace(epsilon=3.0).epsilon == 3.0
    with pytest.raises(ConfigError):
        cfg.replace(epsilon=-3.0)


def test_paired_property() -> None:
    assert AppConfig(mechanism="corbin").paired and AppConfig(mechanism="augcorbin").paired
    assert not any(AppConfig(mechanism=m).paired for m in MECHANISMS if "corbin" not in m)


def test_execution_and_resumable_keys_are_declared_once_on_the_fields() -> None:
    """The sweeps (a run's id hashes its result config) and resume read the same declaration:
    every key that cannot change a result may differ on resume, and the keys that change the
    result are never among them."""
    from corbin_fl.server.checkpoint import MAY_DIFFER_ON_RESUME

    execution = AppConfig.execution_keys()
    assert execution.isdisjoint(AppConfig().result_config())
    secure = AppConfig(secure_aggregation=True).result_config()
    assert set(secure) | execution == set(AppConfig.keys())
    # a run without secure aggregation keeps the id it had before the keys existed
    assert set(secure) - set(AppConfig().result_config()) == {
        "secure-aggregation",
        "secagg-neighbours",
        "secagg-threshold",
    }
    assert RunConfig.resumable_keys() == MAY_DIFFER_ON_RESUME  # the protocol's
    resumable = AppConfig.resumable_keys()  # what the checkpoint of an app's run uses
    assert resumable == MAY_DIFFER_ON_RESUME | {"data-dir", "eval-batch-size"}
    assert execution < resumable
    assert resumable - execution == {"num-rounds", "min-clients"}
    for key in ("mechanism", "epsilon", "seed", "data-seed", "lr", "model", "dataset", "d"):
        assert key not in resumable
    assert {"out-dir", "data-dir", "stage-timeout", "device", "resume"} <= execution


TASK_KEYS = frozenset(
    {
        *("dataset", "data-dir", "use-official-test", "data-seed", "partitioner"),
        *("dirichlet-alpha", "model", "local-epochs", "batch-size", "optimizer", "lr"),
        *("weight-decay", "max-steps", "dropout-prob", "eval-batch-size"),
    }
)


def test_the_protocols_config_names_no_task_key_and_the_app_keeps_the_table_order() -> None:
    """Issue 41 item 4: the task's keys are the app's (``AppConfig``); the app's keys keep the
    order of pyproject's table and of every ``summary.json`` so far, the protocol's keys keep
    theirs among them."""
    app_keys = AppConfig.keys()
    assert set(app_keys) - set(RunConfig.keys()) == TASK_KEYS
    assert not TASK_KEYS & set(RunConfig.keys())
    protocol = [key for key in app_keys if key not in TASK_KEYS]
    assert protocol == list(RunConfig.keys()) == list(RunConfig().to_flower())
    table = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert [key for key in app_keys if key in table] == list(table)
    assert isinstance(AppConfig(), RunConfig)
    assert type(AppConfig().replace(lr=0.1)) is AppConfig


def test_the_protocol_refuses_a_task_key_unless_the_app_names_its_keys() -> None:
    """A key the protocol does not own is refused (it cannot tell it from a typo); an app that
    names its own keys gets them left alone, and every other unknown key still refused."""
    with pytest.raises(ConfigError) as bad:
        RunConfig.from_flower({"dataset": "mnist", "epsilonn": 1.0})
    assert bad.value.errors == {
        "dataset": "unknown key",
        "epsilonn": "unknown key; did you mean 'epsilon'?",
    }
    cfg = RunConfig.from_flower({"dataset": "mnist", "epsilon": 2.0}, app_keys=("dataset",))
    assert type(cfg) is RunConfig and cfg.epsilon == 2.0
    with pytest.raises(ConfigError, match="epsilonn: unknown key"):
        RunConfig.from_flower({"dataset": "x", "epsilonn": 1.0}, app_keys=("dataset",))
    with pytest.raises(ConfigError, match="epsilon: must be > 0"):  # its own key stays its own
        RunConfig.from_flower({"epsilon": -1.0}, app_keys=("epsilon",))

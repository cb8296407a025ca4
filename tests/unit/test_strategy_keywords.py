"""``CorBin``'s keywords (issue 41 item 4): explicit, typed protocol settings with the run
config's defaults and checks, and the registered mechanisms' parameters; nothing else."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from flwr.serverapp.strategy import FedAvg

from corbin_fl import registry
from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.server.strategy import DEFAULT_UPDATE_RADIUS, CorBin

OWN = {"strategy", "update_radius", "select_metric", "mechanism_params"}
"""Keywords of CorBin that are not a RunConfig field of the same name."""


def _protocol_keywords() -> dict[str, inspect.Parameter]:
    signature = inspect.signature(CorBin.__init__)
    return {n: p for n, p in signature.parameters.items() if n not in OWN | {"self"}}


def test_every_protocol_keyword_is_a_run_config_field_with_its_default() -> None:
    defaults = RunConfig.defaults()
    keywords = _protocol_keywords()
    assert len(keywords) == 28
    for name, param in keywords.items():
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default == defaults[name.replace("_", "-")], name
        assert type(param.default) is type(defaults[name.replace("_", "-")]), name
    # the task's settings (data, model, local training) are the app's, not the building block's
    assert not {"dataset", "model", "lr", "local_epochs", "clients_per_round"} & set(keywords)


def test_the_defaults_give_the_run_configs_defaults() -> None:
    cfg = CorBin(FedAvg()).cfg
    want = RunConfig.from_flower({"update-radius": DEFAULT_UPDATE_RADIUS})
    assert cfg == want


@pytest.mark.parametrize(
    ("keywords", "key"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"d": 17}, "d"),
        ({"cr_mode": "rely"}, "cr-mode"),
        ({"mechanism": "pbm", "pbm_trials": 0}, "pbm-trials"),
        ({"secure_aggregation": True, "mechanism": "imvu"}, "secure-aggregation"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_its_key(keywords: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        CorBin(FedAvg(), **keywords)
    assert key in info.value.errors


def test_mechanism_parameters_are_keywords_and_nothing_else_is() -> None:
    for spec in registry.param_specs().values():
        assert spec.field not in _protocol_keywords()  # derived from the registry, not listed
    strategy = CorBin(FedAvg(), mechanism="pbm", pbm_trials=4, secure_aggregation=True)
    assert (strategy.cfg.param("pbm-trials"), strategy.cfg.secure_aggregation) == (4, True)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['dataset'\]"):
        CorBin(FedAvg(), dataset="mnist")
    with pytest.raises(TypeError, match="must be a number or a callable"):
        CorBin(FedAvg(), update_radius="wide")  # type: ignore[arg-type]

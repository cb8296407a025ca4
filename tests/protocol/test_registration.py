"""The 4-file rule: one registry entry is all a new parameterised one-bit mechanism needs.

A toy mechanism, ``shrunk-rr`` (randomized response of each parameter pulled towards its center
by a factor ``shrunk-factor``), is registered with one parameter by a fixture that unregisters it
afterwards. Its math and encoder live in this file (for a real mechanism:
``mechanisms/baselines/<name>.py`` and ``client/encode.py``), it decodes with the existing
one-bit aggregator, and nothing else changes: the parameter reaches the config (parsed,
defaulted, checked), the ``CorBin`` keywords, the wire (an instruction carries it, the client
parses it), the node policy (its declared default), the accounting (its category) and the
privacy report, and a protocol round runs with it on the in-process harness.

The other tests here check what the registry derives against what it replaced: the v1 wire
order of ``PARAM_KEYS``, the config's parameters against their specs, and the generic
path without branches on a mechanism's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from corbin_fl import registry, wire
from corbin_fl.client.encode import Encoded, EncodeInput, by_block
from corbin_fl.client.policy import Policy, PolicyError
from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.mechanisms import accounting, categories, report
from corbin_fl.mechanisms.categories import Privacy

ROOT = Path(__file__).resolve().parents[2]
TOY = "shrunk-rr"
KEY = "shrunk-factor"


# ----------------------------------------------------------------------------- the toy mechanism
def shrink(w: torch.Tensor, c: torch.Tensor | float, factor: float) -> torch.Tensor:
    """Its math: every parameter pulled towards its center, ``c + factor (w - c)``."""
    return c + factor * (w - c)


def encode_shrunk(job: EncodeInput) -> Encoded:
    """Its encoder: LDPQ (one eps_p-randomized-response bit) of the shrunk parameters."""
    from corbin_fl.mechanisms.packing import pack_bits
    from corbin_fl.mechanisms.quantizers import ldpq

    factor = float(job.cfg.param(KEY))
    w = job.w
    bits = by_block(
        w,
        job.blocks,
        lambda s, c, r: ldpq(shrink(w[s], c, factor), c, r, job.cfg.epsilon, generator=job.gen),
        torch.bool,
    )
    return wire.BITS, pack_bits(bits), None


def _factor(value: Any, cfg: RunConfig) -> str | None:
    return None if 0.0 < value <= 1.0 else f"must be in (0.0, 1.0], got {value}"


ENTRY = registry.Mechanism(
    TOY,
    "randomized response of each parameter shrunk towards its center",
    registry.one_bit,
    f"{__name__}:encode_shrunk",
    "corbin_fl.server.aggregation:BitsAggregator",
    params=(registry.Param(KEY, float, 1.0, "The shrink factor, in (0, 1].", _factor),),
    privacy=Privacy(
        "pure", release="released parameter is randomized response of its shrunk value"
    ),
    node_default=False,  # a node admits it only when its corbin-mechanisms names it
)


@pytest.fixture
def toy() -> Iterator[registry.Mechanism]:
    """``shrunk-rr`` registered for one test, unregistered afterwards."""
    registry.register(ENTRY)
    try:
        yield ENTRY
    finally:
        registry.unregister(TOY)


# ----------------------------------------------------------------------------- the 4-file rule
def test_the_parameter_reaches_the_config(toy: registry.Mechanism) -> None:
    cfg = RunConfig.from_flower({"mechanism": TOY, KEY: 0.25})
    assert cfg.param(KEY) == 0.25 and cfg.params == {**RunConfig().params, KEY: 0.25}  # parsed
    assert cfg.to_flower()[KEY] == 0.25 and RunConfig.from_flower(cfg.to_flower()) == cfg
    assert RunConfig().param(KEY) == 1.0 and RunConfig.defaults()[KEY] == 1.0  # defaulted
    assert KEY in set(RunConfig.keys()) and cfg.replace(**{"shrunk_factor": 0.5}).param(KEY) == 0.5
    assert RunConfig.from_flower({KEY: 1}).param(KEY) == 1.0  # coerced to its type
    with pytest.raises(ConfigError) as bad:  # checked, with a message naming it
        RunConfig.from_flower({"mechanism": TOY, KEY: 1.5})
    assert bad.value.errors == {KEY: "must be in (0.0, 1.0], got 1.5"}
    assert f"{KEY}: must be in (0.0, 1.0], got 1.5" in str(bad.value)
    with pytest.raises(ConfigError, match=f"{KEY}: expected a number"):
        RunConfig.from_flower({KEY: "half"})
    with pytest.raises(ConfigError, match="did you mean 'shrunk-factor'"):
        RunConfig.from_flower({"shrunk-facter": 0.5})

    from flwr.serverapp.strategy import FedAvg

    from corbin_fl.server.strategy import CorBin

    strategy = CorBin(FedAvg(), mechanism=TOY, shrunk_factor=0.5)  # a keyword of CorBin
    assert strategy.cfg.param(KEY) == 0.5


def test_the_parameter_rides_the_wire(toy: registry.Mechanism) -> None:
    from harness import make_instruction, mechanism_params

    from corbin_fl.client.mod import instruction_config

    assert registry.PARAM_KEYS[-3:] == (KEY, "test-z-digest", *wire.TRAILING_PARAM_KEYS)
    assert KEY in registry.keygen_cfg_keys()
    assert KEY in registry.update_cfg_keys(TOY, wire.SOLO, "relay")
    params = mechanism_params(mechanism=TOY, shrunk_factor=0.5)
    assert params[KEY] == 0.5
    msg = make_instruction(wire.KEYGEN, **params)
    assert msg.content.config_records[wire.CFG][KEY] == 0.5  # the instruction carries it
    assert instruction_config(msg).param(KEY) == 0.5  # the client parses it
    del msg.content.config_records[wire.CFG][KEY]
    with pytest.raises(wire.WireError, match=KEY):
        instruction_config(msg)


def test_the_node_policy_default_is_the_declared_one(toy: registry.Mechanism) -> None:
    cfg = RunConfig.from_flower({"mechanism": TOY, "epsilon": 0.5})
    assert TOY not in Policy.from_node({}, {}).mechanisms  # node_default=False
    with pytest.raises(PolicyError, match=TOY):
        Policy.from_node({}, {}).check(cfg)
    Policy.from_node({"corbin-mechanisms": TOY}, {}).check(cfg)  # a node that names it
    with pytest.raises(PolicyError, match="epsilon"):  # local DP: its epsilon is bounded
        Policy.from_node({"corbin-mechanisms": TOY, "corbin-max-epsilon": 0.25}, {}).check(cfg)


def test_the_accounting_and_the_report_follow_its_category(toy: registry.Mechanism) -> None:
    assert categories.category(TOY) is ENTRY.category and TOY in accounting.MECHANISMS
    cfg = RunConfig.from_flower({"mechanism": TOY, "epsilon": 0.5})
    event = toy.release(cfg, 1, 7, 100, paired=True)  # never paired: it does not pair
    assert (event.eps_p, event.paired, event.d, event.delta) == (0.5, False, None, None)
    ledger = accounting.PrivacyLedger([event, toy.release(cfg, 2, 7, 100, paired=False)])
    mine = accounting.Accountant()
    for released in ledger:
        mine.compose(released)
    ldp = accounting.Accountant()
    for r in (1, 2):
        ldp.compose(
            registry.get("ldpfl").release(cfg.replace(mechanism="ldpfl"), r, 7, 100, paired=False)
        )
    assert mine.get_epsilon(1e-5) == ldp.get_epsilon(1e-5)  # 200-fold RR

    rep = report.privacy_report(TOY, 0.5, 1e-5, 100, 2)
    ref = report.privacy_report("laplace", 0.5, 1e-5, 100, 2)  # the same family
    tm = rep["threat_models"]
    assert rep["mechanism"] == TOY and rep["eps_p"] == 0.5
    assert {k: v["dp"] for k, v in tm.items()} == {"A": True, "B": True, "C": True, "D": True}
    assert tm["A"]["all_rounds"] == ref["threat_models"]["A"]["all_rounds"]
    assert tm["A"]["headline"] == "eps_p = 0.5 per parameter"
    assert (
        "Each released parameter is randomized response of its shrunk value"
        in (tm["A"]["guarantee"])
    )
    assert any(note.startswith(f"(A) {TOY} is pure eps_p-DP") for note in rep["notes"])
    with pytest.raises(ValueError, match="unknown mechanism"):
        registry.unregister(TOY)
        report.privacy_report(TOY, 0.5, 1e-5, 100, 2)
    registry.register(ENTRY)  # the fixture unregisters it again


def test_a_round_runs_with_it(toy: registry.Mechanism) -> None:
    from harness import InProcessGrid, make_cfg, run

    grid = InProcessGrid(make_cfg(num_rounds=1, mechanism=TOY, shrunk_factor=0.5), 3)
    summary = run(grid)
    updates = [m for m in grid.sent if m.content.config_records[wire.CFG][wire.STAGE] == "update"]
    assert len(updates) == 3
    assert all(m.content.config_records[wire.CFG][KEY] == 0.5 for m in updates)
    replies = [m for m in grid.received if m.has_content()]
    assert len(replies) == 3 and all(wire.UPDATE_REC in m.content.array_records for m in replies)
    assert summary["config"][KEY] == 0.5 and summary["config"]["mechanism"] == TOY
    privacy = summary["privacy"]
    assert privacy["mechanism"] == TOY and privacy["threat_models"]["A"]["dp"] is True


# ----------------------------------------------------------------------------- derived = replaced
V1_PARAM_KEYS = (
    "mechanism",
    "epsilon",
    "delta",
    "d",
    "p-x",
    "cr-mode",
    "range-mode",
    "ternary-sparsity",
    "ternary-encoding",
    "pbm-trials",
    "rqm-levels",
    "rqm-q",
    "imvu-bits",
    "central-clip",
    "fedcad-clip",
    "fedcad-gamma",
    "fedcad-sigma-diff",
    "fedcad-diff-init",
    "fedcad-diff-floor",
    "test-z-digest",
)
"""``registry.PARAM_KEYS`` of the v1 wire format, in its order (a ConfigRecord serialises its items
in insertion order, so the derived keys keep it)."""


def test_the_derived_param_keys_are_the_v1_wire_format() -> None:
    """The v1 keys in their order, then the keys added since (``secure-aggregation``)."""
    assert registry.PARAM_KEYS == (*V1_PARAM_KEYS, "secure-aggregation") == registry.param_keys()


def test_the_config_takes_every_parameter_from_its_registered_spec() -> None:
    """No parameter has a typed ``RunConfig`` field (the config names no mechanism): each lives
    in ``RunConfig.params`` with its registered default and type, documented by its spec."""
    typed = set(RunConfig.typed_keys())
    defaults = RunConfig().params
    for key, spec in registry.param_specs().items():
        assert key not in typed and not hasattr(RunConfig, spec.field), key
        assert type(defaults[key]) is spec.type and defaults[key] == spec.default, key
        assert spec.doc.strip(), f"{key} is documented"
    assert set(defaults) == set(registry.param_specs())


def test_the_registry_is_checked_when_it_grows() -> None:
    with pytest.raises(ValueError, match="already registered with another spec"):
        registry.register(
            registry.Mechanism(
                "clash",
                "x",
                registry.one_bit,
                "a:b",
                "c:d",
                params=(registry.Param("pbm-trials", int, 2, "another default"),),
            )
        )
    assert "clash" not in registry.REGISTRY
    with pytest.raises(ValueError, match="common keys"):
        registry.Mechanism(
            "x",
            "x",
            registry.one_bit,
            "a:b",
            "c:d",
            params=(registry.Param("epsilon", float, 1.0, "a common key"),),
        )
    with pytest.raises(ValueError, match="is not a float"):
        registry.Param("x-y", float, 1, "an int default")
    with pytest.raises(ValueError, match="privacy disagrees"):
        registry.Mechanism("x", "x", registry.one_bit, "a:b", "c:d", privacy=Privacy("central"))


GENERIC_PATH = (
    "server/round.py",
    "server/records.py",
    "server/strategy.py",
    "server/stages.py",
    "client/handlers.py",
    "client/mod.py",
    "client/policy.py",
    "corbin_fl/config.py",
    "corbin_fl/wire.py",
    "corbin_fl/registry.py",
    "mechanisms/accounting.py",
    "mechanisms/privacy_loss.py",
    "mechanisms/report.py",
    "mechanisms/threat_models.py",
    "mechanisms/secure_threat_models.py",
    "corbin_fl/secure.py",
    "server/secure_round.py",
    "client/secure_update.py",
)
"""The files every mechanism goes through (the mechanisms' own encoders and aggregators, in
client/encode.py and server/aggregation.py, are theirs to branch in)."""


@pytest.mark.parametrize("path", GENERIC_PATH)
def test_no_generic_path_branches_on_a_mechanism_name(path: str) -> None:
    text = (ROOT / path).read_text()
    names = "|".join(re.escape(n) for n in registry.REGISTRY)
    branch = re.compile(
        rf"""(mechanism|mech)\s*(==|!=|in|not in)\s*[("'{{]+\s*["']?({names})["']"""
    )
    assert not branch.findall(text), path

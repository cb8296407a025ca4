"""The node's privacy policy (client/policy.py) and how corbin_mod enforces it.

Every refusal must come back as an error reply naming the cause, and the app's train handler
must never run for a refused instruction (its arrays never leave the node).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity

from corbin_fl import registry, wire
from corbin_fl.client.mod import corbin_mod
from corbin_fl.client.policy import Policy, PolicyError, private_mechanisms
from corbin_fl.config import MECHANISMS, RunConfig
from corbin_fl.deploy.run import node_policy, policy_env


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


# ----------------------------------------------------------------------------- Policy alone
def test_defaults_admit_the_private_mechanisms_at_eps_1_only() -> None:
    policy = Policy.from_node({}, {})
    assert policy.mechanisms == private_mechanisms()
    assert private_mechanisms() == {
        "corbin",
        "augcorbin",
        "ldpfl",
        "gaussian",
        "laplace",
        "ternary",
        "fedcad",
        "pbm",
        "rqm",
        "imvu",
    }
    policy.check(RunConfig(mechanism="corbin", epsilon=1.0))
    with pytest.raises(PolicyError, match=r"epsilon 1\.5 is above"):
        policy.check(RunConfig(mechanism="corbin", epsilon=1.5))
    for mech in ("fedavg", "cq"):
        with pytest.raises(PolicyError, match=f"mechanism '{mech}' is not allowed"):
            policy.check(RunConfig(mechanism=mech))
    with pytest.raises(PolicyError, match=r"delta 0\.001 is above"):
        policy.check(RunConfig(mechanism="gaussian", delta=1e-3))
    with pytest.raises(PolicyError, match="corbin-max-params"):
        policy.check(RunConfig(), num_params=policy.max_params + 1)


def test_node_config_wins_over_the_environment_and_all_admits_every_mechanism() -> None:
    env = {"CORBIN_MAX_EPSILON": "0.25", "CORBIN_MECHANISMS": "ldpfl"}
    from_env = Policy.from_node({}, env)
    assert from_env.max_epsilon == 0.25 and from_env.mechanisms == {"ldpfl"}
    both = Policy.from_node({"corbin-max-epsilon": 3.0, "corbin-mechanisms": "all"}, env)
    assert both.max_epsilon == 3.0 and both.mechanisms == frozenset(MECHANISMS)
    both.check(RunConfig(mechanism="fedavg"))


@pytest.mark.parametrize(
    ("node_config", "match"),
    [
        ({"corbin-max-epsilon": "many"}, "corbin-max-epsilon|could not convert"),
        ({"corbin-max-epsilon": 0.0}, "corbin-max-epsilon"),
        ({"corbin-max-epsilon": float("inf")}, "finite"),
        ({"corbin-max-delta": 1.0}, "corbin-max-delta"),
        ({"corbin-mechanisms": "corbin,rot13"}, "unknown \\['rot13'\\]"),
        ({"corbin-mechanisms": " , "}, "corbin-mechanisms"),
        ({"corbin-max-params": 0}, "corbin-max-params"),
        ({"corbin-max-epsilon": True}, "bool"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(node_config: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Policy.from_node(node_config, {})


def test_the_launcher_policy_admits_exactly_the_run() -> None:
    cfg = {"mechanism": "laplace", "epsilon": 2.5, "delta": 1e-6}
    policy = Policy.from_node(node_policy(cfg), {})
    policy.check(RunConfig.from_flower(cfg))
    with pytest.raises(PolicyError):
        policy.check(RunConfig.from_flower({**cfg, "epsilon": 2.6}))
    with pytest.raises(PolicyError):
        policy.check(RunConfig.from_flower({**cfg, "mechanism": "corbin"}))
    assert Policy.from_node({}, policy_env(node_policy(cfg))) == policy


# ----------------------------------------------------------------------------- corbin_mod
def _context(node_config: dict[str, Any] | None = None) -> Context:
    return Context(
        run_id=7,
        node_id=11,
        node_config=dict(node_config or {}),
        state=RecordDict(),
        run_config={},
    )


def _update(**params: Any) -> Message:
    """A well-formed solo update instruction (assignment ``solo``) with the given settings."""
    settings = RunConfig.from_flower({"range-mode": "layer", **params}).to_flower()
    head = {
        wire.STAGE: wire.UPDATE,
        wire.ROUND: 1,
        wire.ASSIGNMENT: wire.SOLO,
        wire.ARRAYS_KEY: "arrays",
        **{k: settings[k] for k in registry.PARAM_KEYS},
    }
    model = ArrayRecord({"w": Array(np.zeros(16, np.float32))})
    content = RecordDict(
        {
            wire.CFG: ConfigRecord(head),
            wire.RANGE: ArrayRecord(
                {
                    wire.CENTER: wire.to_array(np.zeros(1, np.float32)),
                    wire.RADIUS: wire.to_array(np.ones(1, np.float32)),
                }
            ),
            "arrays": model,
            "config": ConfigRecord({"server-round": 1}),
        }
    )
    return Message(content, dst_node_id=11, message_type=wire.TRAIN, group_id="1")


class _App:
    """A train handler that records whether it ran and returns a shifted model."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, msg: Message, context: Context) -> Message:
        self.calls += 1
        w = msg.content["arrays"]["w"].numpy() + np.float32(0.5)  # type: ignore[index,union-attr]
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({"w": Array(w)}),
                    "metrics": MetricRecord({"num-examples": 3}),
                }
            ),
            reply_to=msg,
        )


def test_mod_encodes_an_allowed_update_and_never_sends_the_arrays() -> None:
    app = _App()
    reply = corbin_mod(_update(mechanism="ldpfl"), _context(), app)
    assert app.calls == 1 and not reply.has_error()
    assert set(reply.content.array_records) == {wire.UPDATE_REC}
    assert reply.content.metric_records["metrics"]["num-examples"] == 3
    bits = reply.content.array_records[wire.UPDATE_REC][wire.BITS]
    assert bits.numpy().dtype == np.uint8 and bits.numpy().shape == (2,)  # 16 bits


@pytest.mark.parametrize(
    ("params", "node_config", "match"),
    [
        ({"epsilon": 2.0}, {}, "epsilon 2 is above"),
        ({"mechanism": "fedavg"}, {}, "mechanism 'fedavg' is not allowed"),
        ({"mechanism": "corbin"}, {"corbin-mechanisms": "ldpfl"}, "'corbin' is not allowed"),
        ({"epsilon": 0.5}, {"corbin-max-epsilon": 0.1}, "above this node's corbin-max-epsilon"),
        ({"mechanism": "gaussian", "delta": 1e-3}, {}, "delta 0.001 is above"),
    ],
)
def test_mod_refuses_weaker_privacy_and_the_app_never_runs(
    params: dict[str, Any], node_config: dict[str, Any], match: str
) -> None:
    app = _App()
    reply = corbin_mod(_update(**params), _context(node_config), app)
    assert app.calls == 0
    assert reply.has_error() and reply.error.code == wire.ERROR_CODE_POLICY
    assert "privacy policy" in (reply.error.reason or "")
    assert re.search(match, reply.error.reason or "")


def test_mod_refuses_a_plain_fedavg_train_message() -> None:
    """What Flower's FedAvg sends (arrays, config, no corbin record) never gets the model."""
    app = _App()
    plain = Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"w": Array(np.zeros(16, np.float32))}),
                "config": ConfigRecord({"server-round": 1}),
            }
        ),
        dst_node_id=11,
        message_type=wire.TRAIN,
    )
    reply = corbin_mod(
        plain, _context({"corbin-mechanisms": "all", "corbin-max-epsilon": 100}), app
    )
    assert app.calls == 0 and reply.has_error()
    assert "without a CorBin-FL instruction" in (reply.error.reason or "")


def test_mod_refuses_an_instruction_without_its_settings() -> None:
    msg = _update()
    del msg.content.config_records[wire.CFG]["epsilon"]
    app = _App()
    reply = corbin_mod(msg, _context(), app)
    assert app.calls == 0 and reply.has_error()
    assert "lacks the mechanism settings ['epsilon']" in (reply.error.reason or "")


def test_mod_passes_evaluate_messages_to_the_app() -> None:
    seen: list[str] = []

    def evaluate(msg: Message, context: Context) -> Message:
        seen.append(msg.metadata.message_type)
        return Message(RecordDict({"metrics": MetricRecord({"acc": 0.5})}), reply_to=msg)

    msg = Message(RecordDict(), dst_node_id=11, message_type="evaluate")
    reply = corbin_mod(msg, _context(), evaluate)
    assert seen == ["evaluate"] and not reply.has_error()

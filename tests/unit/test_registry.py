"""The mechanism registry (corbin_fl/registry.py): one object per mechanism that every part reads.

Checks that the registered facts agree with the math layer (``mechanisms.accounting``), that
every encoder and aggregator resolves and speaks the registered wire format, and that a new
mechanism is one registration: once registered, the config accepts it, the mod encodes with it
and the server decodes it, with no other change.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch
from device_params import DEVICES
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from corbin_fl import registry, wire
from corbin_fl.client.encode import Encoded, EncodeInput
from corbin_fl.client.mod import corbin_mod
from corbin_fl.client.policy import Policy
from corbin_fl.config import MECHANISMS, ConfigError, RunConfig
from corbin_fl.mechanisms import accounting, categories
from corbin_fl.server.aggregation import Aggregator, FloatAggregator, make_aggregator


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TaskIdentity, "_run_id", 9)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def test_config_mechanisms_are_the_registered_ones() -> None:
    assert tuple(registry.REGISTRY) == MECHANISMS
    with pytest.raises(KeyError, match="unknown mechanism 'rot13'; registered: corbin"):
        registry.get("rot13")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("corbin"))


@pytest.mark.parametrize("name", MECHANISMS)
def test_registered_facts_agree_with_the_math_layer(name: str) -> None:
    mech = registry.get(name)
    assert mech.local_dp == mech.category.local_dp
    assert accounting.MECHANISMS == MECHANISMS  # the registry declared every category
    assert categories.category(name) is mech.category
    assert RunConfig(mechanism=name).paired == mech.pairs
    event = mech.release(RunConfig(mechanism=name, epsilon=0.5), 3, 17, 100, paired=True)
    assert event.mechanism == name and event.round == 3 and event.node == "17"
    assert (event.eps_p is None) == (not mech.local_dp)
    assert (event.delta is not None) == mech.has_delta
    assert (event.d is not None) == mech.pairs
    assert issubclass(mech.aggregator_class(), Aggregator)
    assert callable(mech.encode_fn())
    key, _, length = mech.wire(13, RunConfig(mechanism=name))
    assert key in (wire.BITS, wire.VALUES) and length >= 2


@pytest.mark.parametrize("name", MECHANISMS)
def test_every_encoder_speaks_its_registered_wire_format(name: str) -> None:
    """Encode 37 parameters with each registered encoder; the server's aggregator accepts it."""
    from wire_helpers import encode_solo

    from corbin_fl.client.shared import Fallback

    m = 37
    cfg = RunConfig(mechanism=name, range_mode="update" if name == "signsgd" else "layer")
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(m, generator=gen) - 0.5
    c, r = torch.zeros(m), torch.ones(m)
    shared = Fallback("unpaired") if mech_pairs(name) else None
    seed = (123, 0, 2) if registry.get(name).shared_seed else None
    key, array, flags = encode_solo(cfg, 5, w, c, r, shared=shared, shared_seed=seed)
    want_key, want_dtype, want_len = registry.update_spec(cfg, m)
    assert (key, array.dtype, array.shape) == (want_key, want_dtype, (want_len,))
    assert set(flags) <= wire.METRIC_KEYS
    agg = make_aggregator(cfg, torch.zeros(m), c, r)
    assert isinstance(agg, registry.get(name).aggregator_class())
    agg.add(ArrayRecord({key: wire.to_array(array)}))
    est = agg.estimate()
    assert est is not None and est.shape == (m,) and bool(torch.isfinite(est).all())


def mech_pairs(name: str) -> bool:
    return registry.get(name).pairs


# ----------------------------------------------------------------------------- a new mechanism

seen_devices: list[set[str]] = []
"""Device types of every tensor and generator the toy encoder got, one set per call."""


def _halves(job: EncodeInput) -> torch.Tensor:
    """Each parameter clipped into its range and rounded to a multiple of r/2 (on w's device)."""
    devices = {job.w.device.type, job.w_global.device.type, job.gen.device.type}
    blocks = (t for b in job.blocks for t in (b.c, b.r) if isinstance(t, torch.Tensor))
    devices |= {t.device.type for t in blocks}
    seen_devices.append(devices)
    out = torch.empty_like(job.w)
    for b in job.blocks:
        part = job.w[b.lo : b.hi]
        step = b.r / 2
        out[b.lo : b.hi] = torch.round((torch.clamp(part, b.c - b.r, b.c + b.r) - b.c) / step)
        out[b.lo : b.hi] = out[b.lo : b.hi] * step + b.c
    return out


def encode_halves(job: EncodeInput) -> Encoded:
    """A toy mechanism that keeps the contract: its array comes back to the host itself."""
    return wire.VALUES, _halves(job).detach().cpu().numpy().astype(np.float32), None


def encode_halves_tensor(job: EncodeInput) -> Any:
    """The same, returning the tensor on its device: the mod copies it to the host."""
    return wire.VALUES, _halves(job), None


def encode_halves_list(job: EncodeInput) -> Any:
    """Breaks the contract: a list is no array (the mod refuses it)."""
    return wire.VALUES, _halves(job).tolist(), None


def test_the_encode_device_is_checked() -> None:
    assert registry.ENCODE_DEVICES == ("update", "cpu")
    assert all(mech.encode_device == "update" for mech in registry.REGISTRY.values())
    with pytest.raises(ValueError, match="encode_device must be one of"):
        registry.Mechanism("x", "x", registry.float32, "a:b", "c:d", encode_device="cuda")


def test_the_update_is_encoded_where_the_app_trains() -> None:
    """``encode_device = "update"`` follows the app's run-config ``device`` (``"auto"`` where it
    has none): a node told to train on the CPU never opens a CUDA context to encode."""
    from corbin_fl.client.encode import encode_device

    assert encode_device("corbin", "cpu") == torch.device("cpu")
    auto = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert encode_device("corbin") == auto and encode_device("corbin", "auto") == auto
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            encode_device("corbin", "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("encoder", "encode_device"),
    [("encode_halves", "update"), ("encode_halves", "cpu"), ("encode_halves_tensor", "update")],
)
def test_a_new_mechanism_is_one_registration(
    monkeypatch: pytest.MonkeyPatch, device: str, encoder: str, encode_device: str
) -> None:
    """Registered once, the config accepts it, the mod encodes with it on the device the
    encoder contract names (the update's, or the CPU), and the server decodes it."""

    toy = registry.Mechanism(
        "halves",
        "clip and round to multiples of r/2 (no privacy)",
        registry.float32,
        f"{__name__}:{encoder}",
        "corbin_fl.server.aggregation:FloatAggregator",
        local_dp=False,
        encode_device=encode_device,
    )
    with pytest.raises(ConfigError, match="mechanism"):
        RunConfig.from_flower({"mechanism": "halves"})
    monkeypatch.setitem(registry.REGISTRY, "halves", toy)
    cfg = RunConfig.from_flower({"mechanism": "halves", "range-mode": "layer"})
    assert "halves" not in Policy.from_node({}, {}).mechanisms  # no local DP: not by default

    seen_devices.clear()
    w0 = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    # The mod encodes on the device the app trains on: the run config's `device` of this case.
    reply = _encode_with_mod(cfg, w0, device)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    expected = device if encode_device == "update" else "cpu"
    assert seen_devices == [{expected}], seen_devices
    values = reply.content.array_records[wire.UPDATE_REC][wire.VALUES].numpy()
    np.testing.assert_allclose(values, np.round(w0 * 0.5 / 0.5) * 0.5)

    # The server decodes it with the registered aggregator.
    from corbin_fl.arrays import layout_of_arrays

    layout = layout_of_arrays(ArrayRecord({"w": Array(w0)}))
    agg = make_aggregator(cfg, torch.zeros(8), torch.zeros(1), torch.ones(1), layout)
    assert isinstance(agg, FloatAggregator)
    agg.add(reply.content.array_records[wire.UPDATE_REC])
    est = agg.estimate()
    assert est is not None and math.isclose(float(est.sum()), float(values.sum()), abs_tol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_an_encoder_that_breaks_the_contract_is_refused(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:

    toy = registry.Mechanism(
        "halves",
        "returns a list",
        registry.float32,
        f"{__name__}:encode_halves_list",
        "corbin_fl.server.aggregation:FloatAggregator",
        local_dp=False,
    )
    monkeypatch.setitem(registry.REGISTRY, "halves", toy)
    cfg = RunConfig.from_flower({"mechanism": "halves", "range-mode": "layer"})
    reply = _encode_with_mod(cfg, np.linspace(-1.0, 1.0, 8, dtype=np.float32), device)
    assert reply.has_error()
    assert "returned a list, not a numpy array" in (reply.error.reason or "")


def _encode_with_mod(cfg: RunConfig, w0: np.ndarray, device: str) -> Message:
    """One update instruction of ``cfg`` through :func:`corbin_mod` around a train handler that
    halves the model, on a node whose policy admits ``cfg.mechanism``, for an app that trains on
    ``device`` (its run config's ``device``, which the mod encodes on)."""
    settings = cfg.to_flower()
    head = {
        wire.STAGE: wire.UPDATE,
        wire.ROUND: 1,
        wire.ASSIGNMENT: wire.SOLO,
        wire.ARRAYS_KEY: "arrays",
        **{k: settings[k] for k in registry.PARAM_KEYS},
    }
    msg = Message(
        RecordDict(
            {
                wire.CFG: ConfigRecord(head),
                wire.RANGE: ArrayRecord(
                    {
                        wire.CENTER: wire.to_array(np.zeros(1, np.float32)),
                        wire.RADIUS: wire.to_array(np.ones(1, np.float32)),
                    }
                ),
                "arrays": ArrayRecord({"w": Array(w0)}),
            }
        ),
        dst_node_id=5,
        message_type=wire.TRAIN,
        group_id="1",
    )

    def train(inner: Message, context: Context) -> Message:
        trained = inner.content["arrays"]["w"].numpy() * np.float32(0.5)  # type: ignore[index,union-attr]
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({"w": Array(trained)}),
                    "metrics": MetricRecord({"num-examples": 1}),
                }
            ),
            reply_to=inner,
        )

    ctx = Context(
        run_id=9,
        node_id=5,
        node_config={"corbin-mechanisms": cfg.mechanism},
        state=RecordDict(),
        run_config={"device": device},
    )
    return corbin_mod(msg, ctx, train)


def test_the_v1_parameter_order_is_the_order_of_the_config_keys() -> None:
    """``registry.V1_PARAMETER_KEYS`` (the wire order of the v1 parameters) is the order of the
    config's parameters, where their typed fields were (``summary.json`` keeps its key order)."""
    from corbin_fl.app.config import AppConfig  # the app's keys: dropout-prob after the params

    specs = registry.param_specs()
    assert tuple(RunConfig().params) == registry.V1_PARAMETER_KEYS
    assert set(specs) == set(registry.V1_PARAMETER_KEYS)
    keys = AppConfig.keys()
    assert tuple(key for key in keys if key in specs) == registry.V1_PARAMETER_KEYS
    start = keys.index(registry.V1_PARAMETER_KEYS[0])
    assert keys[start - 1] == "test-z-digest" and keys[start + len(specs)] == "dropout-prob"
    assert tuple(AppConfig().to_flower()) == keys


# ----------------------------------------------------------------------------- a shipped one
def test_a_shipped_mechanism_is_its_module_and_its_entry() -> None:
    """PBM, a shipped parameterised mechanism, as the issue's registration shows it: its math is
    ``mechanisms/baselines/pbm.py``, its one entry in the registry declares its parameter
    (``pbm-trials``: type, default, check, doc), wire format, symbol levels, sum form, privacy
    category and node-policy default, and every other part derives from that entry: the config's
    key, default and check, the wire's ``PARAM_KEYS``, ``CorBin``'s keyword, the node policy,
    the accounting's category, the secure sum's levels and binomial trials, the encoder and the
    aggregator. No other product file names it but the sum-seeing server's committed table
    (tests/unit/test_mechanism_modules.py)."""
    from flwr.serverapp.strategy import FedAvg
    from test_mechanism_modules import ALLOWED, MODULES, REGISTRATION_LIST, naming_modules

    from corbin_fl import secure
    from corbin_fl.client.policy import private_mechanisms
    from corbin_fl.mechanisms.baselines.pbm import PBM
    from corbin_fl.server.aggregation import LevelsAggregator
    from corbin_fl.server.strategy import CorBin

    pbm = registry.get("pbm")
    (spec,) = pbm.params
    assert (spec.key, spec.type, spec.default) == ("pbm-trials", int, 1)
    assert spec.problem(0, RunConfig()) == "must be in [1, 255], got 0"
    assert registry.param_specs()["pbm-trials"] is spec
    # the config: key, default, check (with the key in the message), coercion
    assert "pbm-trials" in set(RunConfig.keys()) and RunConfig().param("pbm-trials") == 1
    with pytest.raises(ConfigError) as bad:
        RunConfig.from_flower({"mechanism": "pbm", "pbm-trials": 256})
    assert bad.value.errors == {"pbm-trials": "must be in [1, 255], got 256"}
    cfg = RunConfig.from_flower({"mechanism": "pbm", "pbm-trials": 3.0, "epsilon": 2.0})
    assert cfg.param("pbm-trials") == 3 and type(cfg.param("pbm-trials")) is int
    # the wire and CorBin's keyword
    assert "pbm-trials" in registry.PARAM_KEYS
    strategy = CorBin(FedAvg(), mechanism="pbm", pbm_trials=3, epsilon=2.0)
    assert strategy.cfg == cfg.replace(update_radius=strategy.cfg.update_radius)
    # its wire format, symbols, sum form, privacy and policy default
    assert registry.update_spec(cfg, 100) == (wire.BITS, np.dtype(np.uint8), 25)  # 2 bits
    mech = registry.finite_mechanism(cfg)
    assert isinstance(mech, PBM) and (mech.trials, mech.eps) == (3, 2.0)
    assert secure.levels_of(cfg) == 3 and pbm.sum_trials is not None
    assert pbm.sum_trials(cfg) == 3 and "pbm" in secure.secure_mechanisms()
    assert categories.category("pbm") is pbm.category and pbm.category.family == "pure"
    assert pbm.policy_default and "pbm" in private_mechanisms()
    assert "pbm" in Policy.from_node({}, {}).mechanisms
    assert pbm.aggregator_class() is LevelsAggregator and callable(pbm.encode_fn())
    # where its name is written: its module and the registration list, nowhere else
    assert MODULES["pbm"] == "corbin_fl.mechanisms.baselines.pbm"
    assert naming_modules("pbm") == {MODULES["pbm"], REGISTRATION_LIST}
    assert "pbm" not in ALLOWED


def test_an_entry_names_the_hooks_of_one_step_together() -> None:
    """A generic step calls its hooks together (mechanisms/baselines/hooks.py): an entry that
    names one of them names all, and a shared seed comes with its ranks."""
    base: dict[str, Any] = {"local_dp": False}
    with pytest.raises(ValueError, match="hooks pack, symbols, sum_decode go together"):
        registry.Mechanism("x", "x", registry.one_bit, "a:b", "c:d", pack="m:f", **base)
    with pytest.raises(ValueError, match="update_bound, server_noise go together"):
        registry.Mechanism("x", "x", registry.float32, "a:b", "c:d", server_noise="m:f", **base)
    with pytest.raises(ValueError, match="node_state, stateful_release go together"):
        registry.Mechanism("x", "x", registry.float32, "a:b", "c:d", node_state="m:f", **base)
    with pytest.raises(ValueError, match="shared_ranks"):
        registry.Mechanism(
            "x", "x", registry.one_bit, "a:b", "c:d", shared_seed=("s", "r", "n"),
            instruction_keys=frozenset({"s", "r", "n"}), **base,
        )  # fmt: skip
    with pytest.raises(ValueError, match="not a hook"):
        registry.get("pbm").hook("aggregator")
    for name, mech in registry.REGISTRY.items():  # every named hook resolves
        for hook in (
            *("block_release", "count_decode", "release_limit", "shared_ranks"),
            *("update_bound", "server_noise", "node_state", "stateful_release"),
            *("pack", "symbols", "sum_decode"),
        ):
            assert getattr(mech, hook) == "" or callable(mech.hook(hook)), (name, hook)


def test_the_fallback_without_common_randomness_is_registered_once() -> None:
    """``d = 0``'s hint and the CLI's ``--d`` help name the mechanism the pairing ones fall back
    to (their ``unpaired``), with its title: derived from the entries, not written by hand."""
    alone = registry.without_common_randomness()
    assert not alone.pairs and alone.privacy is not None and alone.privacy.randomized_response
    assert (alone.name, alone.title) == ("ldpfl", "LDP-FL")
    assert registry.pairing() == ("corbin", "augcorbin")
    assert all(registry.get(name).unpaired == alone.name for name in registry.pairing())
    paired = registry.get("corbin")
    registry.REGISTRY["corbin"] = dataclasses.replace(paired, unpaired="signsgd")
    try:
        with pytest.raises(LookupError, match="signsgd"):
            registry.without_common_randomness()
    finally:
        registry.REGISTRY["corbin"] = paired

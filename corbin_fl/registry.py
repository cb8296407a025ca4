"""The mechanism registry: one object per mechanism, read by every part that depends on it.

Config validation (:data:`corbin_fl.config.MECHANISMS`), the wire checks (update dtype and length,
the instruction's keys), the client's policy defaults, the client encoder, the server aggregator
and the privacy ledger's event all come from the :class:`Mechanism` registered under a name. A
new mechanism is one module (its math in ``mechanisms/``, its encoder and aggregator) plus one
:func:`register` call here; ``tests/protocol/test_protocol_logic.py`` walks every registered
mechanism through the mod and the strategy.

Encoders and aggregators are named by ``"module:attribute"`` and imported on first use, so this
module (imported by ``corbin_fl.config``) stays free of torch.

The encoder contract (what :func:`client.encode.encode` guarantees an encoder and expects back):

- It is called as ``fn(job)`` with one :class:`client.encode.EncodeInput`. Every tensor of ``job``
  (``w``, ``w_global``, the blocks' ``c`` and ``r`` when they are tensors) and its generator
  ``gen`` live on one device, ``job.w.device``: with ``encode_device = "update"`` (the default)
  the device of the update: the app's run-config ``device`` where it has one, else the node's
  CUDA device when it has one and the CPU otherwise (:func:`client.encode.encode_device`); with
  ``encode_device = "cpu"`` always the CPU (the mod moves the update there first), for an encoder
  written for the host only.
- It returns ``(array key, array, z digest or None)`` where the array is a host
  ``numpy.ndarray`` (an encoder on CUDA copies its result to the host, e.g.
  ``t.detach().cpu().numpy()``; never ``t.numpy()``, which fails for a CUDA tensor). A
  ``torch.Tensor`` on any device is copied to the host by the mod; anything else is refused.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from corbin_fl import wire

if TYPE_CHECKING:
    from corbin_fl.config import RunConfig
    from corbin_fl.mechanisms.accounting import PrivacyEvent
    from corbin_fl.mechanisms.baselines.levels import FiniteMechanism

ENCODE_DEVICES: Final[tuple[str, ...]] = ("update", "cpu")
"""Where an encoder runs (:attr:`Mechanism.encode_device`): the update's device, or the CPU."""

WireSpec = tuple[str, np.dtype[Any], int]
"""``(array key, dtype, length)`` of an update on the wire."""


def one_bit(num_params: int, cfg: RunConfig) -> WireSpec:
    """One packed bit per parameter: ``uint8[ceil(m / 8)]``."""
    return wire.BITS, np.dtype(np.uint8), wire.packed_len(num_params)


def float32(num_params: int, cfg: RunConfig) -> WireSpec:
    """One float32 per parameter."""
    return wire.VALUES, np.dtype(np.float32), num_params


def ternary_wire(num_params: int, cfg: RunConfig) -> WireSpec:
    """Ternary symbols: 2 packed bits per parameter (``bits``) or one int8 (``int8``)."""
    return wire.ternary_update_spec(num_params, cfg.ternary_encoding)


def symbols_wire(num_params: int, cfg: RunConfig) -> WireSpec:
    """``b``-bit symbols of a finite-output mechanism, packed: ``uint8[ceil(m b / 8)]``."""
    bits = symbol_bits_of(cfg)
    return wire.BITS, np.dtype(np.uint8), (num_params * bits + 7) // 8


def symbol_bits_of(cfg: RunConfig) -> int:
    """Bits per parameter of the finite-output mechanism of ``cfg`` (no solve needed)."""
    from corbin_fl.mechanisms.baselines.levels import symbol_bits

    if cfg.mechanism == "pbm":
        return symbol_bits(cfg.pbm_trials + 1)
    if cfg.mechanism == "rqm":
        return symbol_bits(cfg.rqm_levels)
    if cfg.mechanism == "imvu":
        return int(cfg.imvu_bits)
    raise ValueError(f"{cfg.mechanism!r} is not a finite-output mechanism")


def finite_mechanism(cfg: RunConfig) -> FiniteMechanism:
    """The PBM / RQM / I-MVU object of ``cfg`` (``mechanisms/baselines``), the same on both sides.

    RQM with 3 levels and ``rqm-q = 0`` takes the variance-optimal ``q`` (:func:`rqm_optimal_q`).
    """
    if cfg.mechanism == "pbm":
        from corbin_fl.mechanisms.baselines.pbm import PBM

        return PBM(cfg.epsilon, cfg.pbm_trials)
    if cfg.mechanism == "rqm":
        from corbin_fl.mechanisms.baselines.rqm import RQM, rqm_optimal_q

        q = cfg.rqm_q
        if cfg.rqm_levels == 3 and q == 0.0:
            q = rqm_optimal_q(cfg.epsilon)
        return RQM(cfg.epsilon, cfg.rqm_levels, q)
    if cfg.mechanism == "imvu":
        from corbin_fl.mechanisms.baselines.imvu import IMVU
        from corbin_fl.mvu_store import mvu_table

        return IMVU(cfg.epsilon, cfg.imvu_bits, mvu_table(cfg.epsilon, cfg.imvu_bits))
    raise ValueError(f"{cfg.mechanism!r} is not a finite-output mechanism")


@dataclass(frozen=True)
class Mechanism:
    """Everything the protocol needs to know about one mechanism.

    Attributes
    ----------
    name : str
        The ``mechanism`` value of the run config and of every instruction.
    summary : str
        One line: what a client releases.
    wire : Callable[[int, RunConfig], WireSpec]
        Array key, dtype and length of one update of ``m`` parameters under the run's settings
        (e.g. ``ternary-encoding``, ``pbm-trials``).
    encoder : str
        ``"module:function"`` of the client encoder, called as ``fn(job)`` with one
        :class:`client.encode.EncodeInput` (see :func:`client.encode.encode` and the encoder
        contract in this module's docstring); returns a host ``numpy.ndarray``.
    aggregator : str
        ``"module:Class"`` of the server's streaming aggregator
        (:class:`server.aggregation.Aggregator`).
    pairs : bool
        Pairs clients and shares common randomness (keygen, pairing, blobs; Alg. 3 lines 1-17).
    local_dp : bool
        Every release is eps_p-DP (or (eps, delta)-DP) at the client, against an eavesdropper on
        its uplink: the node policy's default admits it.
    has_delta : bool
        An (eps, delta) mechanism: ``delta`` is checked against the node's ``corbin-max-delta``
        and recorded in the ledger.
    dp_unit : str
        What one epsilon bounds: ``"parameter"`` (each coordinate's release) or ``"update"``
        (a client's whole update, all parameters together).
    assignments : tuple[str, ...]
        The update-stage assignments the server may send it.
    instruction_keys : frozenset[str]
        Keys its update instruction carries besides the common ones (e.g. CQ's shared seed).
    encode_device : str
        Where the encoder's tensors live (:data:`ENCODE_DEVICES`): ``"update"`` (default), the
        device of the update (CUDA when the node has one), or ``"cpu"``.
    """

    name: str
    summary: str
    wire: Callable[[int, RunConfig], WireSpec]
    encoder: str
    aggregator: str
    pairs: bool = False
    local_dp: bool = True
    has_delta: bool = False
    dp_unit: str = "parameter"
    assignments: tuple[str, ...] = ("solo",)
    instruction_keys: frozenset[str] = field(default_factory=frozenset)
    encode_device: str = "update"

    def __post_init__(self) -> None:
        if self.encode_device not in ENCODE_DEVICES:
            raise ValueError(
                f"encode_device must be one of {ENCODE_DEVICES}, got {self.encode_device!r}"
            )

    def encode_fn(self) -> Callable[..., Any]:
        """The client encoder (imported now)."""
        return _resolve(self.encoder)

    def aggregator_class(self) -> type:
        """The server aggregator class (imported now)."""
        return _resolve(self.aggregator)  # type: ignore[return-value]

    def release(
        self, cfg: RunConfig, rnd: int, node: int, num_params: int, *, paired: bool
    ) -> PrivacyEvent:
        """The privacy ledger's event of one released update (one client, one round).

        ``eps_p = epsilon`` (None without local DP), ``d`` for a release with the pair's
        common randomness (CorBinQ, Alg. 2; accounted in the pair-joint view too), ``delta``
        for an (eps, delta) mechanism.
        """
        from corbin_fl.mechanisms.accounting import PrivacyEvent

        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 1:
            raise ValueError(f"round must be an int >= 1, got {rnd!r}")
        if isinstance(node, bool) or not isinstance(node, int):
            raise TypeError(f"node must be an int node id, got {type(node).__name__}")
        paired = bool(paired) and self.pairs
        return PrivacyEvent(
            round=rnd,
            node=str(node),
            mechanism=self.name,
            eps_p=cfg.epsilon if self.local_dp else None,
            m=num_params,
            paired=paired,
            d=cfg.d if paired else None,
            delta=cfg.delta if self.has_delta else None,
        )


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


REGISTRY: dict[str, Mechanism] = {}
"""Registered mechanisms, by name, in registration order."""


def register(mechanism: Mechanism) -> Mechanism:
    """Add ``mechanism`` to :data:`REGISTRY` (a name is registered once)."""
    if mechanism.name in REGISTRY:
        raise ValueError(f"mechanism {mechanism.name!r} is already registered")
    REGISTRY[mechanism.name] = mechanism
    return mechanism


def get(name: str) -> Mechanism:
    """The mechanism registered as ``name``.

    Raises
    ------
    KeyError
        If no mechanism has that name (the message lists the registered ones).
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown mechanism {name!r}; registered: {', '.join(REGISTRY)}") from None


_ONE_BIT_ENCODER: Final[str] = "corbin_fl.client.encode:encode_one_bit"
_BITS_AGGREGATOR: Final[str] = "corbin_fl.server.aggregation:BitsAggregator"
_PAIRED_ASSIGNMENTS: Final[tuple[str, ...]] = ("paired", "partner-gone", "unpaired")

register(
    Mechanism(
        "corbin",
        "CorBinQ bit with the pair's common randomness (Alg. 2); LDPQ when unpaired",
        one_bit,
        _ONE_BIT_ENCODER,
        _BITS_AGGREGATOR,
        pairs=True,
        assignments=_PAIRED_ASSIGNMENTS,
    )
)
register(
    Mechanism(
        "augcorbin",
        "as corbin; a gamma-fraction of the clients quantizes independently (Thm. 3)",
        one_bit,
        _ONE_BIT_ENCODER,
        _BITS_AGGREGATOR,
        pairs=True,
        assignments=(*_PAIRED_ASSIGNMENTS, "independent"),
    )
)
register(
    Mechanism(
        "ldpfl",
        "LDPQ bit with independent coins (Alg. 1)",
        one_bit,
        _ONE_BIT_ENCODER,
        _BITS_AGGREGATOR,
    )
)
register(
    Mechanism(
        "gaussian",
        "clip + analytic Gaussian noise for (eps, delta)",
        float32,
        "corbin_fl.client.encode:encode_gaussian",
        "corbin_fl.server.aggregation:FloatAggregator",
        has_delta=True,
    )
)
register(
    Mechanism(
        "laplace",
        "clip + Laplace noise of scale 2r/eps",
        float32,
        "corbin_fl.client.encode:encode_laplace",
        "corbin_fl.server.aggregation:FloatAggregator",
    )
)
register(
    Mechanism(
        "fedavg",
        "the model in the clear (no privacy)",
        float32,
        "corbin_fl.client.encode:encode_fedavg",
        "corbin_fl.server.aggregation:FloatAggregator",
        local_dp=False,
    )
)
register(
    Mechanism(
        "cq",
        "correlated quantization with a server-shared seed (no privacy)",
        one_bit,
        "corbin_fl.client.encode:encode_cq",
        "corbin_fl.server.aggregation:CQAggregator",
        local_dp=False,
        instruction_keys=frozenset({"cq-seed", "cq-rank", "cq-clients"}),
    )
)
register(
    Mechanism(
        "ternary",
        "ternary stochastic compressor (fdp paper Def. 6)",
        ternary_wire,
        "corbin_fl.client.encode:encode_ternary",
        "corbin_fl.server.aggregation:TernaryAggregator",
    )
)
register(
    Mechanism(
        "fedcad",
        "FedCAD noisy update w - w_g (Fed-CAD Alg. 1)",
        float32,
        "corbin_fl.client.encode:encode_fedcad",
        "corbin_fl.server.aggregation:FedCADAggregator",
        has_delta=True,
        dp_unit="update",
    )
)
_LEVELS_ENCODER: Final[str] = "corbin_fl.client.encode:encode_levels"
_LEVELS_AGGREGATOR: Final[str] = "corbin_fl.server.aggregation:LevelsAggregator"
register(
    Mechanism(
        "pbm",
        "Poisson binomial mechanism, m trials, pure eps-LDP (Chen et al. 2022)",
        symbols_wire,
        _LEVELS_ENCODER,
        _LEVELS_AGGREGATOR,
    )
)
register(
    Mechanism(
        "rqm",
        "randomized quantization mechanism, 2 or 3 levels (Youn et al. 2023, Alg. 2)",
        symbols_wire,
        _LEVELS_ENCODER,
        _LEVELS_AGGREGATOR,
    )
)
register(
    Mechanism(
        "imvu",
        "interpolated minimum-variance unbiased mechanism, 1/2/4 bits (Guo et al. 2023)",
        symbols_wire,
        _LEVELS_ENCODER,
        _LEVELS_AGGREGATOR,
    )
)
register(
    Mechanism(
        "signsgd",
        "sign of the update, majority vote at the server (Bernstein et al. 2019; no privacy)",
        one_bit,
        "corbin_fl.client.encode:encode_signsgd",
        "corbin_fl.server.aggregation:SignAggregator",
        local_dp=False,
    )
)
register(
    Mechanism(
        "central-gaussian",
        "update clipped to L2 norm C; the server adds Gaussian noise (central DP, trusts it)",
        float32,
        "corbin_fl.client.encode:encode_central",
        "corbin_fl.server.aggregation:CentralGaussianAggregator",
        local_dp=False,
        has_delta=True,
    )
)

"""The mechanism registry: one entry per mechanism, read by every part that depends on it.

A :class:`Mechanism` entry holds every fact about one mechanism: its name, its parameters
(:class:`Param`: run-config key, type, default, check, doc), its wire format and symbol bits, its
privacy category (:class:`corbin_fl.mechanisms.categories.Privacy`: what the ledger and the
privacy report need), its encoder and aggregator, what the round asks of the server (pairing, a
server-shared seed, an independent share, the range mode it needs) and the node policy's default.
Everything else is derived from the registered entries, or checked against them by a test:

- the config (:class:`corbin_fl.config.RunConfig`): ``mechanism`` is one of the registered
  names; every registered parameter is a run-config key, parsed, defaulted and checked from its
  :class:`Param`, its value in ``RunConfig.params`` (the config has no field of its own for it);
- the wire: :func:`param_keys` (:data:`PARAM_KEYS`) is the common keys plus every registered
  parameter key, so each instruction carries the parameters and the client parses them; the key
  sets of each stage's record (:func:`keygen_cfg_keys`, :func:`pair_cfg_keys`,
  :func:`update_cfg_keys`) and an update's array (:func:`update_spec`) follow from the entries;
- the strategy's keywords (``server.strategy`` protocol fields), the node policy's default
  (:attr:`Mechanism.policy_default`), the accounting's categories (:func:`register` declares the
  entry's ``privacy`` to :mod:`corbin_fl.mechanisms.categories`, which ``privacy_report`` reads),
  and the tests' mechanism lists (``REGISTRY``);
- the defaults in ``pyproject.toml``: the keys there must equal their registered defaults; a
  mechanism registered later takes its defaults from its entry, and pyproject need not change.

**One module and one entry.** A mechanism is its module and its entry in this one registration
list, and no other product file names it (``tests/unit/test_mechanism_modules.py`` holds every
shipped one to that, with the exceptions still left listed there):

1. its module ``mechanisms/baselines/<name>.py`` (pure torch, no Flower): its math and its
   hooks (:mod:`corbin_fl.mechanisms.baselines.hooks`): ``block_release``, its release of one
   range block, which the generic encoders ``client.encode:encode_bits`` / ``encode_values``
   call; ``count_decode``, how :class:`server.aggregation.BitsAggregator` decodes its bits'
   counts; ``release_limit``, the float releases the server admits; a finite-output mechanism
   is its :class:`~corbin_fl.mechanisms.baselines.levels.FiniteMechanism`, which
   ``encode_levels`` and ``LevelsAggregator`` use;
2. its entry: one :class:`Mechanism` registered in this module, with its :class:`Param` specs,
   wire format, symbol bits, sum form, :class:`~corbin_fl.mechanisms.categories.Privacy`
   category, node-policy default and the ``"module:function"`` of its hooks;
3. its tests.

``tests/protocol/test_registration.py`` registers a toy one, with a parameter, and follows it
through the config, the wire, the node policy, the accounting and a protocol round;
``tests/unit/test_registry.py`` shows the same for a shipped one (pbm). The entries live here,
not in their modules, because the math imports torch (and some of it scipy), which a ClientApp
process must not pay for before it trains: this module and the config import no torch.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from corbin_fl import wire
from corbin_fl.mechanisms import categories, validate
from corbin_fl.mechanisms.accounting import PrivacyEvent
from corbin_fl.mechanisms.categories import NoDPText, Privacy

if TYPE_CHECKING:
    from corbin_fl.config import RunConfig
    from corbin_fl.mechanisms.baselines.levels import FiniteMechanism

ENCODE_DEVICES: Final[tuple[str, ...]] = ("update", "cpu")
"""Where an encoder runs (:attr:`Mechanism.encode_device`): the update's device, or the CPU."""

WireSpec = tuple[str, np.dtype[Any], int]
"""``(array key, dtype, length)`` of an update on the wire."""

Check = Callable[[Any, "RunConfig"], "str | None"]
"""``check(value, cfg) -> reason or None``: why ``value`` of a parameter is bad in ``cfg``."""

PARAM_TYPES: Final[tuple[type, ...]] = (bool, int, float, str)
"""The types a parameter may have (TOML scalars; ``RunConfig`` coerces to them)."""


# ============================================================================ parameters
@dataclass(frozen=True)
class Param:
    """One parameter of a mechanism: a run-config key that every instruction also carries.

    Attributes
    ----------
    key : str
        The run-config and wire key, kebab-case (``"pbm-trials"``).
    type : type
        One of :data:`PARAM_TYPES`; the run config coerces the TOML value to it.
    default : Any
        The value of a run config that does not set the key (of type ``type``).
    doc : str
        What the value means (one or two sentences).
    check : Check or None
        ``check(value, cfg)``: the reason a value is refused (the config reports it under
        ``key``), or None when it is valid; None accepts any value of the type.
    """

    key: str
    type: type
    default: Any
    doc: str
    check: Check | None = None

    def __post_init__(self) -> None:
        if not self.key or self.key != self.key.lower() or "_" in self.key:
            raise ValueError(f"a parameter key is kebab-case, got {self.key!r}")
        if self.type not in PARAM_TYPES:
            raise ValueError(f"{self.key}: type must be one of {PARAM_TYPES}, got {self.type!r}")
        if type(self.default) is not self.type:
            raise ValueError(f"{self.key}: default {self.default!r} is not a {self.type.__name__}")

    @property
    def field(self) -> str:
        """The snake-case name (a ``RunConfig`` field or a ``CorBin`` keyword)."""
        return self.key.replace("-", "_")

    def problem(self, value: Any, cfg: RunConfig) -> str | None:
        """Why ``value`` is refused in ``cfg`` (None when it is valid)."""
        return None if self.check is None else self.check(value, cfg)


def one_of(*allowed: Any) -> Check:
    """A check: ``value`` is one of ``allowed``
    (:func:`corbin_fl.mechanisms.validate.why_one_of`)."""

    def check(value: Any, cfg: RunConfig) -> str | None:
        return validate.why_one_of(value, allowed)

    return check


def interval(low: float, high: float, *, lo_open: bool, hi_open: bool) -> Check:
    """A check: ``value`` is in the interval, ``[`` / ``(`` as ``lo_open`` / ``hi_open`` say
    (:func:`corbin_fl.mechanisms.validate.why_interval`)."""

    def check(value: Any, cfg: RunConfig) -> str | None:
        return validate.why_interval(value, low, high, lo_open=lo_open, hi_open=hi_open)

    return check


def positive(value: Any, cfg: RunConfig) -> str | None:
    """A check: ``value > 0`` (:func:`corbin_fl.mechanisms.validate.why_positive`)."""
    return validate.why_positive(value)


def at_least(low: float) -> Check:
    """A check: ``value >= low`` (:func:`corbin_fl.mechanisms.validate.why_at_least`)."""

    def check(value: Any, cfg: RunConfig) -> str | None:
        return validate.why_at_least(value, low)

    return check


# ============================================================================ wire formats
def one_bit(num_params: int, cfg: RunConfig) -> WireSpec:
    """One packed bit per parameter: ``uint8[ceil(m / 8)]``."""
    return wire.BITS, np.dtype(np.uint8), wire.packed_len(num_params)


def float32(num_params: int, cfg: RunConfig) -> WireSpec:
    """One float32 per parameter."""
    return wire.VALUES, np.dtype(np.float32), num_params


def ternary_wire(num_params: int, cfg: RunConfig) -> WireSpec:
    """Ternary symbols: 2 packed bits per parameter (``bits``) or one int8 (``int8``)."""
    if cfg.param("ternary-encoding") == "bits":
        return wire.BITS, np.dtype(np.uint8), wire.packed_len(2 * num_params)
    return wire.VALUES, np.dtype(np.int8), num_params


def symbols_wire(num_params: int, cfg: RunConfig) -> WireSpec:
    """``b``-bit symbols of a finite-output mechanism, packed: ``uint8[ceil(m b / 8)]``."""
    bits = symbol_bits_of(cfg)
    return wire.BITS, np.dtype(np.uint8), (num_params * bits + 7) // 8


def symbol_bits_of(cfg: RunConfig) -> int:
    """Bits per parameter of the finite-output mechanism of ``cfg`` (no solve needed)."""
    mech = get(cfg.mechanism)
    if mech.symbol_bits is None:
        raise ValueError(f"{cfg.mechanism!r} is not a finite-output mechanism")
    return mech.symbol_bits(cfg)


def finite_mechanism(cfg: RunConfig) -> FiniteMechanism:
    """The finite-output mechanism object of ``cfg`` (``mechanisms/baselines``), the same on both
    sides: the entry's :attr:`Mechanism.finite`."""
    mech = get(cfg.mechanism)
    if mech.finite is None:
        raise ValueError(f"{cfg.mechanism!r} is not a finite-output mechanism")
    return mech.finite(cfg)


# ============================================================================ the entry
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
        its uplink (it must agree with ``privacy``).
    has_delta : bool
        An (eps, delta) mechanism: ``delta`` is checked against the node's ``corbin-max-delta``
        and recorded in the ledger.
    dp_unit : str
        What one epsilon bounds: ``"parameter"`` (each coordinate's release) or ``"update"``
        (a client's whole update, all parameters together; it must agree with ``privacy``).
    assignments : tuple[str, ...]
        The update-stage assignments the server may send it.
    instruction_keys : frozenset[str]
        Keys its update instruction carries besides the common ones (e.g. CQ's shared seed).
    encode_device : str
        Where the encoder's tensors live (:data:`ENCODE_DEVICES`): ``"update"`` (default), the
        device of the update (CUDA when the node has one), or ``"cpu"``.
    params : tuple[Param, ...]
        Its parameters: run-config keys every instruction carries (:func:`param_keys`).
    privacy : Privacy or None
        Its privacy category (what the ledger and ``privacy_report`` use). None derives the plain
        one from ``local_dp``, ``has_delta`` and ``dp_unit``: pure eps_p-DP, a Gaussian release,
        or no DP (with sentences built from ``summary``).
    symbol_bits : Callable[[RunConfig], int] or None
        A finite-output mechanism: bits per parameter under ``cfg`` (no solve needed).
    finite : Callable[[RunConfig], FiniteMechanism] or None
        A finite-output mechanism: its object under ``cfg``, the same on both sides.
    shared_seed : tuple[str, ...]
        ``(seed key, rank key, clients key)``: the server draws one seed per round and sends
        each node the seed, its rank in the seed's permutation (the entry's ``shared_ranks``
        hook) and the number of participants under these keys of its update instruction (they
        must be among ``instruction_keys``); the client's encoder gets ``(seed, rank, n)``. ()
        (default): none.
    update_only : bool
        It works on the updates ``w_i - w_g``: the config requires ``range-mode = "update"``.
    own_clip : bool
        It perturbs the update with its own clip in either range mode, so ``range-mode`` and
        ``update-radius`` do not apply (Fed-CAD).
    node_default : bool or None
        Whether a node whose policy names no mechanisms (``corbin-mechanisms`` unset) admits it;
        None: exactly when it has local DP (:attr:`policy_default`).
    aliases : tuple of str
        Other spellings of its name that the privacy ledger and report accept (``ldp`` for
        ``ldpfl``), declared with its category (:func:`corbin_fl.mechanisms.categories.declare`).
    title : str
        Its name in the literature, for messages (``LDP-FL``); "" for :attr:`name`.
    unpaired : str
        A pairing mechanism's: the registered mechanism an unpaired client's quantizer is (its
        fallback without common randomness, what ``d = 0`` would be); "" otherwise.
    sum_levels : Callable[[RunConfig], int] or None
        Secure aggregation (:mod:`corbin_fl.secure`): the top value ``levels`` of its symbols
        (integers in ``[0, levels]``) when its server estimate is affine in the sum of the
        clients' symbols, so the server needs only that sum; None: refused with secure
        aggregation. Its aggregator then implements ``from_symbol_sum``.
    block_release : str
        ``"module:function"`` of its :data:`corbin_fl.mechanisms.baselines.hooks.BlockRelease`, for
        the block-wise encoders (``client.encode:encode_bits``, ``encode_values``): its release
        of one range block; "" for an encoder of its own.
    count_decode : str
        ``"module:function"`` of its :data:`corbin_fl.mechanisms.baselines.hooks.CountDecode`:
        how the one-bit aggregator (``BitsAggregator``) decodes the counts of ``+1`` bits; ""
        (default): LDPQ's ``c + r alpha(eps) (2 k / n - 1)`` (Alg. 1 line 4).
    release_limit : str
        ``"module:function"`` of its :data:`corbin_fl.mechanisms.baselines.hooks.ReleaseLimit`:
        the largest honest ``|v - c|`` of its float releases (``FloatAggregator``); "" (default):
        no clip the server could check, ``|v| <= FLOAT_ABS_LIMIT``.
    shared_ranks : str
        ``"module:function"`` of its :data:`~corbin_fl.mechanisms.baselines.hooks.SharedRanks`
        (with ``shared_seed``).
    node_state, stateful_release : str
        ``"module:function"`` of its :data:`~corbin_fl.mechanisms.baselines.hooks.NodeState` and
        :data:`~corbin_fl.mechanisms.baselines.hooks.StatefulRelease`: a state kept on the node
        across rounds (``client.encode:encode_stateful``); "" for none.
    update_bound, server_noise : str
        ``"module:function"`` of its :data:`~corbin_fl.mechanisms.baselines.hooks.UpdateBound`
        and :data:`~corbin_fl.mechanisms.baselines.hooks.ServerNoise`: central DP, the server's
        noise (``server.aggregation:NoisySumAggregator``); "" for none.
    pack, symbols, sum_decode : str
        ``"module:function"`` of its :data:`~corbin_fl.mechanisms.baselines.hooks.Pack`,
        :data:`~corbin_fl.mechanisms.baselines.hooks.Symbols` and
        :data:`~corbin_fl.mechanisms.baselines.hooks.SumDecode`: an update of integer symbols in
        a wire form of its own (``client.encode:encode_symbols``,
        ``server.aggregation:SymbolSumAggregator``, a secure sum's reader); "" for none.
    sum_trials : Callable[[RunConfig], int | None] or None
        The privacy of its symbols in a secure sum (:mod:`corbin_fl.mechanisms.secure_sum`,
        the run's privacy report against the server): each symbol is ``Binomial(M, p)`` with
        ``p`` in the range of ``(eps/M)``-randomized response, so that module's exact worst case
        with ``M`` trials applies; the callable gives ``M`` under ``cfg`` (None: not under these
        settings). None: no such analysis (the report keeps the local guarantee against the
        server). The paired mechanisms' analysis comes from their privacy category.
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
    params: tuple[Param, ...] = ()
    privacy: Privacy | None = None
    symbol_bits: Callable[[RunConfig], int] | None = None
    finite: Callable[[RunConfig], FiniteMechanism] | None = None
    shared_seed: tuple[str, ...] = ()
    update_only: bool = False
    own_clip: bool = False
    node_default: bool | None = None
    aliases: tuple[str, ...] = ()
    title: str = ""
    unpaired: str = ""
    sum_levels: Callable[[RunConfig], int] | None = None
    sum_trials: Callable[[RunConfig], int | None] | None = None
    block_release: str = ""
    count_decode: str = ""
    release_limit: str = ""
    shared_ranks: str = ""
    update_bound: str = ""
    server_noise: str = ""
    node_state: str = ""
    stateful_release: str = ""
    pack: str = ""
    symbols: str = ""
    sum_decode: str = ""

    def __post_init__(self) -> None:
        if self.encode_device not in ENCODE_DEVICES:
            raise ValueError(
                f"encode_device must be one of {ENCODE_DEVICES}, got {self.encode_device!r}"
            )
        if self.privacy is None:
            object.__setattr__(self, "privacy", self._plain_privacy())
        priv = self.category
        if priv.local_dp != self.local_dp or priv.unit != self.dp_unit:
            raise ValueError(f"{self.name}: privacy disagrees with local_dp / dp_unit")
        if priv.paired != self.pairs:
            raise ValueError(f"{self.name}: privacy.paired must equal pairs")
        if priv.family == "gdp" and not self.has_delta:
            raise ValueError(f"{self.name}: a Gaussian release needs has_delta")
        if self.shared_seed and (
            len(self.shared_seed) != 3 or not self.instruction_keys >= set(self.shared_seed)
        ):
            raise ValueError(f"{self.name}: a shared seed rides in 3 of its instruction_keys")
        if bool(self.shared_seed) != bool(self.shared_ranks):
            raise ValueError(f"{self.name}: a shared seed needs its shared_ranks, and only it")
        for together in _HOOKS_TOGETHER:
            given = [hook for hook in together if getattr(self, hook)]
            if given and len(given) != len(together):
                raise ValueError(f"{self.name}: hooks {', '.join(together)} go together")
        keys = [p.key for p in self.params]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.name}: a parameter key is given twice")
        clash = set(keys) & set(wire.COMMON_PARAM_KEYS)
        if clash:
            raise ValueError(f"{self.name}: {sorted(clash)} are common keys, not parameters")

    def _plain_privacy(self) -> Privacy:
        if self.local_dp:
            family: categories.Family = "gdp" if self.has_delta else "pure"
            return Privacy(family, unit=self.dp_unit, paired=self.pairs)
        return Privacy(
            "none",
            unit=self.dp_unit,
            no_dp=NoDPText(
                "no DP (no privacy budget)",
                f"No DP: {self.name} ({self.summary}) has no privacy budget; only TLS hides its "
                "uploads on the link.",
                "no DP (it sees every upload)",
                f"No DP: the server receives every client's {self.name} upload.",
                f"No DP: the global model every client receives is decoded from {self.name} "
                "uploads with no privacy budget.",
            ),
        )

    @property
    def category(self) -> Privacy:
        """The privacy category (never None after construction)."""
        assert self.privacy is not None
        return self.privacy

    @property
    def independent_share(self) -> bool:
        """A ``gamma`` fraction of the sampled clients quantizes independently (AugCorBin-FL)."""
        return self.category.independent_share

    @property
    def own_keys(self) -> frozenset[str]:
        """The run-config keys only some mechanisms read that this one reads: its parameters,
        and ``gamma`` when a share of the clients quantizes independently."""
        gamma = {"gamma"} if self.independent_share else set()
        return frozenset(p.key for p in self.params) | gamma

    @property
    def policy_default(self) -> bool:
        """Whether the node policy admits it by default (:attr:`node_default`, else local DP)."""
        return self.local_dp if self.node_default is None else self.node_default

    def encode_fn(self) -> Callable[..., Any]:
        """The client encoder (imported now)."""
        return _resolve(self.encoder)

    def aggregator_class(self) -> type:
        """The server aggregator class (imported now)."""
        return _resolve(self.aggregator)

    def hook(self, name: str) -> Callable[..., Any] | None:
        """Its hook ``name`` (one of :data:`_HOOKS`; imported now), or None where it declares
        none."""
        if name not in _HOOKS:
            raise ValueError(f"{name!r} is not a hook of a mechanism ({', '.join(_HOOKS)})")
        path: str = getattr(self, name)
        return _resolve(path) if path else None

    def release(
        self, cfg: RunConfig, rnd: int, node: int, num_params: int, *, paired: bool
    ) -> PrivacyEvent:
        """The privacy ledger's event of one released update (one client, one round).

        ``eps_p = epsilon`` (None without local DP), ``d`` for a release with the pair's
        common randomness (CorBinQ, Alg. 2; accounted in the pair-joint view too), ``delta``
        for an (eps, delta) mechanism.
        """
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


_HOOKS: Final[tuple[str, ...]] = (
    "block_release",
    "count_decode",
    "release_limit",
    "shared_ranks",
    "update_bound",
    "server_noise",
    "node_state",
    "stateful_release",
    "pack",
    "symbols",
    "sum_decode",
)
"""The hooks an entry may name (:mod:`corbin_fl.mechanisms.baselines.hooks`)."""
_HOOKS_TOGETHER: Final[tuple[tuple[str, ...], ...]] = (
    ("pack", "symbols", "sum_decode"),
    ("update_bound", "server_noise"),
    ("node_state", "stateful_release"),
)
"""Hooks that one generic step calls together: an entry names all of a group or none."""


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


REGISTRY: dict[str, Mechanism] = {}
"""Registered mechanisms, by name, in registration order."""


def register(mechanism: Mechanism) -> Mechanism:
    """Add ``mechanism`` to :data:`REGISTRY` (a name is registered once) and declare its privacy
    category to the accounting (:func:`corbin_fl.mechanisms.categories.declare`).

    Raises
    ------
    ValueError
        If the name is registered already, or one of its parameter keys belongs to another
        mechanism with a different spec.
    """
    if mechanism.name in REGISTRY:
        raise ValueError(f"mechanism {mechanism.name!r} is already registered")
    specs = param_specs()
    for p in mechanism.params:
        if p.key in specs and specs[p.key] != p:
            raise ValueError(f"parameter {p.key!r} is already registered with another spec")
    REGISTRY[mechanism.name] = mechanism
    categories.declare(mechanism.name, mechanism.category, mechanism.aliases)
    return mechanism


def unregister(name: str) -> Mechanism:
    """Remove the mechanism ``name`` (and its privacy category) again; returns its entry."""
    mech = REGISTRY.pop(name)
    categories.withdraw(name)
    return mech


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


def pairing() -> tuple[str, ...]:
    """The registered mechanisms that pair clients and share common randomness."""
    return tuple(name for name, mech in REGISTRY.items() if mech.pairs)


def without_common_randomness() -> Mechanism:
    """The mechanism the pairing ones fall back to without common randomness (their
    :attr:`Mechanism.unpaired`): ``d = 0`` is it.

    Raises
    ------
    LookupError
        If the pairing mechanisms name none, or not the same one.
    """
    names = {mech.unpaired for mech in REGISTRY.values() if mech.pairs and mech.unpaired}
    if len(names) != 1:
        raise LookupError(f"the pairing mechanisms name {sorted(names)} as their fallback")
    return get(names.pop())


def param_specs() -> Mapping[str, Param]:
    """Every registered parameter by key (a key shared by two mechanisms has one spec)."""
    return {p.key: p for mech in REGISTRY.values() for p in mech.params}


V1_PARAMETER_KEYS: Final[tuple[str, ...]] = (
    *("ternary-sparsity", "ternary-encoding", "pbm-trials", "rqm-levels", "rqm-q", "imvu-bits"),
    *("central-clip", "fedcad-clip", "fedcad-gamma", "fedcad-sigma-diff", "fedcad-diff-init"),
    "fedcad-diff-floor",
)
"""The mechanisms' parameters of the v1 wire format, in its order (a ConfigRecord serialises its
items in insertion order); ``RunConfig.params`` and ``summary.json`` keep it too."""

_param_keys_cache: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())


def param_keys() -> tuple[str, ...]:
    """The mechanism settings every instruction carries (:data:`PARAM_KEYS`), in wire order.

    The common keys (:data:`corbin_fl.wire.COMMON_PARAM_KEYS`: mechanism, epsilon, delta, d, p-x,
    cr-mode, range-mode, ..., test-z-digest last) with every registered parameter key before
    the last one: the parameters of the v1 wire format in its order (:data:`V1_PARAMETER_KEYS`),
    then the others in registration order; then :data:`corbin_fl.wire.TRAILING_PARAM_KEYS`
    (``secure-aggregation``).
    """
    global _param_keys_cache
    ident = tuple(map(id, REGISTRY.values()))
    if _param_keys_cache[0] == ident:
        return _param_keys_cache[1]
    specs = param_specs()
    v1 = [k for k in V1_PARAMETER_KEYS if k in specs]
    others = [k for k in specs if k not in v1]
    *head, last = wire.COMMON_PARAM_KEYS
    keys = (*head, *v1, *others, last, *wire.TRAILING_PARAM_KEYS)
    _param_keys_cache = (ident, keys)
    return keys


def __getattr__(name: str) -> Any:
    """``PARAM_KEYS``: the mechanism's settings every instruction carries, derived now from the
    registered mechanisms (:func:`param_keys`): :data:`corbin_fl.wire.COMMON_PARAM_KEYS` plus
    every registered parameter key. The client parses them with ``RunConfig.from_flower`` and
    checks them against its policy."""
    if name == "PARAM_KEYS":
        return param_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def update_spec(cfg: RunConfig, num_params: int) -> WireSpec:
    """Array key, dtype and length of the update of ``cfg.mechanism`` for ``num_params``
    under ``cfg``'s settings (the entry's :attr:`Mechanism.wire`).

    Raises
    ------
    corbin_fl.wire.WireError
        If no mechanism is registered under ``cfg.mechanism``.
    """
    try:
        spec = get(cfg.mechanism).wire
    except KeyError as exc:
        raise wire.WireError(str(exc.args[0])) from exc
    return spec(num_params, cfg)


def keygen_cfg_keys() -> frozenset[str]:
    """The exact key set of the ``corbin`` record of a keygen instruction."""
    return frozenset({wire.STAGE, wire.ROUND, *param_keys()})


def update_cfg_keys(mechanism: str, assignment: str, cr_mode: str) -> frozenset[str]:
    """The required key set of the ``corbin`` record of an update instruction (a pipelined
    instruction may add :data:`corbin_fl.wire.NEXT_PAIR_KEYS`); the mechanism's own
    :attr:`Mechanism.instruction_keys` included."""
    keys = {wire.STAGE, wire.ROUND, wire.ASSIGNMENT, wire.ARRAYS_KEY, *param_keys()}
    if assignment == wire.PAIRED:
        keys |= {wire.PARTNER, wire.PARTNER_PUBKEY if cr_mode == "derived" else wire.PARTNER_BLOB}
    elif assignment == wire.PARTNER_GONE:
        keys.add(wire.PARTNER)
    keys |= get(mechanism).instruction_keys
    return frozenset(keys)


def pair_cfg_keys(cr_mode: str) -> frozenset[str]:
    """The exact key set of the ``corbin`` record of a pair instruction."""
    keys = {wire.STAGE, wire.ROUND, wire.PARTNER, wire.PARTNER_PUBKEY, *param_keys()}
    if cr_mode == "exact":
        keys.add(wire.NUM_PARAMS)
    return frozenset(keys)


# ============================================================================ the mechanisms
def _one_level(cfg: RunConfig) -> int:
    """A one-bit symbol: 1 = ``U = +1`` (secure aggregation sums the bits)."""
    return 1


def _ternary_levels(cfg: RunConfig) -> int:
    """A ternary symbol ``t + 1`` for ``t`` in {-1, 0, 1}."""
    return 2


def _pbm_levels(cfg: RunConfig) -> int:
    """PBM's symbol: the number of successes, 0..m."""
    return int(cfg.param("pbm-trials"))


def _rqm_levels(cfg: RunConfig) -> int:
    """RQM's symbol: the level index, 0..K-1 (evenly spaced levels)."""
    return int(cfg.param("rqm-levels")) - 1


def _one_trial(cfg: RunConfig) -> int:
    """One binomial trial: a bit with ``P(1)`` in ``[1/(1+e^eps), e^eps/(1+e^eps)]``."""
    return 1


def _pbm_trials(cfg: RunConfig) -> int:
    """PBM's symbol is ``Binomial(m, 1/2 + theta x)``, ``theta = tanh(eps/2m)/2``."""
    return int(cfg.param("pbm-trials"))


def _rqm_trials(cfg: RunConfig) -> int | None:
    """RQM with two levels is LDPQ's bit (``P(top) = (X + x)/(2X)``, ``X = alpha``); three levels
    are not binomial."""
    return 1 if int(cfg.param("rqm-levels")) == 2 else None


# The finite-output mechanisms' math (mechanisms/baselines) imports torch: the functions below
# import it when they run, so that importing the registry (every ClientApp does) stays free of
# torch (about 2 CPU-s per process, mechanisms/__init__.py).
def _pbm_bits(cfg: RunConfig) -> int:
    from corbin_fl.mechanisms.baselines.levels import symbol_bits

    return symbol_bits(cfg.param("pbm-trials") + 1)


def _pbm(cfg: RunConfig) -> FiniteMechanism:
    from corbin_fl.mechanisms.baselines.pbm import PBM

    return PBM(cfg.epsilon, cfg.param("pbm-trials"))


def _rqm_bits(cfg: RunConfig) -> int:
    from corbin_fl.mechanisms.baselines.levels import symbol_bits

    return symbol_bits(cfg.param("rqm-levels"))


def _rqm(cfg: RunConfig) -> FiniteMechanism:
    """RQM of ``cfg``; with 3 levels and ``rqm-q = 0`` the variance-optimal ``q``."""
    from corbin_fl.mechanisms.baselines.rqm import RQM, rqm_optimal_q

    q = cfg.param("rqm-q")
    if cfg.param("rqm-levels") == 3 and q == 0.0:
        q = rqm_optimal_q(cfg.epsilon)
    return RQM(cfg.epsilon, cfg.param("rqm-levels"), q)


def _imvu_bits(cfg: RunConfig) -> int:
    return int(cfg.param("imvu-bits"))


def _imvu(cfg: RunConfig) -> FiniteMechanism:
    """I-MVU at the run's budget with its design from the app's store (shipped, cached or
    solved once per machine: ``corbin_fl.design_store``)."""
    from corbin_fl.design_store import designs
    from corbin_fl.mechanisms.baselines.imvu import IMVU, MVU_DESIGNS, MVUKey

    bits = cfg.param("imvu-bits")
    return IMVU(cfg.epsilon, bits, designs(MVU_DESIGNS).get(MVUKey(cfg.epsilon, bits)))


def _fedcad_floor(value: Any, cfg: RunConfig) -> str | None:
    """``fedcad-diff-floor`` in (0, 1) and at most ``fedcad-diff-init``."""
    why = interval(0.0, 1.0, lo_open=True, hi_open=True)(value, cfg)
    init = cfg.param("fedcad-diff-init")
    if why is None and value > init:
        why = f"must be <= fedcad-diff-init ({init}), got {value}"
    return why


_ONE_BIT_ENCODER: Final[str] = "corbin_fl.client.encode:encode_one_bit"
_BITS_AGGREGATOR: Final[str] = "corbin_fl.server.aggregation:BitsAggregator"
_BITS_ENCODER: Final[str] = "corbin_fl.client.encode:encode_bits"
_VALUES_ENCODER: Final[str] = "corbin_fl.client.encode:encode_values"
_FLOAT_AGGREGATOR: Final[str] = "corbin_fl.server.aggregation:FloatAggregator"
_BASELINES: Final[str] = "corbin_fl.mechanisms.baselines"
_CQ_SHARED_SEED: Final[tuple[str, str, str]] = ("cq-seed", "cq-rank", "cq-clients")
"""CQ's shared seed on the wire (v1): the seed, the node's rank, the participants."""
_PAIRED_ASSIGNMENTS: Final[tuple[str, ...]] = ("paired", "partner-gone", "unpaired")
_RR_PAIRED: Final[Privacy] = Privacy("pure", randomized_response=True, paired=True)

register(
    Mechanism(
        "corbin",
        "CorBinQ bit with the pair's common randomness (Alg. 2); LDPQ when unpaired",
        one_bit,
        _ONE_BIT_ENCODER,
        _BITS_AGGREGATOR,
        pairs=True,
        assignments=_PAIRED_ASSIGNMENTS,
        privacy=_RR_PAIRED,
        sum_levels=_one_level,
        aliases=("corbin-fl",),
        title="CorBin-FL",
        unpaired="ldpfl",
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
        privacy=Privacy(
            "pure",
            randomized_response=True,
            paired=True,
            independent_share=True,
            bound_note="The paper's user-level bound for AugCorBin-FL (arXiv 2409.13133, "
            "Theorem 3, eq. 5) is not a valid bound (it grows with the radius r, which the "
            "mechanism's law does not depend on, and a realisable configuration beats it: "
            'README, "AugCorBin-FL\'s eq. (5) is not a bound"), so no guarantee is printed '
            "from it.",
            sum_guarantee="corbin_fl.mechanisms.augcorbin:augcorbin_guarantee",
        ),
        sum_levels=_one_level,
        title="AugCorBin-FL",
        unpaired="ldpfl",
    )
)
register(
    Mechanism(
        "ldpfl",
        "LDPQ bit with independent coins (Alg. 1)",
        one_bit,
        _ONE_BIT_ENCODER,
        _BITS_AGGREGATOR,
        privacy=Privacy("pure", randomized_response=True),
        sum_levels=_one_level,
        sum_trials=_one_trial,
        aliases=("ldp", "ldp-fl"),
        title="LDP-FL",
    )
)
register(
    Mechanism(
        "gaussian",
        "clip + analytic Gaussian noise for (eps, delta)",
        float32,
        _VALUES_ENCODER,
        _FLOAT_AGGREGATOR,
        has_delta=True,
        block_release=f"{_BASELINES}.gaussian:block_release",
        release_limit=f"{_BASELINES}.gaussian:release_limit",
        privacy=Privacy("gdp", release="(analytic Gaussian noise on the clipped value)"),
    )
)
register(
    Mechanism(
        "laplace",
        "clip + Laplace noise of scale 2r/eps",
        float32,
        _VALUES_ENCODER,
        _FLOAT_AGGREGATOR,
        block_release=f"{_BASELINES}.laplace:block_release",
        release_limit=f"{_BASELINES}.laplace:release_limit",
        privacy=Privacy("pure", release="released parameter carries Laplace noise"),
    )
)
register(
    Mechanism(
        "fedavg",
        "the model in the clear (no privacy)",
        float32,
        _VALUES_ENCODER,
        _FLOAT_AGGREGATOR,
        local_dp=False,
        block_release=f"{_BASELINES}.vanilla:block_release",
        privacy=Privacy(
            "none",
            no_dp=NoDPText(
                "no DP (the update is sent as it is)",
                "No DP: fedavg uploads the update as it is, with no noise; only TLS hides it on "
                "the link.",
                "no DP (it sees every update)",
                "No DP: the server receives every update as it is.",
                "No DP: the global model every client receives is the plain average of the "
                "updates.",
            ),
        ),
        aliases=("vanilla",),
        title="FedAvg",
    )
)
register(
    Mechanism(
        "cq",
        "correlated quantization with a server-shared seed (no privacy)",
        one_bit,
        _BITS_ENCODER,
        _BITS_AGGREGATOR,
        local_dp=False,
        block_release=f"{_BASELINES}.cq:block_release",
        count_decode=f"{_BASELINES}.cq:decode_counts",
        instruction_keys=frozenset(_CQ_SHARED_SEED),
        shared_seed=_CQ_SHARED_SEED,
        shared_ranks=f"{_BASELINES}.cq:shared_ranks",
        privacy=Privacy(
            "none",
            no_dp=NoDPText(
                "no DP (bits with no privacy budget)",
                "No DP: cq sends one stochastically rounded bit per parameter with no privacy "
                "budget (its bits aim at accuracy, not privacy); only TLS hides them on the link.",
                "no DP (it sees every bit)",
                "No DP: the server receives every client's bits, which carry no privacy budget.",
                "No DP: the global model every client receives is decoded from bits with no "
                "privacy budget.",
            ),
        ),
    )
)
register(
    Mechanism(
        "ternary",
        "ternary stochastic compressor (fdp paper Def. 6)",
        ternary_wire,
        "corbin_fl.client.encode:encode_symbols",
        "corbin_fl.server.aggregation:SymbolSumAggregator",
        params=(
            Param(
                "ternary-sparsity",
                float,
                0.5,
                "Probability p0 = 1 - A/B of a zero output of the ternary stochastic compressor "
                "(fdp paper Def. 6, A = r alpha(eps)), in [0, 1).",
                interval(0.0, 1.0, lo_open=False, hi_open=True),
            ),
            Param(
                "ternary-encoding",
                str,
                "bits",
                "bits (2 bits per parameter) or int8.",
                one_of("bits", "int8"),
            ),
        ),
        privacy=Privacy("pure", release="released parameter is ternary stochastic rounding"),
        sum_levels=_ternary_levels,
        block_release=f"{_BASELINES}.ternary:block_release",
        pack=f"{_BASELINES}.ternary:pack",
        symbols=f"{_BASELINES}.ternary:symbols",
        sum_decode=f"{_BASELINES}.ternary:sum_decode",
    )
)
register(
    Mechanism(
        "fedcad",
        "FedCAD noisy update w - w_g (Fed-CAD Alg. 1)",
        float32,
        "corbin_fl.client.encode:encode_stateful",
        "corbin_fl.server.aggregation:FloatUpdateAggregator",
        has_delta=True,
        dp_unit="update",
        own_clip=True,
        node_state=f"{_BASELINES}.fedcad:node_state",
        stateful_release=f"{_BASELINES}.fedcad:stateful_release",
        params=(
            Param(
                "fedcad-clip",
                float,
                1.0,
                "FedCAD L2 clip threshold C of the update (Fed-CAD Alg. 1 line 9).",
                positive,
            ),
            Param(
                "fedcad-gamma",
                float,
                0.5,
                "FedCAD obsolete factor gamma of the E[Diff] momentum (Alg. 1 line 25), in [0, 1].",
                interval(0.0, 1.0, lo_open=False, hi_open=False),
            ),
            Param(
                "fedcad-sigma-diff",
                float,
                0.01,
                "FedCAD noise on the measured difference norm (Sec. V-B), >= 0.",
                at_least(0.0),
            ),
            Param(
                "fedcad-diff-init",
                float,
                0.5,
                "Initial E[Diff] as a fraction of C, in (0, 1).",
                interval(0.0, 1.0, lo_open=True, hi_open=True),
            ),
            Param(
                "fedcad-diff-floor",
                float,
                1e-3,
                "Smallest E[Diff] as a fraction of C, 0 < floor <= fedcad-diff-init.",
                _fedcad_floor,
            ),
        ),
        privacy=Privacy(
            "gdp",
            unit="update",
            release="(update level, L2 sensitivity 2C, not per parameter)",
            caveat_a=" The E[Diff] estimate that sets later rounds' noise is not accounted.",
            caveat_b=" The E[Diff] estimate is not accounted.",
            method_note="(A) fedcad: update-level (eps_p, delta) per round with L2 sensitivity "
            "2C (Fed-CAD Theorem VI.1); rounds compose as Gaussian releases; the E[Diff] "
            "estimate is not accounted",
        ),
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
        params=(
            Param(
                "pbm-trials",
                int,
                1,
                "PBM's m in [1, 255] (ceil(log2(m + 1)) bits per parameter, rounded up to 1, 2, "
                "4 or 8; mechanisms/baselines/pbm.py).",
                interval(1, 255, lo_open=False, hi_open=False),
            ),
        ),
        symbol_bits=_pbm_bits,
        finite=_pbm,
        sum_levels=_pbm_levels,
        sum_trials=_pbm_trials,
        title="PBM",
    )
)
register(
    Mechanism(
        "rqm",
        "randomized quantization mechanism, 2 or 3 levels (Youn et al. 2023, Alg. 2)",
        symbols_wire,
        _LEVELS_ENCODER,
        _LEVELS_AGGREGATOR,
        params=(
            Param(
                "rqm-levels",
                int,
                2,
                "RQM's levels: 2 (1 bit) or 3 (2 bits) (mechanisms/baselines/rqm.py).",
                one_of(2, 3),
            ),
            Param(
                "rqm-q",
                float,
                0.0,
                "Probability in [0, 1) that RQM keeps its middle level (3 levels); 0 = derived: "
                "the q that minimises the worst-case variance at epsilon.",
                interval(0.0, 1.0, lo_open=False, hi_open=True),
            ),
        ),
        symbol_bits=_rqm_bits,
        finite=_rqm,
        sum_levels=_rqm_levels,
        sum_trials=_rqm_trials,
        title="RQM",
    )
)
register(
    Mechanism(
        "imvu",
        "interpolated minimum-variance unbiased mechanism, 1/2/4 bits (Guo et al. 2023)",
        symbols_wire,
        _LEVELS_ENCODER,
        _LEVELS_AGGREGATOR,
        params=(
            Param(
                "imvu-bits",
                int,
                1,
                "I-MVU's budget: 1, 2 or 4 bits per parameter (mechanisms/baselines/imvu.py).",
                one_of(1, 2, 4),
            ),
        ),
        symbol_bits=_imvu_bits,
        finite=_imvu,
        title="I-MVU",
    )
)
register(
    Mechanism(
        "signsgd",
        "sign of the update, majority vote at the server (Bernstein et al. 2019; no privacy)",
        one_bit,
        _BITS_ENCODER,
        _BITS_AGGREGATOR,
        local_dp=False,
        block_release=f"{_BASELINES}.signsgd:block_release",
        count_decode=f"{_BASELINES}.signsgd:decode_counts",
        update_only=True,
        privacy=Privacy(
            "none",
            no_dp=NoDPText(
                "no DP (the signs of the update)",
                "No DP: signsgd sends the sign of every parameter's update, a deterministic "
                "function of it; only TLS hides the bits on the link.",
                "no DP (it sees every sign)",
                "No DP: the server receives the signs of every client's update.",
                "No DP: the global model moves by the majority vote of the clients' signs.",
            ),
        ),
        sum_levels=_one_level,
    )
)
register(
    Mechanism(
        "central-gaussian",
        "update clipped to L2 norm C; the server adds Gaussian noise (central DP, trusts it)",
        float32,
        _VALUES_ENCODER,
        "corbin_fl.server.aggregation:NoisySumAggregator",
        local_dp=False,
        block_release=f"{_BASELINES}.central_gaussian:block_release",
        update_bound=f"{_BASELINES}.central_gaussian:update_bound",
        server_noise=f"{_BASELINES}.central_gaussian:server_noise",
        has_delta=True,
        update_only=True,
        params=(
            Param(
                "central-clip",
                float,
                1.0,
                "central-gaussian: the L2 clip C of each client's update w_i - w_g (the "
                "sensitivity of the server's noisy sum; mechanisms/baselines/central_gaussian.py)."
                " With this mechanism epsilon and delta are the central guarantee of the run.",
                positive,
            ),
        ),
        privacy=Privacy("central"),
        title="central Gaussian",
    )
)

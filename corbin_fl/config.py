"""The protocol's run configuration: parsed once from Flower's ``run_config``, validated, frozen.

Every protocol key is one field of :class:`RunConfig` (the Flower key is the field name in
kebab-case, ``num-rounds`` <-> ``num_rounds``) or one parameter of a registered mechanism
(:class:`corbin_fl.registry.Param`). It names no data set, model or optimizer: an app's own task
settings live with the app. This project's app extends it (:class:`corbin_fl.app.config.AppConfig`
adds the task's fields and checks through the hooks :attr:`RunConfig.KEYS_AFTER`,
:meth:`RunConfig._app_errors` and :meth:`RunConfig._implied`), so its ``run_config`` is one
table, one parse and one error list. A mechanism's parameters are parsed, defaulted and
checked from their registered specs and live in :attr:`RunConfig.params` (read with
:meth:`RunConfig.param`), so a mechanism's parameters reach the config without an edit here: this
module names no mechanism. The defaults are the ones in
``pyproject.toml`` ``[tool.flwr.app.config]`` (a test keeps both in step; a parameter missing
there takes its registered default).

:meth:`RunConfig.from_flower` is the only boundary: it rejects unknown keys (with a did-you-mean),
wrong types and out-of-range values, and reports ALL bad keys in one :class:`ConfigError`, so a bad
run fails at start with one clear message instead of in round 7. The checks run by job (the
protocol's settings, the app's task through :meth:`RunConfig._app_errors`, the registered
mechanisms' parameters, secure aggregation: :func:`corbin_fl.secure.config_errors`), each range or
choice with :mod:`corbin_fl.mechanisms.validate`.

**Keys the protocol does not own.** A key that is neither a field nor a registered parameter is
refused (``unknown key; did you mean ...?``): the protocol cannot tell another app's key from a
typo of its own. An app whose ``run_config`` holds its own keys either extends :class:`RunConfig`
with them (as this project's app does) or names them: ``RunConfig.from_flower(run_config,
app_keys=("my-lr", ...))`` leaves those keys to the app and still refuses every other unknown key.
The building block itself never parses an app's ``run_config``: :class:`corbin_fl.CorBin` takes
keywords and ``corbin_mod`` reads only the instruction's registered keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Self

from corbin_fl import registry, secure
from corbin_fl.mechanisms import validate

logger = logging.getLogger(__name__)

MECHANISMS: Final[tuple[str, ...]] = tuple(registry.REGISTRY)
"""Mechanisms the round loop runs (paper Alg. 3 and the baselines of its Section V): every
mechanism of :mod:`corbin_fl.registry`."""
PAIRED_MECHANISMS: Final[frozenset[str]] = frozenset(registry.pairing())
"""Mechanisms that pair clients and share common randomness (Alg. 3 lines 1-17)."""
CR_MODES: Final[tuple[str, ...]] = ("relay", "derived", "exact")
"""How a pair gets its common randomness: an encrypted ``Y || seed`` blob relayed by the server,
a seed derived from the X25519 secret, or the lead's ``d*m`` raw bits (Alg. 3 line 17)."""
RANGE_MODES: Final[tuple[str, ...]] = ("layer", "update")
"""What the clients quantize: the weights in the layer ranges, or the update in ``[-R, R]``
(:attr:`RunConfig.range_mode`)."""

DEVICES: Final[tuple[str, ...]] = ("auto", "cpu", "cuda")
PARAMS_AFTER: Final[str] = "test-z-digest"
"""The key after which the mechanisms' parameters come in :meth:`RunConfig.to_flower` and
:meth:`RunConfig.keys` (where their typed fields were until issue 41: ``summary.json`` keeps its
order)."""


APP_LOGGERS: Final[tuple[str, ...]] = ("corbin_fl",)
"""Loggers of this app (every module logger is a child of ``corbin_fl``)."""


def configure_app_logging(level: int = logging.INFO) -> None:
    """Make this app's log lines visible in the ServerApp / ClientApp process output.

    Flower configures only its ``flwr`` logger; without a handler Python prints WARNING lines
    and drops INFO ones (such as the one line per round). If the root logger already has a
    handler (pytest, an embedding application) only the level is set and records propagate
    there; otherwise one stderr handler is added to each app logger. Idempotent.
    """
    has_root_handler = bool(logging.getLogger().handlers)
    for name in APP_LOGGERS:
        log = logging.getLogger(name)
        log.setLevel(level)
        if has_root_handler or any(getattr(h, "_corbin_fl", False) for h in log.handlers):
            continue
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._corbin_fl = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False


class ConfigError(ValueError):
    """A run configuration with one or more bad keys.

    Parameters
    ----------
    errors : Mapping[str, str]
        Bad key -> reason. The message lists every one of them.
    """

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors: dict[str, str] = dict(errors)
        lines = "\n".join(f"  - {key}: {why}" for key, why in sorted(self.errors.items()))
        super().__init__(f"invalid run config ({len(self.errors)} bad key(s)):\n{lines}")


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _number(key: str, value: Any, *, integer: bool) -> int | float:
    """Coerce a TOML scalar to int/float, refusing bools and lossy conversions."""
    if isinstance(value, bool):
        raise TypeError(f"expected {'an integer' if integer else 'a number'}, got a bool")
    if integer:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(f"expected an integer, got {type(value).__name__} {value!r:.80}")
    if isinstance(value, int | float):
        out = float(value)
        if not math.isfinite(out):
            raise ValueError(f"expected a finite number, got {value!r:.80}")
        return out
    raise TypeError(f"expected a number, got {type(value).__name__} {value!r:.80}")


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(f"expected a bool, got {type(value).__name__} {value!r:.80}")
    if kind is int:
        return _number(key, value, integer=True)
    if kind is float:
        return _number(key, value, integer=False)
    if kind is str:
        if isinstance(value, str):
            return value
        raise TypeError(f"expected a string, got {type(value).__name__} {value!r:.80}")
    raise AssertionError(f"unsupported field type {kind!r}")  # pragma: no cover


EXECUTION: Mapping[str, str] = MappingProxyType({"role": "execution"})
"""Field metadata of a key that cannot change a run's result (:meth:`RunConfig.execution_keys`):
the sweeps ignore it when they address a run, a resumed run may change it."""
RESUMABLE: Mapping[str, str] = MappingProxyType({"role": "resumable"})
"""Field metadata of a key that changes the result but that a resumed run may change (the run
length; :meth:`RunConfig.resumable_keys`)."""


@dataclass(frozen=True)
class RunConfig:
    """Validated run configuration of a CorBin-FL run (Flower keys are kebab-case).

    Attributes
    ----------
    mechanism : str
        One of :data:`MECHANISMS`.
    num_rounds : int
        Communication rounds ``T``.
    epsilon : float
        Per-parameter PLDP budget ``eps_p`` of Alg. 1/2 (also the budget of the Laplace,
        Gaussian, ternary and FedCAD baselines).
    delta : float
        ``delta`` of the Gaussian and FedCAD baselines and of the (eps, delta) accounting.
    d : int
        Shared random bits per parameter (Alg. 3 line 15), ``1 <= d <= 16``.
    gamma : float
        AugCorBin-FL fraction of clients quantizing independently (paper Thm. 3), in [0, 1].
    p_x : float
        Bias of the codebook coin (CoQ-FL biased codebook), in (0, 1); 0.5 is the paper's
        unbiased codebook.
    cr_mode : str
        Common-randomness mode, one of :data:`CR_MODES`.
    global_lr : float
        Global learning rate ``lambda`` of paper eq. (6), ``w <- (1-lambda) w + lambda w_new``.
    radius_margin : float
        Relative margin added to the layer-wise range: ``r = (1+margin)(max-min)/2``.
    min_radius : float
        Lower bound on every layer radius (a constant layer still gets a usable range).
    range_quantile : float
        ``q`` in (0.5, 1]: each layer's range is ``[Q_{1-q}, Q_q]`` of the global model's values
        (``corbin_fl.layout.layer_center_radius``). ``1`` is the paper's min/max (the default).
        With few clients the decoded one-bit average reaches ``c +- r alpha``, so the next min/max
        range grows by up to ``1 + lambda (alpha - 1)`` per round from the noise alone; an inner
        quantile keeps the range on the bulk of the weights.
    range_mode : str
        What the clients quantize, one of :data:`RANGE_MODES`. ``"layer"`` (the paper, Sec. V-2):
        the trained weights ``w_i`` in the layer ranges ``[c_l - r_l, c_l + r_l]`` of the global
        model above. ``"update"``: the paper's footnote 2 taken per parameter, ``c_j = w_{g,j}``
        (the global weight every client starts from) and ``r_j = update-radius``, i.e. the clients
        quantize ``w_i - w_g`` in ``[-R, R]`` and the server adds the decoded mean back to
        ``w_g``. The quantization noise then scales with the local update, not with the spread
        of the weights (``Var = r^2 alpha^2 - ...``, Thm. 1); updates beyond ``R`` are clipped.
        Every mechanism but ``fedcad`` (which always perturbs the update, with ``fedcad-clip``).
    update_radius : float
        ``R`` of ``range-mode = "update"`` (same units as the weights). ``0`` (the default) means
        the app derives ``R`` from its public training settings (the ``update_radius`` rule of
        :meth:`corbin_fl.server.strategy.CorBin.from_run_config`; this project's app:
        :class:`corbin_fl.app.config.AppConfig`). The resolved ``R`` is in ``summary.json``.
    seed : int
        Seed of everything public: model init, pairing, AugCorBin split, batch order.
        Cryptographic keys, seeds and quantization noise never derive from it.
    min_clients : int
        The run waits for this many connected nodes before round 1, and a round with fewer
        sampled nodes is skipped.
    clients_per_round : int
        Nodes sampled per round (0 = all connected nodes).
    stage_timeout, first_stage_timeout : float
        Seconds a stage waits for replies; the first run of each stage (keygen, pair, update)
        waits ``max(first-stage-timeout, stage-timeout)`` (process start-up, imports, data).
    poll_interval : float
        Seconds between two pulls of replies while a stage waits.
    max_inflight : int
        Instructions outstanding at once per stage (0 = all nodes at once); see
        ``server.stages.exchange``. Each one starts a ClientApp process on its SuperNode.
    wait_for_nodes : float
        Seconds to wait for ``min_clients`` nodes to connect before the run fails.
    out_dir : str
        Where ``events.jsonl``, ``metrics.jsonl`` and ``summary.json`` go ("" = no files), and
        the checkpoint the server commits after every round (``<out-dir>/checkpoint/``, see
        :mod:`server.checkpoint`).
    resume : bool
        Continue the run whose checkpoint is in ``out_dir`` (after a server crash) instead of
        starting a new one: the global model, best-validation model, patience counter, metrics
        rows and privacy ledger are restored, and the run goes on with the round after the
        checkpoint (a round in flight at the crash is redone once). Needs ``out_dir``; fails if
        there is no checkpoint or it was written with another configuration.
    checkpoint_patience : int
        Reload the best-validation model if validation accuracy has not improved for this many
        rounds (paper Section V.3 uses 5; 0 = off).
    test_z_digest : bool
        Test only: clients report ``sha256(prefix || z)`` so tests can check a pair's z matched
        (ignored by the mechanisms that do not pair).
    params : Mapping[str, Any]
        The values of the registered mechanisms' parameters (kebab-case key -> value, every
        registered parameter present, in the wire order of :func:`corbin_fl.registry.param_keys`:
        the registered default where the run config does not set it). Set through the run config
        (``{"pbm-trials": 3}``), as ``RunConfig(params={...})`` or with :meth:`replace`
        (``replace(pbm_trials=3)``); :meth:`param` reads one.
    device : str
        ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
    secure_aggregation : bool
        SecAgg+ around the update stage: the server learns only the sum of the clients' symbols
        (``corbin_fl/secure.py``; only mechanisms affine in that sum).
    secagg_neighbours, secagg_threshold : int
        SecAgg+'s ``k`` (even, or ``n - 1``) and Shamir ``t`` (``k/2 < t <= k``); 0 = the
        defaults of :func:`corbin_fl.secagg.graph.choose_parameters`.

    An app's task settings are not here: an app extends this class with its own fields (this
    project's :class:`corbin_fl.app.config.AppConfig`), or names its keys in :meth:`from_flower`.
    """

    KEYS_AFTER: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
    """Where the keys of an extension's fields go in :meth:`to_flower` and :meth:`keys`: key of
    this class -> the extension's keys that follow it (after the mechanisms' parameters when the
    key is :data:`PARAMS_AFTER`). An extension's field not named here comes last."""

    mechanism: str = "corbin"
    num_rounds: int = field(default=3, metadata=RESUMABLE)
    epsilon: float = 1.0
    delta: float = 1e-5
    d: int = 5
    gamma: float = 0.2
    p_x: float = 0.5
    cr_mode: str = "relay"
    global_lr: float = 1.0
    radius_margin: float = 0.0
    min_radius: float = 1e-3
    range_quantile: float = 1.0
    range_mode: str = "update"
    update_radius: float = 0.0
    seed: int = 0
    min_clients: int = field(default=2, metadata=RESUMABLE)
    clients_per_round: int = 0
    stage_timeout: float = field(default=120.0, metadata=EXECUTION)
    first_stage_timeout: float = field(default=300.0, metadata=EXECUTION)
    poll_interval: float = field(default=0.2, metadata=EXECUTION)
    max_inflight: int = field(default=0, metadata=EXECUTION)
    wait_for_nodes: float = field(default=120.0, metadata=EXECUTION)
    out_dir: str = field(default="", metadata=EXECUTION)
    resume: bool = field(default=False, metadata=EXECUTION)
    checkpoint_patience: int = 0
    test_z_digest: bool = field(default=False, metadata=EXECUTION)
    device: str = field(default="auto", metadata=EXECUTION)
    # Secure aggregation (corbin_fl/secure.py): the server learns only the sum of the symbols.
    secure_aggregation: bool = False
    secagg_neighbours: int = 0
    secagg_threshold: int = 0
    params: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, metadata={"role": "params"}
    )

    def __post_init__(self) -> None:
        given = dict(self.params)
        filled = {key: given.pop(key, spec.default) for key, spec in _param_specs().items()}
        object.__setattr__(self, "params", MappingProxyType({**filled, **given}))

    # ------------------------------------------------------------------ construction
    @classmethod
    def _fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """The typed fields (every field but :attr:`params`)."""
        return tuple(f for f in dataclasses.fields(cls) if f.name != "params")

    @classmethod
    def typed_keys(cls) -> tuple[str, ...]:
        """The keys of the typed fields (kebab-case), in field order."""
        return tuple(_kebab(f.name) for f in cls._fields())

    def param(self, key: str) -> Any:
        """The value of the registered parameter ``key`` (kebab-case).

        Raises
        ------
        KeyError
            If no registered mechanism has that parameter.
        """
        return self.params[key]

    @classmethod
    def _ordered(cls, typed: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """``typed`` (kebab-case field keys, in field order) with ``params`` after
        :data:`PARAMS_AFTER` and an extension's keys where :attr:`KEYS_AFTER` puts them: the
        keys' order of every run config so far."""
        placed = {key for keys in cls.KEYS_AFTER.values() for key in keys}
        out: dict[str, Any] = {}
        for key, value in typed.items():
            if key in placed:
                continue
            out[key] = value
            if key == PARAMS_AFTER:
                out.update(params)
            out.update({k: typed[k] for k in cls.KEYS_AFTER.get(key, ()) if k in typed})
        return out

    @classmethod
    def execution_keys(cls) -> frozenset[str]:
        """Keys that cannot change a run's result: where files and data live, timeouts and
        polling, the server's device and batch size, test instrumentation (fields marked
        :data:`EXECUTION`). Two runs that differ only in them are the same run."""
        return frozenset(
            _kebab(f.name) for f in cls._fields() if f.metadata.get("role") == "execution"
        )

    @classmethod
    def resumable_keys(cls) -> frozenset[str]:
        """Keys a resumed run may change: :meth:`execution_keys` plus the run length and the
        smallest cohort (fields marked :data:`RESUMABLE`)."""
        marked = {_kebab(f.name) for f in cls._fields() if f.metadata.get("role") == "resumable"}
        return cls.execution_keys() | marked

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every valid Flower key (kebab-case): the typed fields in field order, the registered
        parameters (:attr:`params`' order) after :data:`PARAMS_AFTER`."""
        return tuple(cls._ordered(dict.fromkeys(cls.typed_keys()), dict.fromkeys(_param_specs())))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The default of every key, kebab-case (the ``pyproject.toml`` table)."""
        return cls().to_flower()

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any], *, app_keys: Iterable[str] = ()) -> Self:
        """Parse and validate Flower's ``context.run_config``.

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Kebab-case keys to TOML scalars (bool, int, float, str). Missing keys take the
            defaults.
        app_keys : Iterable[str]
            Keys of the calling app's own settings: left to the app, neither parsed nor refused
            (a key this class owns stays its own). Every other unknown key is refused.

        Returns
        -------
        RunConfig
            The frozen, validated configuration (of the class it is called on).

        Raises
        ------
        TypeError
            If ``run_config`` is not a mapping or has a non-string key.
        ConfigError
            Listing every unknown key (with a did-you-mean), wrongly typed or out-of-range
            value, and inconsistent combination.
        """
        if not isinstance(run_config, Mapping):
            raise TypeError(f"run_config must be a mapping, got {type(run_config).__name__}")
        fields = {_kebab(f.name): f for f in cls._fields()}
        untyped = _param_specs()
        foreign = frozenset(app_keys)
        errors: dict[str, str] = {}
        values: dict[str, Any] = {}
        params: dict[str, Any] = {}
        for key, raw in run_config.items():
            if not isinstance(key, str):
                raise TypeError(f"run_config keys must be strings, got {key!r:.80}")
            spec = fields.get(key)
            param = untyped.get(key)
            if spec is None and param is None and key in foreign:
                continue
            if spec is None and param is None:
                known = [*fields, *untyped]
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                errors[key] = f"unknown key{hint}"
                continue
            try:
                if spec is not None:
                    values[spec.name] = _coerce(key, raw, type(getattr(cls, spec.name)))
                elif param is not None:
                    params[key] = _coerce(key, raw, param.type)
            except (TypeError, ValueError) as exc:
                errors[key] = str(exc)
        # keys that failed to parse keep their (valid) defaults here
        cls._implied(values)
        cfg = cls(**values, params=MappingProxyType(params))
        for key, why in cfg._check().items():
            errors.setdefault(key, why)
        if errors:
            raise ConfigError(errors)
        return cfg

    def to_flower(self) -> dict[str, Any]:
        """Kebab-case dict of every key (what ``summary.json`` records): the typed fields, with
        :attr:`params` after :data:`PARAMS_AFTER`."""
        typed = {_kebab(f.name): getattr(self, f.name) for f in self._fields()}
        return self._ordered(typed, self.params)

    @classmethod
    def _implied(cls, values: dict[str, Any]) -> None:
        """Hook of an extension: set the field values (snake_case, in place) that the given ones
        imply, before the checks. The protocol has none."""

    def replace(self, **changes: Any) -> Self:
        """Copy with ``changes`` (snake_case field names), validated like :meth:`from_flower`."""
        return type(self).from_flower(
            {**self.to_flower(), **{_kebab(k): v for k, v in changes.items()}}
        )

    def result_config(self) -> dict[str, Any]:
        """The keys that can change this run's result, with their values (kebab-case).

        That is :meth:`to_flower` without :meth:`execution_keys`, and without ``update-radius``
        unless :attr:`quantizes_update` (nothing reads it then). Two runs with the same result
        config on the same number of clients are the same run: the experiments address a run by
        a hash of it.
        """
        skip = self.execution_keys() | (set() if self.quantizes_update else {"update-radius"})
        if not self.secure_aggregation:  # runs without it keep the ids they had before it
            skip |= {"secure-aggregation", "secagg-neighbours", "secagg-threshold"}
        return {k: v for k, v in self.to_flower().items() if k not in skip}

    # ------------------------------------------------------------------ derived views
    @property
    def paired(self) -> bool:
        """Whether the mechanism pairs clients (CorBin-FL / AugCorBin-FL; the registry says)."""
        mech = registry.REGISTRY.get(self.mechanism)
        return mech is not None and mech.pairs

    @property
    def quantizes_update(self) -> bool:
        """Whether clients encode ``w_i - w_g`` in ``[-R, R]`` (``range-mode = "update"``; not
        ``fedcad``, which perturbs the update with its own clip in either mode: the registry's
        ``own_clip``)."""
        mech = registry.REGISTRY.get(self.mechanism)
        return self.range_mode == "update" and not (mech is not None and mech.own_clip)

    # ------------------------------------------------------------------ validation
    def _check(self) -> dict[str, str]:
        """Every bad key -> its reason, by job: the protocol's settings, the app's task
        (:meth:`_app_errors`), the registered mechanisms' parameters, secure aggregation
        (:func:`corbin_fl.secure.config_errors`)."""
        errors = self._protocol_errors()
        errors.update(self._app_errors())
        errors.update(self._mechanism_param_errors())
        for key, why in secure.config_errors(self).items():
            errors.setdefault(key, why)
        return errors

    def _app_errors(self) -> dict[str, str]:
        """Hook of an extension: the errors of the app's own fields (they win over the
        protocol's on the same key). The protocol has none."""
        return {}

    def _protocol_errors(self) -> dict[str, str]:
        """The protocol's own settings: mechanism and modes, privacy budget, common randomness,
        ranges, rounds and cohort, stage timing, checkpoints."""
        errors = validate.reasons(
            ("mechanism", validate.why_one_of(self.mechanism, tuple(registry.REGISTRY))),
            ("cr-mode", validate.why_one_of(self.cr_mode, CR_MODES)),
            ("range-mode", validate.why_one_of(self.range_mode, RANGE_MODES)),
            ("num-rounds", validate.why_at_least(self.num_rounds, 1)),
            ("epsilon", validate.why_positive(self.epsilon)),
            ("delta", validate.why_probability(self.delta)),
            ("d", validate.why_interval(self.d, 1, 16)),
            ("gamma", validate.why_probability(self.gamma, lo_open=False, hi_open=False)),
            ("p-x", validate.why_probability(self.p_x)),
            ("global-lr", validate.why_probability(self.global_lr, hi_open=False)),
            ("radius-margin", validate.why_at_least(self.radius_margin, 0.0)),
            ("min-radius", validate.why_positive(self.min_radius)),
            ("range-quantile", validate.why_interval(self.range_quantile, 0.5, 1.0, lo_open=True)),
            ("update-radius", validate.why_at_least(self.update_radius, 0, note="0 = derived")),
            ("seed", validate.why_at_least(self.seed, 0)),
            ("min-clients", validate.why_at_least(self.min_clients, 1)),
            ("clients-per-round", validate.why_at_least(self.clients_per_round, 0)),
            ("stage-timeout", validate.why_positive(self.stage_timeout)),
            ("first-stage-timeout", validate.why_positive(self.first_stage_timeout)),
            ("poll-interval", validate.why_positive(self.poll_interval)),
            ("max-inflight", validate.why_at_least(self.max_inflight, 0)),
            ("wait-for-nodes", validate.why_at_least(self.wait_for_nodes, 0.0)),
            ("checkpoint-patience", validate.why_at_least(self.checkpoint_patience, 0)),
            ("device", validate.why_one_of(self.device, DEVICES)),
        )
        if self.d == 0:  # no shared randomness: every client quantizes alone
            alone = registry.without_common_randomness()
            errors["d"] += (
                f'; d = 0 (no common randomness) is {alone.title}: mechanism = "{alone.name}"'
            )

        if 0 < self.clients_per_round < self.min_clients:
            errors["clients-per-round"] = (
                f"must be 0 (all) or >= min-clients ({self.min_clients}), "
                f"got {self.clients_per_round}"
            )
        if self.resume and not self.out_dir:
            errors["resume"] = "needs out-dir (the folder that holds the checkpoint)"
        mech = registry.REGISTRY.get(self.mechanism)
        if mech is not None and mech.update_only and self.range_mode != "update":
            errors["range-mode"] = (
                f'{self.mechanism} works on the updates w_i - w_g: set range-mode = "update"'
            )
        return errors

    def _mechanism_param_errors(self) -> dict[str, str]:
        """Every registered mechanism's parameters, checked by their specs (whatever the
        mechanism of this run: an instruction carries them all), and :attr:`params` keys that
        no registered mechanism has."""
        specs = registry.param_specs()
        errors = validate.reasons(
            *((key, spec.problem(self.params[key], self)) for key, spec in specs.items())
        )
        for key in self.params:
            if key not in specs:
                errors[key] = "not a parameter of any registered mechanism"
        return errors


def _param_specs() -> dict[str, registry.Param]:
    """The registered parameters (kebab-case key -> spec), in the wire order of
    :func:`corbin_fl.registry.param_keys`: their values live in :attr:`RunConfig.params`."""
    specs = registry.param_specs()
    return {key: specs[key] for key in registry.param_keys() if key in specs}

"""The node's own privacy policy: what a CorBin-FL instruction may ask of this node.

The server chooses the mechanism and its settings and sends them in every instruction; a
malicious server could ask for a larger epsilon, a mechanism without privacy (``fedavg``, ``cq``),
or send a plain ``FedAvg`` train message that asks for the model in the clear. The node decides
what it accepts, from its own configuration, and refuses the rest with an error reply
(:func:`client.mod.corbin_mod`). Nothing the server sends can loosen the policy.

Where the policy comes from, first match wins, per key:

================================  ==================================  =========================
node config key (``--node-config``)  environment variable            default
================================  ==================================  =========================
``corbin-max-epsilon``            ``CORBIN_MAX_EPSILON``              ``1.0`` (eps_p per parameter)
``corbin-max-delta``              ``CORBIN_MAX_DELTA``                ``1e-5``
``corbin-mechanisms``             ``CORBIN_MECHANISMS``               the mechanisms with local DP
``corbin-max-params``             ``CORBIN_MAX_PARAMS``               ``2**28`` parameters
``corbin-require-secure-          ``CORBIN_REQUIRE_SECURE_            ``false``
aggregation``                     AGGREGATION``
================================  ==================================  =========================

``corbin-require-secure-aggregation = true`` makes the node refuse every instruction of a run
without secure aggregation (``secure-aggregation`` in the instruction's settings), so the server
never sees this node's symbols except inside the SecAgg+ sum (``corbin_fl/secure.py``).

``corbin-mechanisms`` is a comma-separated list of mechanism names, or ``all`` (which also admits
the baselines without privacy: use it only for experiments). The environment is the node
operator's too; it is there for the simulation runtime, whose nodes have no node config of their
own. ``corbin-max-params`` bounds the memory an instruction can make the node spend (exact mode
draws ``d`` bits per parameter before the model arrives).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from corbin_fl import registry
from corbin_fl.config import RunConfig
from corbin_fl.mechanisms.validate import require, why_at_least, why_interval


def private_mechanisms() -> frozenset[str]:
    """Registered mechanisms whose every release is (eps, delta)-LDP against an eavesdropper on
    the uplink (threat model A): the default of ``corbin-mechanisms`` (each entry's
    ``policy_default``: its ``node_default``, else local DP). Not ``fedavg``, ``cq``."""
    return frozenset(name for name, mech in registry.REGISTRY.items() if mech.policy_default)


DEFAULT_MAX_EPSILON: Final[float] = 1.0
DEFAULT_MAX_DELTA: Final[float] = 1e-5
DEFAULT_MAX_PARAMS: Final[int] = 1 << 28

_KEYS: Final[dict[str, str]] = {
    "max_epsilon": "corbin-max-epsilon",
    "max_delta": "corbin-max-delta",
    "mechanisms": "corbin-mechanisms",
    "max_params": "corbin-max-params",
    "require_secure_aggregation": "corbin-require-secure-aggregation",
}


class PolicyError(ValueError):
    """An instruction asks for weaker privacy than the node allows (``str(err)`` says how)."""


@dataclass(frozen=True)
class Policy:
    """What this node accepts.

    Attributes
    ----------
    max_epsilon : float
        Largest per-parameter ``eps_p`` the node releases an update under.
    max_delta : float
        Largest ``delta`` of the mechanisms that have one (gaussian, fedcad).
    mechanisms : frozenset[str]
        Mechanisms the node runs.
    max_params : int
        Largest model (parameters) the node quantizes.
    require_secure_aggregation : bool
        Refuse every run without secure aggregation.
    """

    max_epsilon: float = DEFAULT_MAX_EPSILON
    max_delta: float = DEFAULT_MAX_DELTA
    mechanisms: frozenset[str] = field(default_factory=private_mechanisms)
    max_params: int = DEFAULT_MAX_PARAMS
    require_secure_aggregation: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_epsilon) and self.max_epsilon > 0):
            raise ValueError(
                f"corbin-max-epsilon must be a finite number > 0, got {self.max_epsilon}"
            )
        require("corbin-max-delta", why_interval(self.max_delta, 0, 1, hi_open=True))
        unknown = sorted(self.mechanisms - set(registry.REGISTRY))
        if unknown or not self.mechanisms:
            raise ValueError(
                f"corbin-mechanisms: unknown {unknown}; choose from "
                f"{', '.join(registry.REGISTRY)} or all"
            )
        require("corbin-max-params", why_at_least(self.max_params, 1))

    @classmethod
    def from_node(
        cls, node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> Policy:
        """The policy of this node: node config first, then the environment, then defaults.

        Raises
        ------
        ValueError
            A value that does not parse or is out of range (the node then refuses everything,
            naming the key).
        """
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        for name, key in _KEYS.items():
            if key in node_config:
                raw[name] = node_config[key]
            elif _env_name(key) in env:
                raw[name] = env[_env_name(key)]
        try:
            kwargs: dict[str, Any] = {}
            if "max_epsilon" in raw:
                kwargs["max_epsilon"] = _float(raw["max_epsilon"])
            if "max_delta" in raw:
                kwargs["max_delta"] = _float(raw["max_delta"])
            if "max_params" in raw:
                kwargs["max_params"] = int(_float(raw["max_params"]))
            if "require_secure_aggregation" in raw:
                kwargs["require_secure_aggregation"] = _bool(raw["require_secure_aggregation"])
            if "mechanisms" in raw:
                names = {m.strip() for m in str(raw["mechanisms"]).split(",") if m.strip()}
                kwargs["mechanisms"] = (
                    frozenset(registry.REGISTRY) if names == {"all"} else frozenset(names)
                )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad privacy policy in node config / environment: {exc}") from exc
        return cls(**kwargs)

    def check(self, cfg: RunConfig, num_params: int | None = None) -> None:
        """Refuse an instruction whose mechanism settings are weaker than this policy.

        Raises
        ------
        PolicyError
            Naming what was asked and what the node allows.
        """
        if self.require_secure_aggregation and not cfg.secure_aggregation:
            raise PolicyError(
                "the run has no secure aggregation, and this node requires it "
                "(corbin-require-secure-aggregation = true): the server would see this node's "
                "update itself; to run, set the run's secure-aggregation = true, or the node's "
                f"corbin-require-secure-aggregation = false "
                f"({_where('corbin-require-secure-aggregation')})"
            )
        if cfg.mechanism not in self.mechanisms:
            allowed = ",".join(sorted(self.mechanisms))
            raise PolicyError(
                f"mechanism {cfg.mechanism!r} is not allowed by this node "
                f"(corbin-mechanisms = {allowed}); to run, set the run's mechanism to "
                f"one of these, or add {cfg.mechanism} to the node's corbin-mechanisms "
                f"({_where('corbin-mechanisms')})"
            )
        if registry.get(cfg.mechanism).local_dp and cfg.epsilon > self.max_epsilon:
            raise PolicyError(
                f"epsilon {cfg.epsilon:g} is above this node's corbin-max-epsilon "
                f"{self.max_epsilon:g}; to run, set the run's epsilon <= "
                f"{self.max_epsilon:g}, or the node's corbin-max-epsilon >= {cfg.epsilon:g} "
                f"({_where('corbin-max-epsilon')})"
            )
        if registry.get(cfg.mechanism).has_delta and cfg.delta > self.max_delta:
            raise PolicyError(
                f"delta {cfg.delta:g} is above this node's corbin-max-delta {self.max_delta:g}; "
                f"to run, set the run's delta <= {self.max_delta:g}, or the node's "
                f"corbin-max-delta >= {cfg.delta:g} ({_where('corbin-max-delta')})"
            )
        if num_params is not None and num_params > self.max_params:
            raise PolicyError(
                f"{num_params} parameters is above this node's corbin-max-params "
                f"{self.max_params}; to run, raise the node's corbin-max-params "
                f"({_where('corbin-max-params')})"
            )


def _where(key: str) -> str:
    """Where a node operator sets ``key``: its node config, or the environment variable."""
    return f"node config {key}, or environment {_env_name(key)}"


def _env_name(key: str) -> str:
    return key.upper().replace("-", "_")


def _bool(value: Any) -> bool:
    """A bool from node config (bool) or the environment (``true``/``false``, ``1``/``0``)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r:.40}")


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("expected a number, got a bool")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"expected a finite number, got {value!r}")
    return out

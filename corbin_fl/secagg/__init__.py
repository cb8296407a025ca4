"""Secure aggregation (SecAgg+, Bell et al. 2020; SecAgg, Bonawitz et al. 2017) for integer
vectors, as a self-contained Flower building block on the Message API.

The server learns only the exact sum, modulo ``2^b`` with ``b = ceil(log2(n * levels + 1))``,
of the surviving clients' inputs in ``[0, levels]``. Pure protocol (no Flower): :mod:`.shamir`,
:mod:`.prg`, :mod:`.crypto`, :mod:`.graph`, :mod:`.client`, :mod:`.server`,
:mod:`.simulate`. Flower glue: :mod:`.wire`, :mod:`.mod`, :mod:`.strategy`.
"""

from .client import ClientState, SecAggClient
from .graph import bit_width, choose_parameters, derived_graph, secagg_parameters
from .messages import KeyAdvert, MalformedMessageError, RefusalError, RoundOutcome, SecAggError
from .mod import secagg_mod
from .server import SecAggServer
from .simulate import simulate_round
from .strategy import SecAggPlus, SecAggRound

__all__ = [
    "ClientState",
    "KeyAdvert",
    "MalformedMessageError",
    "RefusalError",
    "RoundOutcome",
    "SecAggClient",
    "SecAggError",
    "SecAggPlus",
    "SecAggRound",
    "SecAggServer",
    "bit_width",
    "choose_parameters",
    "derived_graph",
    "secagg_mod",
    "secagg_parameters",
    "simulate_round",
]

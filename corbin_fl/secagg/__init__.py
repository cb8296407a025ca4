"""Secure aggregation (SecAgg+, Bell et al. 2020; SecAgg, Bonawitz et al. 2017) for integer
vectors, as a self-contained Flower building block on the Message API.

The server learns only the exact sum, modulo ``2^b`` with ``b = ceil(log2(n * levels + 1))``,
of the surviving clients' inputs in ``[0, levels]``. Pure protocol (no Flower): :mod:`.shamir`,
:mod:`.prg`, :mod:`.crypto`, :mod:`.graph`, :mod:`.messages`, :mod:`.client`, :mod:`.server`,
:mod:`.simulate`, :mod:`.adversary`. On Flower: :mod:`.wire` (the records), :mod:`.driver` (the
one server round driver), :mod:`.node` (the one client glue), and the standalone hosts of both,
:mod:`.mod` (``secagg_mod``) and :mod:`.strategy` (``SecAggPlus``). CorBin-FL's composition runs
the same driver and glue (``server/secure_round.py``, ``client/secure_update.py``).
"""

from .client import ClientState, SecAggClient
from .driver import Channel, SecAggDriver
from .graph import bit_width, choose_parameters, derived_graph, secagg_parameters
from .messages import KeyAdvert, MalformedMessageError, RefusalError, RoundOutcome, SecAggError
from .mod import secagg_mod
from .server import SecAggServer
from .simulate import simulate_round
from .strategy import SecAggPlus, SecAggRound

__all__ = [
    "Channel",
    "ClientState",
    "KeyAdvert",
    "MalformedMessageError",
    "RefusalError",
    "RoundOutcome",
    "SecAggClient",
    "SecAggDriver",
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

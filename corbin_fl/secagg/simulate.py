"""One SecAgg+ round between the pure roles in memory (no Flower): for tests and benchmarks.

:func:`simulate_round` drives :class:`~.server.SecAggServer` and one
:class:`~.client.SecAggClient` per input through the four stages, dropping the nodes named in
``drop[stage]`` just before they would answer that stage. It returns the server's
:class:`~.messages.RoundOutcome` and the clients (their state after the round).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .client import SecAggClient
from .messages import ADVERTISE, MASK, SHARE, UNMASK, KeyAdvert, RoundOutcome, SecAggError
from .server import SecAggServer


def answers(
    requests: Mapping[int, Any], call: Callable[[int, Any], Any], skip: set[int]
) -> tuple[dict[int, Any], dict[int, str]]:
    """Each client's reply ``call(u, request)`` but those in ``skip`` (silent); a refusal or a
    bad input becomes the node's failure (as the server sees an error reply)."""
    replies, failures = {}, {}
    for u, req in requests.items():
        if u in skip:
            continue
        try:
            replies[u] = call(u, req)
        except (SecAggError, ValueError) as exc:
            failures[u] = f"error reply: {exc}"
    return replies, failures


def simulate_round(
    inputs: Mapping[int, np.ndarray],
    levels: int,
    *,
    run_id: int = 1,
    server_round: int = 1,
    num_neighbours: int | None = None,
    threshold: int | None = None,
    drop: Mapping[str, set[int]] | None = None,
    clients: dict[int, SecAggClient] | None = None,
    prekeys: Mapping[int, KeyAdvert] | None = None,
    advertise_next: bool = False,
) -> tuple[RoundOutcome, dict[int, SecAggClient]]:
    """Run one round; ``drop[stage]`` nodes do not answer that stage (nor any later one)."""
    drop = drop or {}
    gone: set[int] = set()
    clients = clients if clients is not None else {}
    for u in inputs:
        clients.setdefault(u, SecAggClient(u, run_id))
    server = SecAggServer(
        run_id=run_id,
        server_round=server_round,
        node_ids=list(inputs),
        levels=levels,
        num_neighbours=num_neighbours,
        threshold=threshold,
        prekeys=prekeys,
    )

    def answer(stage: str, requests: Mapping[int, Any], call: Callable) -> tuple[dict, dict]:
        gone.update(drop.get(stage, set()))
        return answers(requests, call, gone)

    def outcome() -> RoundOutcome:
        return RoundOutcome(
            server_round, server.sampled, dropped=dict(server.dropped), abandoned=server.abandoned
        )

    if server.abandoned:
        return outcome(), clients
    if server.stage == ADVERTISE:
        targets = {u: None for u in server.advertise_targets()}
        server.receive_adverts(
            *answer(ADVERTISE, targets, lambda u, _: clients[u].advertise(server_round))
        )
        if server.abandoned:
            return outcome(), clients
    server.receive_shares(
        *answer(SHARE, server.share_requests(), lambda u, r: clients[u].share_keys(r))
    )
    if server.abandoned:
        return outcome(), clients
    server.receive_masked(
        *answer(MASK, server.mask_requests(), lambda u, r: clients[u].mask(r, inputs[u]))
    )
    if server.abandoned:
        return outcome(), clients
    result = server.receive_unmask(
        *answer(UNMASK, server.unmask_requests(advertise_next), lambda u, r: clients[u].unmask(r))
    )
    return result, clients

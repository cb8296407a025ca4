"""The chosen-dropout attack of issue 38, on the old graph and on the derived one.

Before: the neighbour graph was a Harary ring (``k/2`` neighbours each side) on a permutation
drawn from a public generator (the run's seed). At n = 40, k = 16, t = 9 a server that knows it
places 2 colluders and drops 14 chosen clients at the mask stage so that two cuts of ``k/2``
consecutive ring positions (1 colluder + 7 dropped each) split the 24 honest survivors into two
arcs of 12 with no edge between them; every honest survivor has at most one colluding neighbour,
keeps ``t`` holders, and every list it sees is consistent. The server then unmasks each arc's sum.

Now: the graph is a random ``k``-regular graph derived from every participant's keys, which each
client recomputes. The exact search of :mod:`corbin_fl.secagg.adversary` finds no split of the
honest survivors by 14 drops for 2 colluders fixed before the graph in any of the graphs tried
here (a proof for each graph), while it finds the ring's at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from corbin_fl.secagg import client as client_mod
from corbin_fl.secagg import crypto
from corbin_fl.secagg import server as server_mod
from corbin_fl.secagg.adversary import check_split, find_split
from corbin_fl.secagg.client import SecAggClient, pair_mask, pair_sign, self_mask
from corbin_fl.secagg.graph import derived_graph, is_connected
from corbin_fl.secagg.messages import KeyAdvert, RefusalError, UnmaskRequest
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.secagg.shamir import combine_shares

N, K, T, DROPS = 40, 16, 9, 14
IDS = [100 + 7 * i for i in range(N)]
D = 32


def ring_graph(
    ids: list[int], k: int, seed: int = 0
) -> tuple[list[int], dict[int, frozenset[int]]]:
    """The graph before issue 38: a Harary ring on a permutation from a public seed."""
    order = [sorted(ids)[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    half, n = k // 2, len(ids)
    graph = {
        order[i]: frozenset(order[(i + j) % n] for j in range(-half, half + 1) if j)
        for i in range(n)
    }
    return order, graph


def fixed_adverts(ids: list[int], seed: int) -> dict[int, KeyAdvert]:
    """Adverts of X25519 keys from a seeded generator (a reproducible graph for the test)."""
    rng = np.random.default_rng(seed)
    return {u: KeyAdvert(*(crypto.public_of(rng.bytes(32)) for _ in range(2))) for u in sorted(ids)}


def components(graph: dict[int, frozenset[int]], nodes: set[int]) -> list[set[int]]:
    left, out = set(nodes), []
    while left:
        start = min(left)
        seen, todo = {start}, deque([start])
        while todo:
            for v in graph[todo.popleft()] & left:
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        out.append(seen)
        left -= seen
    return sorted(out, key=min)


def use_graph(monkeypatch: pytest.MonkeyPatch, graph: dict[int, frozenset[int]], *, where: Any):
    def fake(run_id: int, rnd: int, k: int, adverts: Any) -> tuple[bytes, dict]:
        return b"public ring", graph

    for module in where:
        monkeypatch.setattr(module, "derived_graph", fake)
        if module is client_mod:
            monkeypatch.setattr(module, "graph_from_seed", lambda *a: graph)


def test_the_old_public_ring_gives_the_server_two_12_client_partial_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's scenario, played through the protocol with the old graph (every client's
    checks pass: the colluders keep the survivors' graph connected); the adversary unmasks
    both arcs' sums. The exact search finds this split too (it is not vacuous)."""
    order, ring = ring_graph(IDS, K)
    use_graph(monkeypatch, ring, where=(server_mod, client_mod))
    colluders = {order[0], order[20]}
    drops = set(order[1:8]) | set(order[21:28])
    rng = np.random.default_rng(38)
    x = {u: rng.integers(0, 2, size=D) for u in IDS}
    clients = {u: SecAggClient(u, 1) for u in IDS}
    srv = SecAggServer(
        run_id=1, server_round=1, node_ids=IDS, levels=1, num_neighbours=K, threshold=T
    )
    srv.receive_adverts({u: clients[u].advertise(1) for u in srv.advertise_targets()})
    srv.receive_shares({u: clients[u].share_keys(r) for u, r in srv.share_requests().items()})
    keys_of = {c: clients[c].state.s_private for c in colluders}  # what the colluders give away
    masked = {u: clients[u].mask(r, x[u]) for u, r in srv.mask_requests().items() if u not in drops}
    srv.receive_masked(masked)
    assert srv.abandoned is None and len(srv.survivors) == 26
    honest = set(srv.survivors) - colluders
    assert max(len(ring[u] & colluders) for u in honest) == 1
    replies = {w: clients[w].unmask(r) for w, r in srv.unmask_requests().items()}
    out = srv.receive_unmask(replies)
    assert np.array_equal(out.total, sum(x[u] for u in srv.survivors))
    # the adversary: every survivor's self-mask seed, every dropped node's mask key (t shares)
    seeds = {
        u: combine_shares(
            {w: r.self_mask_shares[u] for w, r in replies.items() if u in r.self_mask_shares}, T, 32
        )
        for u in srv.survivors
    }
    keys_of.update(
        {
            v: combine_shares(
                {w: r.key_shares[v] for w, r in replies.items() if v in r.key_shares}, T, 32
            )
            for v in drops
        }
    )
    bits, mod = srv.config.bits, np.uint64((1 << srv.config.bits) - 1)
    parts = components(ring, honest)
    assert sorted(map(len, parts)) == [12, 12]
    for part in parts:
        y = np.zeros(D, dtype=np.uint64)
        for u in part:
            y += masked[u].masked - self_mask(seeds[u], D, bits, run_id=1, server_round=1, owner=u)
            for v in ring[u] - part:  # a dropped node or a colluder: its key is known
                m = pair_mask(
                    keys_of[v], srv.keys[u].s_public, D, bits, run_id=1, server_round=1, u=u, v=v
                )
                y = y - m if pair_sign(u, v) > 0 else y + m
        assert np.array_equal(y & mod, sum(x[u] for u in part).astype(np.uint64))
    split = find_split(ring, T, DROPS, colluders=colluders)
    assert split is not None and check_split(ring, split, T, DROPS)


@pytest.mark.parametrize("seed", range(5))
def test_the_derived_graph_has_no_split_for_colluders_fixed_before_it(seed: int) -> None:
    """The same n, k, t, 2 colluders and 14 drops on the graph derived from the round's keys:
    the exact search proves that no choice of drops splits the honest survivors."""
    adverts = fixed_adverts(IDS, seed)
    _, graph = derived_graph(1, 1, K, adverts)
    assert find_split(graph, T, DROPS, colluders=set(IDS[:2])) is None
    assert is_connected(graph, IDS)


def test_clients_refuse_a_graph_that_is_not_the_derived_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that still draws the public ring (or any graph but the derived one): every
    client refuses its share request, and the round is abandoned before any secret is shared."""
    _, ring = ring_graph(IDS, K)
    use_graph(monkeypatch, ring, where=(server_mod,))
    clients = {u: SecAggClient(u, 1) for u in IDS}
    srv = SecAggServer(
        run_id=1, server_round=1, node_ids=IDS, levels=1, num_neighbours=K, threshold=T
    )
    srv.receive_adverts({u: clients[u].advertise(1) for u in srv.advertise_targets()})
    for u, req in srv.share_requests().items():
        with pytest.raises(RefusalError, match="derived from every participant's keys"):
            clients[u].share_keys(req)
        assert clients[u].state.stage == "keyed"


def test_a_client_refuses_to_unmask_a_disconnected_survivor_set() -> None:
    """Drops that split the survivors' graph (told consistently to every client) are refused:
    the server would unmask each part's sum. n = 100, k = 4, t = 3."""
    ids = [10 + i for i in range(100)]
    rng = np.random.default_rng(1)
    x = {u: rng.integers(0, 2, size=8) for u in ids}
    clients = {u: SecAggClient(u, 1) for u in ids}
    srv = SecAggServer(run_id=1, server_round=1, node_ids=ids, levels=1, num_neighbours=4)
    srv.receive_adverts({u: clients[u].advertise(1) for u in srv.advertise_targets()})
    srv.receive_shares({u: clients[u].share_keys(r) for u, r in srv.share_requests().items()})
    srv.receive_masked({u: clients[u].mask(r, x[u]) for u, r in srv.mask_requests().items()})
    w = ids[0]
    near = {w} | set(srv.graph[w])
    far = next(v for v in ids if v not in near and not srv.graph[v] & near)
    told = tuple(sorted(near | {far}))  # w and its neighbours, plus a node with no edge to them
    held = sorted(clients[w].state.held)
    req = UnmaskRequest(1, tuple(held), (), all_survivors=told)
    with pytest.raises(RefusalError, match="disconnected"):
        clients[w].unmask(req)
    assert clients[w].state.stage == "masked"
    clients[w].unmask(srv.unmask_requests()[w])  # the server's own list: connected
    assert clients[w].state.stage == "done"


def test_the_server_abandons_a_round_whose_survivors_graph_is_disconnected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without colluders, drops that split the survivors keep every survivor's ``t`` holders only
    on a graph with dense parts; on such a graph (two 5-cliques joined through node 11, t = 4),
    dropping 11 at the mask stage splits them, and the server abandons before any share is
    revealed (its clients would refuse anyway)."""
    a, b, x = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10], 11
    graph = {u: frozenset(set(a) - {u}) for u in a} | {u: frozenset(set(b) - {u}) for u in b}
    graph = {u: nbrs | ({x} if u in (1, 2, 3, 6, 7, 8) else set()) for u, nbrs in graph.items()}
    graph[x] = frozenset({1, 2, 3, 6, 7, 8})
    use_graph(monkeypatch, graph, where=(server_mod, client_mod))
    ids = [*a, *b, x]
    clients = {u: SecAggClient(u, 1) for u in ids}
    srv = SecAggServer(
        run_id=1, server_round=1, node_ids=ids, levels=1, num_neighbours=6, threshold=4
    )
    srv.receive_adverts({u: clients[u].advertise(1) for u in srv.advertise_targets()})
    srv.receive_shares({u: clients[u].share_keys(r) for u, r in srv.share_requests().items()})
    reqs = srv.mask_requests()
    srv.receive_masked(
        {u: clients[u].mask(reqs[u], np.ones(4, dtype=np.int64)) for u in reqs if u != x}
    )
    assert srv.abandoned is not None and "disconnected" in srv.abandoned
    assert set(srv.survivors) == set(a) | set(b)  # every survivor had t holders: only the split

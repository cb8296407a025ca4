"""The SecAgg+ roles without Flower (corbin_fl.secagg.client / server): exact sums, dropouts at
every stage, abandonment, the honest client's refusals, replays, malformed shares."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from corbin_fl.secagg import crypto
from corbin_fl.secagg.client import CIPHERTEXT_BYTES, ClientState, SecAggClient
from corbin_fl.secagg.graph import secagg_parameters
from corbin_fl.secagg.messages import (
    KeyAdvert,
    MaskReply,
    MaskRequest,
    RefusalError,
    ShareKeysReply,
    UnmaskReply,
    UnmaskRequest,
)
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.secagg.shamir import SHARE_BYTES, combine_shares, decode_share, encode_share
from corbin_fl.secagg.simulate import simulate_round

D = 257


def make_inputs(n: int, levels: int, seed: int, d: int = D) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {100 + 7 * i: rng.integers(0, levels + 1, size=d) for i in range(n)}


def plain_sum(inputs: dict[int, np.ndarray], nodes: tuple[int, ...]) -> np.ndarray:
    return np.sum([inputs[u].astype(np.int64) for u in nodes], axis=0)


class Driver:
    """Step-by-step round with a hook per stage to alter replies (tamper, drop)."""

    def __init__(
        self,
        n: int = 6,
        levels: int = 1,
        k: int | None = None,
        t: int | None = None,
        run_id: int = 7,
        rnd: int = 1,
        seed: int = 0,
    ) -> None:
        self.inputs = make_inputs(n, levels, seed)
        self.clients = {u: SecAggClient(u, run_id) for u in self.inputs}
        self.server = SecAggServer(
            run_id=run_id,
            server_round=rnd,
            node_ids=list(self.inputs),
            levels=levels,
            num_neighbours=k,
            threshold=t,
        )
        self.rnd = rnd

    def advertise(self) -> None:
        self.server.receive_adverts(
            {u: self.clients[u].advertise(self.rnd) for u in self.server.advertise_targets()}
        )

    def share(self, alter=None) -> dict:
        reqs = self.server.share_requests()
        self.share_reqs = reqs
        reps = {u: self.clients[u].share_keys(r) for u, r in reqs.items()}
        if alter:
            alter(reps)
        self.server.receive_shares(reps)
        return reps

    def mask(self, alter=None) -> dict:
        reqs = self.server.mask_requests()
        self.mask_reqs = reqs
        if alter:
            alter(reqs)
        reps, fails = {}, {}
        for u, r in reqs.items():
            try:
                reps[u] = self.clients[u].mask(r, self.inputs[u])
            except RefusalError as exc:
                fails[u] = str(exc)
        self.server.receive_masked(reps, fails)
        return reps

    def unmask(self, alter=None):
        reqs = self.server.unmask_requests()
        reps = {u: self.clients[u].unmask(r) for u, r in reqs.items()}
        if alter:
            alter(reps)
        return self.server.receive_unmask(reps)

    def run(self, **alters):
        self.advertise()
        self.share(alters.get("share"))
        self.mask(alters.get("mask"))
        return self.unmask(alters.get("unmask"))


@pytest.mark.parametrize(
    ("n", "levels", "k"), [(3, 1, None), (8, 1, None), (25, 3, 8), (40, 1, 10)]
)
def test_no_dropout_sum_is_exact(n: int, levels: int, k: int | None) -> None:
    x = make_inputs(n, levels, seed=n)
    out, _ = simulate_round(x, levels, num_neighbours=k)
    assert out.abandoned is None and out.survivors == tuple(sorted(x))
    assert out.total is not None and out.total.dtype == np.int64
    assert np.array_equal(out.total, plain_sum(x, out.survivors))


@pytest.mark.parametrize(
    "drop",
    [
        {"advertise": {100, 121}},
        {"share": {107}},
        {"mask": {100, 135}},  # after sharing, before masking
        {"unmask": {114, 128}},  # after masking, during unmasking
        {"share": {100}, "mask": {142}, "unmask": {107}},
    ],
    ids=["advertise", "share", "before-masking", "during-unmasking", "every-stage"],
)
def test_dropouts_at_every_stage_keep_the_sum_exact(drop: dict[str, set[int]]) -> None:
    x = make_inputs(8, 3, seed=5)
    out, _ = simulate_round(x, 3, drop=drop)
    assert out.abandoned is None, out.abandoned
    gone = set().union(*drop.values())
    expected_survivors = set(x) - gone - drop.get("unmask", set()) | drop.get("unmask", set())
    assert set(out.survivors) == expected_survivors  # unmask-stage dropouts are still summed
    assert np.array_equal(out.total, plain_sum(x, out.survivors))
    assert set(out.faulty) == drop.get("unmask", set())


def test_dropouts_in_a_sparse_graph_with_many_clients() -> None:
    x = make_inputs(40, 1, seed=9)
    ids = sorted(x)
    # k = 10, t = 6: four losses leave every node t holders, whatever the (key-derived) graph
    drop = {"share": {ids[0]}, "mask": {ids[5], ids[9]}, "unmask": {ids[30]}}
    out, _ = simulate_round(x, 1, num_neighbours=10, drop=drop)
    assert out.abandoned is None
    assert np.array_equal(out.total, plain_sum(x, out.survivors))
    assert len(out.survivors) == 40 - 3


@pytest.mark.parametrize(
    ("stage", "count", "reason"),
    [
        ("advertise", 4, "2 client(s) with keys, too few for t = 3"),
        ("share", 4, "share: 0 client(s) left"),
        ("mask", 4, "surviving share holder(s), fewer than t = 3"),
        ("unmask", 3, "could not be recovered from 2 share(s) (t = 3)"),
    ],
)
def test_round_is_abandoned_with_a_reason_when_fewer_than_t_remain(
    stage: str, count: int, reason: str
) -> None:
    """n = 6, k = 5, t = 3: losing ``count`` nodes leaves some secret with fewer than t holders."""
    x = make_inputs(6, 1, seed=1)
    out, _ = simulate_round(x, 1, drop={stage: set(sorted(x)[:count])})
    assert out.total is None
    assert out.abandoned is not None and out.abandoned.startswith(stage)
    assert reason in out.abandoned
    if stage in ("advertise", "share"):
        assert all("fewer than t = 3" in r or "no reply" in r for r in out.dropped.values())


def test_abandoned_before_unmask_reveals_no_share() -> None:
    """Three of six drop after sharing: the server abandons before asking anyone for shares."""
    d = Driver(n=6)
    d.advertise()
    d.share()
    ids = sorted(d.inputs)
    reqs = d.server.mask_requests()
    reps = {u: d.clients[u].mask(r, d.inputs[u]) for u, r in reqs.items() if u in ids[:2]}
    d.server.receive_masked(reps)
    assert d.server.abandoned and "surviving share holder" in d.server.abandoned
    with pytest.raises(Exception, match="abandoned"):
        d.server.unmask_requests()
    assert all(c.state.held for u, c in d.clients.items() if u in ids[:2])  # nothing revealed


def test_client_refuses_a_request_naming_a_node_both_survivor_and_dropped() -> None:
    d = Driver(n=5)
    d.advertise()
    d.share()
    d.mask()
    reqs = d.server.unmask_requests()
    u = sorted(reqs)[0]
    v = reqs[u].survivors[0]
    before = dataclasses.replace(d.clients[u].state)
    evil = UnmaskRequest(reqs[u].server_round, reqs[u].survivors, (*reqs[u].dropped, v))
    with pytest.raises(RefusalError, match="both survivor and dropped"):
        d.clients[u].unmask(evil)
    assert d.clients[u].state == before  # nothing revealed, nothing changed
    # The honest request still works once; a second one (asking the other share) is refused.
    d.clients[u].unmask(reqs[u])
    with pytest.raises(RefusalError, match="replayed or out-of-order"):
        d.clients[u].unmask(UnmaskRequest(reqs[u].server_round, (), (v,)))


def test_client_refuses_too_low_threshold_and_unknown_names() -> None:
    """The share stage's refusals: ``t <= |N|/2`` or ``t < 2``, another run, a participant list
    without this node's own keys, fewer than 3 participants, a reused key, a neighbour set that is
    not the derived graph's."""
    c = SecAggClient(5, 1)
    own = c.advertise(1)
    others = {
        v: KeyAdvert(*(crypto.KeyPair.generate().public for _ in range(2))) for v in (6, 7, 8, 9)
    }
    everyone = {5: own, **others}
    from corbin_fl.secagg.messages import RoundConfig, ShareKeysRequest

    def request(t: int, run: int = 1, parts: dict = everyone, nbrs: tuple = (6, 7, 8, 9)):
        return ShareKeysRequest(RoundConfig(run, 1, 4, 1, t, len(parts) - 1), parts, nbrs)

    with pytest.raises(RefusalError, match="t <="):  # t = 2 of 4: both shares collectable
        c.share_keys(request(2))
    with pytest.raises(RefusalError, match="run"):
        c.share_keys(request(3, run=2))
    with pytest.raises(RefusalError, match="keys it advertised"):  # its own entry substituted
        c.share_keys(request(3, parts={**everyone, 5: others[6]}))
    with pytest.raises(RefusalError, match="keys it advertised"):  # not listed at all
        c.share_keys(request(3, parts=others))
    with pytest.raises(RefusalError, match="reuses"):
        c.share_keys(request(3, parts={**everyone, 10: others[6]}))
    with pytest.raises(RefusalError, match="derived"):  # the server's graph is not the derived one
        c.share_keys(request(3, nbrs=(6, 7, 8)))
    three = {5: own, 6: others[6], 7: others[7]}
    with pytest.raises(RefusalError, match=r"max\(2"):  # t = 1: the share is the secret
        c.share_keys(request(1, parts=three, nbrs=(6, 7)))
    with pytest.raises(RefusalError, match="at least 3"):
        c.share_keys(request(2, parts={5: own, 6: others[6]}, nbrs=(6,)))
    assert c.state.stage == "keyed"
    c.share_keys(request(3))  # the derived graph (complete at n = 5), a valid t
    assert c.state.stage == "shared" and sorted(c.state.neighbours) == [6, 7, 8, 9]


def test_inputs_out_of_range_or_not_integers_are_refused() -> None:
    d = Driver(n=4, levels=3)
    d.advertise()
    d.share()
    reqs = d.server.mask_requests()
    u = sorted(reqs)[0]
    for bad in (np.full(D, 4), np.full(D, -1), np.full(D, 0.5)):
        with pytest.raises(ValueError, match=r"\[0, 3\]|integers"):
            d.clients[u].mask(reqs[u], bad)
    assert d.clients[u].state.stage == "shared"


def test_replays_across_rounds_and_runs_are_refused() -> None:
    """Round 1's instructions replayed in round 2 are refused by stage/round checks; round 1's
    ciphertexts relayed into round 2 (or into another run) fail AES-GCM and drop their sender."""
    x = make_inputs(5, 1, seed=3)
    out1, clients = simulate_round(x, 1, server_round=1, advertise_next=True)
    assert out1.total is not None and set(out1.next_keys) == set(x)
    # Round 2 with the pipelined keys (no advertise stage).
    srv = SecAggServer(
        run_id=1,
        server_round=2,
        node_ids=list(x),
        levels=1,
        prekeys=out1.next_keys,
    )
    assert srv.advertise_targets() == [] and srv.stage == "share"
    reqs = srv.share_requests()
    reps = {u: clients[u].share_keys(r) for u, r in reqs.items()}
    u = sorted(x)[0]
    with pytest.raises(RefusalError, match="round 1"):  # replayed unmask of round 1
        clients[u].unmask(UnmaskRequest(1, (), ()))
    with pytest.raises(RefusalError, match="round 2"):  # the same share instruction twice
        clients[u].share_keys(reqs[u])
    srv.receive_shares(reps)
    mreqs = srv.mask_requests()
    # Replace one ciphertext by one of another round (same pair, round 1): its sender is dropped.
    v = sorted(mreqs[u].ciphertexts)[0]
    old = dict(mreqs[u].ciphertexts)
    old[v] = crypto.encrypt_shares(
        bytes(16 + 2 * SHARE_BYTES),
        c_private=bytes(32),
        peer_c_public=crypto.KeyPair.generate().public,
        run_id=1,
        server_round=1,
        src=v,
        dst=u,
    )
    mreqs[u] = MaskRequest(2, old)
    masked = {w: clients[w].mask(r, x[w]) for w, r in mreqs.items()}
    assert masked[u].rejected == (v,)
    srv.receive_masked(masked)
    assert v in srv.dropped and "rejected by" in srv.dropped[v]
    out2 = srv.receive_unmask({w: clients[w].unmask(r) for w, r in srv.unmask_requests().items()})
    assert out2.survivors == tuple(sorted(set(x) - {v}))
    assert np.array_equal(out2.total, plain_sum(x, out2.survivors))


def test_a_ciphertext_from_another_run_does_not_authenticate() -> None:
    a, b = crypto.KeyPair.generate(), crypto.KeyPair.generate()
    ct = crypto.encrypt_shares(
        b"payload",
        c_private=a.private,
        peer_c_public=b.public,
        run_id=1,
        server_round=3,
        src=10,
        dst=20,
    )
    assert (
        crypto.decrypt_shares(
            ct,
            c_private=b.private,
            peer_c_public=a.public,
            run_id=1,
            server_round=3,
            src=10,
            dst=20,
        )
        == b"payload"
    )
    for change in ({"run_id": 2}, {"server_round": 4}, {"src": 20, "dst": 10}):
        kw = {"run_id": 1, "server_round": 3, "src": 10, "dst": 20, **change}
        with pytest.raises(crypto.DecryptionError):
            crypto.decrypt_shares(ct, c_private=b.private, peer_c_public=a.public, **kw)


def test_a_malformed_share_drops_only_its_sender() -> None:
    d = Driver(n=6, seed=2)
    ids = sorted(d.inputs)
    bad, victim = ids[2], ids[4]

    def corrupt(reps: dict[int, ShareKeysReply]) -> None:
        cts = dict(reps[bad].ciphertexts)
        ct = bytearray(cts[victim])
        ct[-1] ^= 1
        cts[victim] = bytes(ct)
        reps[bad] = ShareKeysReply(cts, reps[bad].commitment)

    out = d.run(share=corrupt)
    assert out.abandoned is None
    assert set(out.dropped) == {bad} and f"rejected by [{victim}]" in out.dropped[bad]
    assert np.array_equal(out.total, plain_sum(d.inputs, out.survivors))


def test_a_wrongly_sized_share_reply_drops_only_its_sender() -> None:
    d = Driver(n=6, seed=2)
    ids = sorted(d.inputs)

    def truncate(reps: dict[int, ShareKeysReply]) -> None:
        cts = {v: c[:-1] for v, c in reps[ids[1]].ciphertexts.items()}
        reps[ids[1]] = ShareKeysReply(cts, reps[ids[1]].commitment)

    out = d.run(share=truncate)
    assert set(out.dropped) == {ids[1]} and "wrong size" in out.dropped[ids[1]]
    assert np.array_equal(out.total, plain_sum(d.inputs, out.survivors))


def test_a_wrong_unmask_share_is_outvoted_and_its_holder_recorded() -> None:
    """n = 7, k = 6, t = 4: a survivor's share of another's seed is wrong; the server finds a
    t-subset whose secret matches the commitment, names the holder faulty, and sums exactly."""
    d = Driver(n=7, seed=4)
    ids = sorted(d.inputs)
    liar = ids[3]

    def lie(reps: dict[int, UnmaskReply]) -> None:
        shares = dict(reps[liar].self_mask_shares)
        owner = sorted(shares)[0]
        x, y = decode_share(shares[owner])
        shares[owner] = encode_share(x, (y + 12345) % (2**521 - 1))
        reps[liar] = UnmaskReply(shares, reps[liar].key_shares, None)

    out = d.run(unmask=lie)
    assert out.abandoned is None and liar in out.faulty and "wrong share" in out.faulty[liar]
    assert np.array_equal(out.total, plain_sum(d.inputs, out.survivors))


def test_malformed_masked_vector_drops_only_its_sender() -> None:
    d = Driver(n=6, levels=1, seed=8)
    d.advertise()
    d.share()
    reqs = d.server.mask_requests()
    reps = {u: d.clients[u].mask(r, d.inputs[u]) for u, r in reqs.items()}
    ids = sorted(reps)
    reps[ids[0]] = MaskReply(reps[ids[0]].masked[:-1])  # wrong length
    reps[ids[1]] = MaskReply(reps[ids[1]].masked | np.uint64(1 << 40))  # above 2^b
    d.server.receive_masked(reps)
    assert set(d.server.dropped) == {ids[0], ids[1]}
    out = d.server.receive_unmask(
        {u: d.clients[u].unmask(r) for u, r in d.server.unmask_requests().items()}
    )
    assert np.array_equal(out.total, plain_sum(d.inputs, out.survivors))


def test_t_minus_1_colluding_neighbours_hold_nothing_about_the_seeds() -> None:
    """The t - 1 shares of u's seed b_u held by colluding neighbours fit every candidate seed
    (a degree t - 1 polynomial through (0, candidate) and them exists), and a t-th share is
    what recovers b_u: below the threshold the transcript carries no information on b_u."""
    d = Driver(n=7, seed=6)
    d.advertise()
    d.share()
    d.mask()
    ids = sorted(d.inputs)
    u = ids[0]
    t = d.server.threshold
    holders = [w for w in ids if u in d.clients[w].state.held]
    colluders = holders[: t - 1]
    from corbin_fl.secagg.shamir import ShamirField

    field = ShamirField()
    pts = [decode_share(d.clients[w].state.held[u][0]) for w in colluders]
    for candidate in (0, 2**255 + 17):
        poly = [(0, candidate), *pts]
        assert all(field.interpolate(poly, x) == y for x, y in pts)
    with_t = {w: d.clients[w].state.held[u][0] for w in holders[:t]}
    seed = combine_shares(with_t, t, 32)
    assert crypto.commitment(seed, 7, 1, u) == d.server._commit[u]


def test_client_state_round_trips_through_a_flat_dict() -> None:
    d = Driver(n=4)
    d.advertise()
    d.share()
    for c in d.clients.values():
        st = c.state
        assert ClientState.from_dict(st.to_dict()) == st
    d.mask()
    for c in d.clients.values():
        assert ClientState.from_dict(c.state.to_dict()) == c.state


def test_ciphertext_size_is_fixed() -> None:
    d = Driver(n=4)
    d.advertise()
    reps = d.share()
    assert {len(c) for r in reps.values() for c in r.ciphertexts.values()} == {CIPHERTEXT_BYTES}


def test_flower_node_ids_span_the_whole_uint64_range() -> None:
    """Flower's node ids are uint64 (a deployment gave 10512304443867784025 > 2^63): a round
    with ids near 2^64, run ids too, sums exactly, with a dropout before unmasking."""
    rng = np.random.default_rng(11)
    ids = [2**64 - 1 - 7 * i for i in range(5)]
    x = {u: rng.integers(0, 2, 50) for u in ids}
    drop = {"unmask": {ids[2]}}
    out, _ = simulate_round(x, 1, run_id=2**64 - 3, drop=drop)
    assert out.abandoned is None
    assert np.array_equal(out.total, sum(x[u] for u in out.survivors))


# ============================================================================ pipelined stages
def _pipelined_next(d: Driver) -> tuple[dict[int, KeyAdvert], SecAggServer]:
    """After round 1's mask: each client's keys of round 2 (advertised while it holds round 1's
    shares) and round 2's server over them."""
    keys = {u: c.advertise(2) for u, c in d.clients.items()}
    nxt = SecAggServer(
        run_id=7,
        server_round=2,
        node_ids=list(d.clients),
        levels=1,
        prekeys=keys,
    )
    return keys, nxt


def test_keys_of_the_next_round_ride_the_mask_stage_and_keep_the_held_shares() -> None:
    """advertise(t+1) at the mask stage keeps round t's shares for its unmask; the unmask then
    makes the kept keys round t+1's (keyed); round t+1's share and a second round sum exactly."""
    d = Driver(n=5)
    d.advertise()
    d.share()
    d.mask()
    held = {u: dict(c.state.held) for u, c in d.clients.items()}
    keys, nxt = _pipelined_next(d)
    for u, c in d.clients.items():
        assert (c.state.server_round, c.state.stage, c.state.held) == (1, "masked", held[u])
        assert c.state.next_round == 2 and ClientState.from_dict(c.state.to_dict()) == c.state
        assert crypto.public_of(c.state.next_s_private) == keys[u].s_public
    out = d.unmask()
    assert out.total is not None
    assert np.array_equal(out.total, plain_sum(d.inputs, out.survivors))
    for u, c in d.clients.items():
        assert (c.state.server_round, c.state.stage, c.state.held) == (2, "keyed", {})
        assert c.own_keys() == keys[u]
    reps = {u: d.clients[u].share_keys(r) for u, r in nxt.share_requests().items()}
    nxt.receive_shares(reps)
    x2 = make_inputs(5, 1, seed=9)
    masked = {u: d.clients[u].mask(r, x2[u]) for u, r in nxt.mask_requests().items()}
    nxt.receive_masked(masked)
    out2 = nxt.receive_unmask({u: d.clients[u].unmask(r) for u, r in nxt.unmask_requests().items()})
    assert np.array_equal(out2.total, plain_sum(x2, out2.survivors))


def test_a_share_of_the_next_round_takes_the_kept_keys_without_an_unmask() -> None:
    """Round 1 abandoned before its unmask: round 2's share request promotes the kept keys (round
    1's held shares are dropped; a late unmask of round 1 is then refused)."""
    d = Driver(n=4)
    d.advertise()
    d.share()
    d.mask()
    _, nxt = _pipelined_next(d)
    reqs = nxt.share_requests()
    for u, c in d.clients.items():
        c.share_keys(reqs[u])
        assert (c.state.server_round, c.state.stage, c.state.next_round) == (2, "shared", 0)
        with pytest.raises(RefusalError, match="round 1"):
            c.unmask(UnmaskRequest(1, (), ()))


def test_a_refused_share_leaves_the_kept_keys_and_round_untouched() -> None:
    d = Driver(n=4)
    d.advertise()
    d.share()
    d.mask()
    _, nxt = _pipelined_next(d)
    u, req = next(iter(nxt.share_requests().items()))
    before = d.clients[u].state
    bad = dataclasses.replace(req, config=dataclasses.replace(req.config, threshold=1))
    with pytest.raises(RefusalError, match="threshold"):
        d.clients[u].share_keys(bad)
    assert d.clients[u].state == before


def test_rekeying_is_allowed_only_before_masking() -> None:
    """advertise of the current round re-keys a node that has not masked (keyed or shared: the
    server re-keys when its pipelined shares do not fit the sample); after masking, it is a
    replay and is refused, as is any past round."""
    d = Driver(n=4)
    d.advertise()
    d.share()
    u = sorted(d.clients)[0]
    c = d.clients[u]
    old = c.own_keys()
    new = c.advertise(1)
    assert new != old and (c.state.stage, c.state.seed, c.state.held) == ("keyed", b"", {})
    d2 = Driver(n=4)
    d2.run()
    for c in d2.clients.values():
        with pytest.raises(RefusalError, match="replay"):
            c.advertise(1)
        with pytest.raises(RefusalError, match="replay"):
            c.advertise(0)
    d3 = Driver(n=4)
    d3.advertise()
    d3.share()
    d3.mask()
    for c in d3.clients.values():
        with pytest.raises(RefusalError, match="replay"):
            c.advertise(1)


def test_default_k_t_are_sized_again_for_the_nodes_left_after_advertise() -> None:
    """n = 20 sampled (k = 19, t = 10); 2 lost at advertise: the graph's 18 nodes get the sizing
    of 18 against the 6 colluders of the 20 sampled (k = 17, t = 9). Given k, t are kept."""
    ids = sorted(make_inputs(20, 1, seed=2))
    for given, expect in (({}, (17, 9)), ({"num_neighbours": 19, "threshold": 10}, (17, 10))):
        clients = {u: SecAggClient(u, 1) for u in ids}
        srv = SecAggServer(run_id=1, server_round=1, node_ids=ids, levels=1, **given)
        assert (srv.k, srv.threshold) == (19, 10)
        srv.receive_adverts({u: clients[u].advertise(1) for u in ids[2:]})
        assert (srv.degree, srv.threshold) == expect and srv.abandoned is None
        params = secagg_parameters(18, corrupt=6)
        if not given:
            assert (params.k, params.t) == expect
        reqs = srv.share_requests()
        assert all(r.config.threshold == expect[1] for r in reqs.values())
        clients[ids[2]].share_keys(reqs[ids[2]])  # the client accepts the resized t

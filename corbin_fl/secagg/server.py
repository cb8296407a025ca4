"""The server role of SecAgg+ as a pure state machine (no Flower).

Sets of clients through a round (Bonawitz et al. 2017 name them U1..U4):

* ``alive`` after ``advertise`` (U1), after ``share`` (U2): nodes whose replies were well
  formed, pruned until every one has at least ``t`` live neighbours (a node with fewer could not
  be unmasked; dropping it before masking reveals nothing).
* ``survivors`` (U3): nodes whose masked input arrived well formed, minus every node reported by
  a receiver for a share ciphertext that did not decrypt (a malformed share drops its sender).
  ``A(w)`` is the set of neighbours ``w`` masked with (relayed to ``w`` and accepted by it).
* Before unmasking, every survivor ``u`` needs ``t`` surviving holders of its shares
  (``{w in U3 : u in A(w)}``), and so does every dropped ``v`` that some survivor masked with;
  otherwise the round is abandoned before any share is revealed.
* ``unmask`` asks each survivor ``w`` for the self-mask shares of ``A(w) & U3`` and the mask-key
  shares of ``A(w) - U3`` (disjoint by construction), then

      sum_{u in U3} x_u = sum_{u in U3} y_u - sum_{u in U3} PRG(b_u)
                          - sum_{v dropped} sum_{w in U3, v in A(w)} sign(w, v) PRG(s_wv)
                          (mod 2^b),

  exact because ``2^b > n * levels``. Each reconstructed ``b_u`` is checked against ``u``'s
  commitment and each ``s_v`` against ``v``'s advertised public key; a wrong share is outvoted
  by trying other ``t``-subsets, and its holder is recorded as faulty. If a secret cannot be
  recovered the round is abandoned with the reason: no partial sum is ever returned.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Final

import numpy as np

from . import crypto
from .client import CIPHERTEXT_BYTES, pair_mask, pair_sign, self_mask
from .graph import (
    COLLUSION,
    MIN_CLIENTS,
    bit_width,
    choose_parameters,
    derived_graph,
    is_connected,
    secagg_parameters,
)
from .messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    KeyAdvert,
    MaskReply,
    MaskRequest,
    RoundConfig,
    RoundOutcome,
    SecAggError,
    ShareKeysReply,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
)
from .shamir import MERSENNE_521, LagrangeBasis, ShamirError, decode_share

logger = logging.getLogger(__name__)

MAX_SUBSETS: Final[int] = 256
"""Most ``t``-subsets of shares tried to recover one secret when some shares are wrong."""

_PRIME: Final[int] = MERSENNE_521


class SecAggServer:
    """One round of SecAgg+ on the server: call the stage methods in order.

    Parameters
    ----------
    run_id, server_round
        Bound into every key derivation and associated data.
    node_ids
        The sampled clients.
    levels
        Inputs are integers in ``[0, levels]``; ``bits = bit_width(len(node_ids), levels)``.
    num_neighbours, threshold
        ``k`` and ``t`` (:func:`graph.choose_parameters`). The graph is drawn once every
        participant's keys are known (:func:`graph.derived_graph`): on the advertised nodes,
        with ``min(k, n' - 1)`` neighbours each for ``n'`` of them.
    prekeys
        Keys the clients advertised for this round in the previous round's unmask replies
        (pipelined); those nodes skip the advertise stage.
    min_survivors
        The round is abandoned when fewer clients remain at any stage.
    """

    def __init__(
        self,
        *,
        run_id: int,
        server_round: int,
        node_ids: list[int] | tuple[int, ...],
        levels: int,
        num_neighbours: int | None = None,
        threshold: int | None = None,
        prekeys: Mapping[int, KeyAdvert] | None = None,
        min_survivors: int = 2,
    ) -> None:
        self.sampled = tuple(sorted(node_ids))
        n = len(self.sampled)
        self.k, t = choose_parameters(n, num_neighbours, threshold)
        self._sized = num_neighbours is None and threshold is None
        """k and t are the defaults: sized again for the nodes left after the advertise stage."""
        self.config = RoundConfig(run_id, server_round, bit_width(n, levels), levels, t)
        self.degree = 0
        """The graph's ``k`` over the participants (0 until every key is known)."""
        self.participants: tuple[int, ...] = ()
        self.graph: dict[int, frozenset[int]] = {}
        self.graph_seed = b""
        self.min_survivors = max(2, min_survivors)
        self.keys: dict[int, KeyAdvert] = {
            u: adv for u, adv in (prekeys or {}).items() if u in set(self.sampled)
        }
        self.alive: set[int] = set(self.sampled)
        self.dropped: dict[int, str] = {}
        self.faulty: dict[int, str] = {}
        self.abandoned: str | None = None
        self.stage = ADVERTISE if self.advertise_targets() else SHARE
        self._view: dict[int, frozenset[int]] = {}
        self._cts: dict[int, Mapping[int, bytes]] = {}
        self._commit: dict[int, bytes] = {}
        self._relay: dict[int, dict[int, bytes]] = {}
        self._masked: dict[int, np.ndarray] = {}
        self._accepted: dict[int, frozenset[int]] = {}
        self.survivors: tuple[int, ...] = ()
        self.length = 0
        self._requests: dict[int, UnmaskRequest] = {}
        self._bases: dict[tuple[int, ...], LagrangeBasis] = {}
        if n < self.min_survivors:
            self._abandon(f"{n} sampled client(s), fewer than the minimum {self.min_survivors}")
        elif self.stage == SHARE:
            self._after_keys()  # every key was pipelined: check them as if just advertised

    # ------------------------------------------------------------------ helpers
    @property
    def threshold(self) -> int:
        return self.config.threshold

    def _abandon(self, reason: str) -> None:
        self.abandoned = reason
        self.stage = "abandoned"
        logger.warning("secagg round %d abandoned: %s", self.config.server_round, reason)

    def _enter(self, stage: str) -> None:
        if self.abandoned is not None:
            raise SecAggError(f"round abandoned: {self.abandoned}")
        if self.stage != stage:
            raise SecAggError(f"expected stage {self.stage}, not {stage}")

    def _drop(self, node: int, stage: str, reason: str) -> None:
        if node in self.alive:
            self.alive.discard(node)
            self.dropped[node] = f"{stage}: {reason}"
            logger.info(
                "secagg round %d: node %d dropped at %s: %s",
                self.config.server_round,
                node,
                stage,
                reason,
            )

    def _prune(self, stage: str, neighbours: Callable[[int], frozenset[int]]) -> None:
        """Drop nodes with fewer than ``t`` live neighbours until none is left (a fixpoint)."""
        changed = True
        while changed:
            changed = False
            for u in sorted(self.alive):
                live = len(neighbours(u) & self.alive)
                if live < self.threshold:
                    self._drop(
                        u, stage, f"{live} live neighbour(s), fewer than t = {self.threshold}"
                    )
                    changed = True
        if len(self.alive) < self.min_survivors:
            self._abandon(
                f"{stage}: {len(self.alive)} client(s) left, fewer than {self.min_survivors}"
            )

    # ------------------------------------------------------------------ stage 0
    def advertise_targets(self) -> list[int]:
        """Sampled nodes that still need an advertise stage (no pipelined keys)."""
        return [u for u in self.sampled if u not in self.keys]

    def receive_adverts(
        self, replies: Mapping[int, KeyAdvert], failures: Mapping[int, str] | None = None
    ) -> None:
        """Keys of the nodes that answered; the rest, or bad or repeated keys, are dropped."""
        self._enter(ADVERTISE)
        for u in self.advertise_targets():
            if u in (failures or {}):
                self._drop(u, ADVERTISE, (failures or {})[u])
            elif u not in replies:
                self._drop(u, ADVERTISE, "no reply")
            else:
                adv = replies[u]
                try:
                    crypto.check_public_key(adv.c_public)
                    crypto.check_public_key(adv.s_public)
                except ValueError as exc:
                    self._drop(u, ADVERTISE, f"bad key: {exc}")
                    continue
                self.keys[u] = adv
        self.stage = SHARE
        self._after_keys()

    def _after_keys(self) -> None:
        count = Counter(
            pk for u in self.alive for pk in (self.keys[u].c_public, self.keys[u].s_public)
        )
        for u in sorted(self.alive):
            adv = self.keys[u]
            if count[adv.c_public] > 1 or count[adv.s_public] > 1 or adv.c_public == adv.s_public:
                self._drop(u, ADVERTISE, "public key also used by another node")
        if self.abandoned is None:
            self._draw_graph()
        if self.abandoned is None:
            self._prune(ADVERTISE, lambda u: self.graph[u])

    def _draw_graph(self) -> None:
        """The neighbour graph over the nodes with keys, derived from all of their keys (every
        client recomputes it from its share request and refuses another)."""
        nodes = sorted(self.alive)
        if self._sized and MIN_CLIENTS <= len(nodes) < len(self.sampled):
            # t against the colluders among the sampled nodes, who may all be among these
            corrupt = math.floor(COLLUSION * len(self.sampled))
            params = secagg_parameters(len(nodes), corrupt=corrupt)
            self.k = params.k
            self.config = replace(self.config, threshold=params.t)
        degree = min(self.k, len(nodes) - 1)
        if len(nodes) < MIN_CLIENTS or self.threshold > degree:
            self._abandon(
                f"{ADVERTISE}: {len(nodes)} client(s) with keys, too few for t = "
                f"{self.threshold} (and at least {MIN_CLIENTS})"
            )
            return
        self.participants, self.degree = tuple(nodes), degree
        self.config = replace(self.config, degree=degree)
        self.graph_seed, self.graph = derived_graph(
            self.config.run_id,
            self.config.server_round,
            degree,
            {u: self.keys[u] for u in nodes},
        )

    # ------------------------------------------------------------------ stage 1
    def share_requests(self) -> dict[int, ShareKeysRequest]:
        """Each live node's request: the round config, every participant's keys (the node
        derives the graph from them) and the neighbour set this server derived."""
        self._enter(SHARE)
        out = {}
        everyone = {v: self.keys[v] for v in self.participants}
        for u in sorted(self.alive):
            view = frozenset(self.graph[u] & self.alive)
            self._view[u] = view
            out[u] = ShareKeysRequest(self.config, everyone, tuple(sorted(view)))
        return out

    def receive_shares(
        self, replies: Mapping[int, ShareKeysReply], failures: Mapping[int, str] | None = None
    ) -> None:
        """Keep the nodes that sent exactly one well-sized ciphertext per neighbour."""
        self._enter(SHARE)
        for u in sorted(self.alive):
            if u in (failures or {}):
                self._drop(u, SHARE, (failures or {})[u])
                continue
            rep = replies.get(u)
            if rep is None:
                self._drop(u, SHARE, "no reply")
                continue
            if set(rep.ciphertexts) != set(self._view[u]):
                self._drop(u, SHARE, "ciphertexts not addressed to exactly its neighbours")
            elif any(
                not isinstance(c, bytes) or len(c) != CIPHERTEXT_BYTES
                for c in rep.ciphertexts.values()
            ):
                self._drop(u, SHARE, "ciphertext of the wrong size")
            elif not isinstance(rep.commitment, bytes) or len(rep.commitment) != 32:
                self._drop(u, SHARE, "bad commitment")
            else:
                self._cts[u] = dict(rep.ciphertexts)
                self._commit[u] = rep.commitment
        self.stage = MASK
        self._prune(SHARE, lambda u: self._view[u])

    def serves(self, nodes: Iterable[int]) -> bool:
        """Whether this server, its share stage done a round ahead (pipelined), can run its
        round over ``nodes`` (that round's sample): it is at ``mask``, was drawn over a superset
        of them, and every secret the unmask would need (a sampled node's self-mask seed, the
        mask key of an unsampled node that a sampled one masks with) has ``t`` sampled
        holders; otherwise the round would be abandoned even if every node answered."""
        sample = set(nodes)
        if self.abandoned is not None or self.stage != MASK or not sample <= set(self.sampled):
            return False
        live = sample & self.alive
        if len(live) < self.min_survivors or not is_connected(self.graph, live):
            return False
        for u in self.alive:
            holders = len(self.graph[u] & live)
            if holders < self.threshold and (u in live or holders > 0):
                return False
        return True

    # ------------------------------------------------------------------ stage 2
    def mask_requests(self) -> dict[int, MaskRequest]:
        """Relay to each live node the ciphertexts its live neighbours addressed to it."""
        self._enter(MASK)
        out = {}
        for u in sorted(self.alive):
            relay = {v: self._cts[v][u] for v in sorted(self._view[u] & self.alive)}
            self._relay[u] = relay
            out[u] = MaskRequest(self.config.server_round, relay)
        return out

    def receive_masked(
        self, replies: Mapping[int, MaskReply], failures: Mapping[int, str] | None = None
    ) -> None:
        """Masked inputs: keep well-formed ones, drop senders of rejected shares, pre-check."""
        self._enter(MASK)
        bits = self.config.bits
        lengths = Counter(
            r.masked.size
            for u, r in replies.items()
            if u in self._relay and isinstance(r.masked, np.ndarray) and r.masked.ndim == 1
        )
        length = max(lengths, key=lambda n: (lengths[n], -n)) if lengths else 0
        rejected_by: dict[int, list[int]] = {}
        for u in sorted(self.alive):
            if u in (failures or {}):
                self._drop(u, MASK, (failures or {})[u])
                continue
            rep = replies.get(u)
            if rep is None:
                self._drop(u, MASK, "no reply")
                continue
            y = rep.masked
            if (
                not isinstance(y, np.ndarray)
                or y.ndim != 1
                or y.size != length
                or y.dtype != np.uint64
                or (y.size and int(y.max()) >> bits)
            ):
                self._drop(u, MASK, f"masked vector is not {length} values below 2^{bits}")
                continue
            rej = set(rep.rejected)
            if not rej <= set(self._relay[u]):
                self._drop(u, MASK, "reports ciphertexts it was not sent")
                continue
            self._masked[u] = y
            self._accepted[u] = frozenset(set(self._relay[u]) - rej)
            for v in rej:
                rejected_by.setdefault(v, []).append(u)
        for v, by in sorted(rejected_by.items()):
            self._drop(v, MASK, f"its share ciphertext was rejected by {sorted(by)}")
        for u in list(self._masked):
            if u not in self.alive:
                del self._masked[u], self._accepted[u]
        self.survivors = tuple(sorted(self.alive))
        self.length = length
        self.stage = UNMASK
        if len(self.survivors) < self.min_survivors:
            self._abandon(
                f"{MASK}: {len(self.survivors)} masked input(s), fewer than {self.min_survivors}"
            )
            return
        for owner, holders in sorted(self._holders().items()):
            if len(holders) < self.threshold:
                kind = "self-mask seed" if owner in self.alive else "mask key"
                self._abandon(
                    f"{MASK}: node {owner}'s {kind} has {len(holders)} surviving share "
                    f"holder(s), fewer than t = {self.threshold}"
                )
                return
        if not is_connected(self.graph, self.survivors):
            self._abandon(
                f"{MASK}: the survivors' neighbour graph is disconnected; its parts' sums would "
                "be unmasked separately, and every client refuses that"
            )

    def _holders(self) -> dict[int, list[int]]:
        """Owner -> surviving holders of its shares, for every secret the unmask needs."""
        out: dict[int, list[int]] = {u: [] for u in self.survivors}
        for w in self.survivors:
            for v in self._accepted[w]:
                out.setdefault(v, []).append(w)
        return out

    # ------------------------------------------------------------------ stage 3
    def unmask_requests(self, advertise_next: bool = False) -> dict[int, UnmaskRequest]:
        """Each survivor ``w``: survivors ``A(w) & U3`` and dropped ``A(w) - U3``."""
        self._enter(UNMASK)
        out = {}
        surv = set(self.survivors)
        for w in self.survivors:
            acc = self._accepted[w]
            out[w] = UnmaskRequest(
                self.config.server_round,
                tuple(sorted(acc & surv)),
                tuple(sorted(acc - surv)),
                advertise_next,
                self.survivors,
            )
        self._requests = out
        return out

    def receive_unmask(
        self, replies: Mapping[int, UnmaskReply], failures: Mapping[int, str] | None = None
    ) -> RoundOutcome:
        """Reconstruct the secrets and return the exact sum, or abandon with the reason."""
        self._enter(UNMASK)
        cfg = self.config
        points: dict[int, dict[int, int]] = {}  # owner -> holder -> y
        next_keys: dict[int, KeyAdvert] = {}
        for w in self.survivors:
            if w in (failures or {}):
                self.faulty[w] = f"{UNMASK}: {(failures or {})[w]}"
                continue
            rep = replies.get(w)
            if rep is None:
                self.faulty[w] = f"{UNMASK}: no reply"
                continue
            req = self._requests[w]
            if set(rep.self_mask_shares) != set(req.survivors) or set(rep.key_shares) != set(
                req.dropped
            ):
                self.faulty[w] = f"{UNMASK}: shares for other nodes than asked"
                continue
            try:
                decoded = {
                    v: decode_share(s)
                    for v, s in [*rep.self_mask_shares.items(), *rep.key_shares.items()]
                }
            except ShamirError as exc:
                self.faulty[w] = f"{UNMASK}: malformed share: {exc}"
                continue
            if any(x != w for x, _ in decoded.values()):
                self.faulty[w] = f"{UNMASK}: share not at its own x"
                continue
            for v, (_, y) in decoded.items():
                points.setdefault(v, {})[w] = y
            if rep.next_keys is not None:
                try:
                    crypto.check_public_key(rep.next_keys.c_public)
                    crypto.check_public_key(rep.next_keys.s_public)
                    next_keys[w] = rep.next_keys
                except ValueError:
                    pass
        outcome = RoundOutcome(
            cfg.server_round,
            self.sampled,
            dropped=dict(self.dropped),
            survivors=self.survivors,
            next_keys=next_keys,
        )
        seeds: dict[int, bytes] = {}
        for owner in sorted(self._holders()):
            is_survivor = owner in set(self.survivors)

            def verify(secret: bytes, owner: int = owner, is_survivor: bool = is_survivor) -> bool:
                if is_survivor:
                    return (
                        crypto.commitment(secret, cfg.run_id, cfg.server_round, owner)
                        == self._commit[owner]
                    )
                try:
                    return crypto.public_of(secret) == self.keys[owner].s_public
                except ValueError:
                    return False

            secret, bad = self._recover(points.get(owner, {}), verify)
            for w in bad:
                self.faulty.setdefault(w, f"{UNMASK}: wrong share for node {owner}")
            if secret is None:
                kind = "self-mask seed" if is_survivor else "mask key"
                self._abandon(
                    f"{UNMASK}: node {owner}'s {kind} could not be recovered from "
                    f"{len(points.get(owner, {}))} share(s) (t = {self.threshold})"
                )
                outcome.abandoned = self.abandoned
                outcome.faulty = dict(self.faulty)
                return outcome
            seeds[owner] = secret
        total = self._unmask_sum(seeds)
        self.stage = "done"
        outcome.total = total.astype(np.int64)
        outcome.faulty = dict(self.faulty)
        return outcome

    def _recover(
        self, pts: Mapping[int, int], verify: Callable[[bytes], bool]
    ) -> tuple[bytes | None, list[int]]:
        t = self.threshold
        holders = sorted(pts)
        if len(holders) < t:
            return None, []
        for subset in itertools.islice(itertools.combinations(holders, t), MAX_SUBSETS):
            # One basis per holder set (owners whose first t holders coincide share it, as in
            # the complete graph): its denominators are inverted once, so reading the secret at
            # 0 and checking each other holder's share cost no modular inverse. Same values as
            # ShamirField.interpolate (holders are distinct non-zero ids, y below p: decoded).
            basis = self._bases.get(subset)
            if basis is None:
                basis = self._bases[subset] = LagrangeBasis(_PRIME, subset, checked=True)
            ys = [pts[x] for x in subset]
            value = basis.evaluate(ys, 0)
            if value >= 2**256:
                continue
            secret = value.to_bytes(32, "big")
            if verify(secret):
                chosen = set(subset)
                bad = [x for x in holders if x not in chosen and basis.evaluate(ys, x) != pts[x]]
                return secret, bad
        return None, []

    def _unmask_sum(self, seeds: Mapping[int, bytes]) -> np.ndarray:
        cfg, n = self.config, self.length
        surv = set(self.survivors)
        total = np.zeros(n, dtype=np.uint64)
        for u in self.survivors:
            total += self._masked[u]
            total -= self_mask(
                seeds[u], n, cfg.bits, run_id=cfg.run_id, server_round=cfg.server_round, owner=u
            )
        for v, s_private in seeds.items():
            if v in surv:
                continue
            for w in self.survivors:
                if v in self._accepted[w]:
                    m = pair_mask(
                        s_private,
                        self.keys[w].s_public,
                        n,
                        cfg.bits,
                        run_id=cfg.run_id,
                        server_round=cfg.server_round,
                        u=w,
                        v=v,
                    )
                    # w added sign(w, v) * m: take it back, in place (no temporary vector).
                    if pair_sign(w, v) > 0:
                        total -= m
                    else:
                        total += m
        total &= np.uint64((1 << cfg.bits) - 1)
        return total

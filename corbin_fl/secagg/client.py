"""The client role of SecAgg+ as a pure state machine (no Flower).

One :class:`SecAggClient` per node and run; its :class:`ClientState` is plain data (ints, bytes,
lists) so the Flower mod keeps it in ``context.state`` between messages. Each stage method
validates the instruction first and commits the new state only at its end: a refused or
malformed instruction raises and leaves the state as it was (nothing half-applied).

Masked input (Bonawitz et al. 2017, eq. in "MaskedInputCollection"; Bell et al. 2020 over the
neighbour set ``A(u)``, the neighbours whose share ciphertexts ``u`` accepted):

    y_u = x_u + PRG(b_u) + sum_{v in A(u)} sign(u, v) PRG(s_uv)   (mod 2^b),
    sign(u, v) = +1 if u < v else -1,

with ``s_uv = X25519(s_u, s_v^pk)`` and every PRG bound to (run, round, purpose, parties) by
:func:`prg.mask`. The pairwise terms cancel in the sum over survivors; the server removes the
self masks of survivors and the pairwise masks towards dropped neighbours from Shamir shares.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import crypto, prg
from .graph import MIN_CLIENTS, derived_graph, graph_from_seed, is_connected
from .messages import (
    KeyAdvert,
    MalformedMessageError,
    MaskReply,
    MaskRequest,
    RefusalError,
    ShareKeysReply,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
)
from .shamir import SHARE_BYTES, ShamirError, decode_share, split_secret

logger = logging.getLogger(__name__)

SEED_BYTES = 32
PLAINTEXT_BYTES = 16 + 2 * SHARE_BYTES
"""A share plaintext: sender (8 bytes), receiver (8 bytes), ``b``-share, ``s``-share."""
CIPHERTEXT_BYTES = crypto.NONCE_BYTES + PLAINTEXT_BYTES + crypto.TAG_BYTES

IDLE, KEYED, SHARED, MASKED, DONE = "idle", "keyed", "shared", "masked", "done"


def pair_sign(u: int, v: int) -> int:
    """``+1`` if ``u < v`` else ``-1``: ``u`` adds ``PRG(s_uv)``, ``v`` subtracts it."""
    return 1 if u < v else -1


def pair_mask(
    s_private: bytes,
    peer_s_public: bytes,
    length: int,
    bits: int,
    *,
    run_id: int,
    server_round: int,
    u: int,
    v: int,
) -> np.ndarray:
    """``PRG(s_uv)`` for the pair ``{u, v}`` (same value from either side)."""
    seed = crypto.agree(s_private, peer_s_public)
    return prg.mask(
        seed,
        length,
        bits,
        run_id=run_id,
        server_round=server_round,
        purpose=prg.PAIR_MASK,
        parties=(min(u, v), max(u, v)),
    )


def self_mask(
    seed: bytes, length: int, bits: int, *, run_id: int, server_round: int, owner: int
) -> np.ndarray:
    """``PRG(b_u)``."""
    return prg.mask(
        seed,
        length,
        bits,
        run_id=run_id,
        server_round=server_round,
        purpose=prg.SELF_MASK,
        parties=(owner,),
    )


@dataclass
class ClientState:
    """Everything a client keeps between the stages of a round (private keys included)."""

    run_id: int
    node_id: int
    server_round: int = 0
    stage: str = IDLE
    c_private: bytes = b""
    s_private: bytes = b""
    bits: int = 0
    levels: int = 0
    threshold: int = 0
    seed: bytes = b""
    neighbours: dict[int, KeyAdvert] = field(default_factory=dict)
    held: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    """Owner -> (its ``b``-share, its ``s``-share) held by this client."""
    next_round: int = 0
    """A later round whose keys this node advertised while its current round awaited its
    unmask (pipelined, :meth:`SecAggClient.advertise`); 0 when none."""
    next_c_private: bytes = b""
    next_s_private: bytes = b""
    graph_ids: list[int] = field(default_factory=list)
    """The round's participants (the graph's nodes), kept from the share stage to the unmask."""
    graph_seed: bytes = b""
    degree: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of ints, strs, bytes and lists of one type (fits a Flower ConfigRecord)."""
        nbrs = sorted(self.neighbours)
        held = sorted(self.held)
        return {
            "run-id": self.run_id,
            "node-id": self.node_id,
            "round": self.server_round,
            "stage": self.stage,
            "c-private": self.c_private,
            "s-private": self.s_private,
            "bits": self.bits,
            "levels": self.levels,
            "threshold": self.threshold,
            "seed": self.seed,
            "nbr-ids": nbrs,
            "nbr-c": [self.neighbours[v].c_public for v in nbrs],
            "nbr-s": [self.neighbours[v].s_public for v in nbrs],
            "held-ids": held,
            "held-b": [self.held[v][0] for v in held],
            "held-s": [self.held[v][1] for v in held],
            "next-round": self.next_round,
            "next-c-private": self.next_c_private,
            "next-s-private": self.next_s_private,
            "graph-ids": list(self.graph_ids),
            "graph-seed": self.graph_seed,
            "degree": self.degree,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClientState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            run_id=int(d["run-id"]),
            node_id=int(d["node-id"]),
            server_round=int(d["round"]),
            stage=str(d["stage"]),
            c_private=bytes(d["c-private"]),
            s_private=bytes(d["s-private"]),
            bits=int(d["bits"]),
            levels=int(d["levels"]),
            threshold=int(d["threshold"]),
            seed=bytes(d["seed"]),
            neighbours={
                int(v): KeyAdvert(bytes(c), bytes(s))
                for v, c, s in zip(d["nbr-ids"], d["nbr-c"], d["nbr-s"], strict=True)
            },
            held={
                int(v): (bytes(b), bytes(s))
                for v, b, s in zip(d["held-ids"], d["held-b"], d["held-s"], strict=True)
            },
            next_round=int(d.get("next-round", 0)),
            next_c_private=bytes(d.get("next-c-private", b"")),
            next_s_private=bytes(d.get("next-s-private", b"")),
            graph_ids=[int(v) for v in d.get("graph-ids", [])],
            graph_seed=bytes(d.get("graph-seed", b"")),
            degree=int(d.get("degree", 0)),
        )


def _keyed(st: ClientState, server_round: int, c_private: bytes, s_private: bytes) -> ClientState:
    """A fresh state of ``server_round`` at stage ``keyed`` with these private keys."""
    return ClientState(
        run_id=st.run_id,
        node_id=st.node_id,
        server_round=server_round,
        stage=KEYED,
        c_private=c_private,
        s_private=s_private,
    )


def _ids(values: Iterable[object], what: str) -> list[int]:
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 2**64:
            raise MalformedMessageError(f"{what}: node id {v!r} is not in [1, 2^64)")
        out.append(v)
    return out


class SecAggClient:
    """One node's side of SecAgg+ (advertise, share, mask, unmask) over :class:`ClientState`."""

    def __init__(self, node_id: int, run_id: int, state: ClientState | None = None) -> None:
        if state is not None and (state.node_id != node_id or state.run_id != run_id):
            state = None  # another run's (or node's) state: start afresh
        self.state = state or ClientState(run_id=run_id, node_id=node_id)

    @property
    def node_id(self) -> int:
        return self.state.node_id

    # ------------------------------------------------------------------ stage 0
    def advertise(self, server_round: int) -> KeyAdvert:
        """Fresh ``c`` and ``s`` key pairs for ``server_round``; their public halves.

        - A later round while this node's round awaits its unmask (stage ``masked``): the keys
          are kept beside it (pipelined; the round's shares stay held for the unmask) and
          become the state of ``server_round`` at its share instruction or after the unmask.
        - A later round otherwise: a fresh state of ``server_round``.
        - The current round before it masked (``idle``, ``keyed``, ``shared``): re-keyed. A
          shared seed and key that never masked anything protect nothing; the server re-keys
          when its pipelined share stage does not fit the round's sample.
        - A past round, or the current one after masking: refused (replay).
        """
        st = self.state
        if not isinstance(server_round, int) or server_round < 0:
            raise MalformedMessageError(f"bad round {server_round!r}")
        if server_round < st.server_round or (
            server_round == st.server_round and st.stage not in (IDLE, KEYED, SHARED)
        ):
            raise RefusalError(
                f"advertise for round {server_round} refused: round {st.server_round} is at "
                f"stage {st.stage} (replay?)"
            )
        c, s = crypto.KeyPair.generate(), crypto.KeyPair.generate()
        if server_round > st.server_round and st.stage == MASKED:
            self.state = replace(
                st, next_round=server_round, next_c_private=c.private, next_s_private=s.private
            )
        else:
            self.state = _keyed(st, server_round, c.private, s.private)
        return KeyAdvert(c.public, s.public)

    def _promote(self, server_round: int) -> None:
        """Make the keys kept for ``server_round`` (pipelined advertise) the current state;
        the earlier round's held shares are dropped (the server has moved on)."""
        st = self.state
        if st.next_round and st.next_round == server_round > st.server_round:
            self.state = _keyed(st, server_round, st.next_c_private, st.next_s_private)

    def own_keys(self) -> KeyAdvert:
        return KeyAdvert(
            crypto.public_of(self.state.c_private), crypto.public_of(self.state.s_private)
        )

    def expect(self, server_round: int, stage: str, what: str) -> None:
        """Refuse unless this node is at ``stage`` of ``server_round``."""
        st = self.state
        if server_round != st.server_round or st.stage != stage:
            raise RefusalError(
                f"{what} for round {server_round} refused: this node is at round "
                f"{st.server_round}, stage {st.stage} (replayed or out-of-order instruction)"
            )

    # ------------------------------------------------------------------ stage 1
    def share_keys(self, req: ShareKeysRequest) -> ShareKeysReply:
        """Shamir-share ``b_u`` (fresh) and ``s_u``'s private key among the neighbours.

        The neighbours ``N(u)`` are this node's in the graph derived from every participant's
        keys (:func:`.graph.derived_graph`); the request is refused unless it lists this node
        with the keys it advertised, names the same neighbour set, has at least 3 participants
        and ``max(2, |N(u)|/2) < t <= |N(u)|``. ``t``-out-of-``|N(u)|`` shares, holder ``v``
        at ``x = v``; each pair of shares goes to its holder under AES-GCM
        (:func:`crypto.encrypt_shares`).
        """
        cfg = req.config
        before = self.state
        self._promote(cfg.server_round)
        try:
            self.expect(cfg.server_round, KEYED, "share")
            return self._share_keys(req)
        except BaseException:
            self.state = before  # refused: nothing changes
            raise

    def _share_keys(self, req: ShareKeysRequest) -> ShareKeysReply:
        cfg = req.config
        if cfg.run_id != self.state.run_id:
            raise RefusalError(
                f"share for run {cfg.run_id} refused: this is run {self.state.run_id}"
            )
        try:
            prg.check_bits(cfg.bits)
        except ValueError as exc:
            raise MalformedMessageError(str(exc)) from exc
        if not isinstance(cfg.levels, int) or not 1 <= cfg.levels < 2**cfg.bits:
            raise MalformedMessageError(f"levels {cfg.levels!r} does not fit {cfg.bits} bits")
        everyone = _ids(req.participants, "share")
        own = self.own_keys()
        if req.participants.get(self.node_id) != own:
            raise RefusalError(
                "share: the participant list does not give this node the keys it advertised "
                "(substituted or misrouted keys)"
            )
        if len(everyone) < MIN_CLIENTS:
            raise RefusalError(
                f"share: {len(everyone)} participant(s); secure aggregation needs at least "
                f"{MIN_CLIENTS} (with 2, each input is the sum minus the other's)"
            )
        seen: set[bytes] = set()
        for v in everyone:
            adv = req.participants[v]
            for pk in (adv.c_public, adv.s_public):
                try:
                    crypto.check_public_key(pk)
                except ValueError as exc:
                    raise MalformedMessageError(f"share: participant {v}'s key: {exc}") from exc
                if pk in seen:
                    raise RefusalError(f"share: participant {v} reuses a public key")
                seen.add(pk)
        try:
            graph_seed, graph = derived_graph(
                cfg.run_id, cfg.server_round, cfg.degree, req.participants
            )
        except (ValueError, RuntimeError) as exc:
            raise RefusalError(
                f"share: no neighbour graph of degree {cfg.degree!r}: {exc}"
            ) from exc
        nbrs = sorted(graph[self.node_id])
        if _ids(req.neighbours, "share") != nbrs:
            raise RefusalError(
                f"share: the server names neighbours {sorted(req.neighbours)[:8]}..., not this "
                f"node's in the graph derived from every participant's keys ({nbrs[:8]}...)"
            )
        t = cfg.threshold
        # t > |N|/2 holds for every honest server (|N| <= k < 2t); a lower t would let the
        # server collect both shares of a client from disjoint sets of holders; t = 1 would
        # make each share the secret itself.
        if not isinstance(t, int) or not 2 <= t <= len(nbrs) or 2 * t <= len(nbrs):
            raise RefusalError(
                f"share: threshold {t!r} with {len(nbrs)} neighbour(s) is not "
                "max(2, |N|/2) < t <= |N|"
            )
        seed = secrets.token_bytes(SEED_BYTES)
        b_shares = split_secret(seed, t, sorted(nbrs))
        s_shares = split_secret(self.state.s_private, t, sorted(nbrs))
        cts = {}
        for v in sorted(nbrs):
            plain = (
                self.node_id.to_bytes(8, "big") + v.to_bytes(8, "big") + b_shares[v] + s_shares[v]
            )
            cts[v] = crypto.encrypt_shares(
                plain,
                c_private=self.state.c_private,
                peer_c_public=req.participants[v].c_public,
                run_id=cfg.run_id,
                server_round=cfg.server_round,
                src=self.node_id,
                dst=v,
            )
        commit = crypto.commitment(seed, cfg.run_id, cfg.server_round, self.node_id)
        self.state = replace(
            self.state,
            stage=SHARED,
            bits=cfg.bits,
            levels=cfg.levels,
            threshold=t,
            seed=seed,
            neighbours={v: req.participants[v] for v in nbrs},
            graph_ids=sorted(everyone),
            graph_seed=graph_seed,
            degree=cfg.degree,
        )
        return ShareKeysReply(cts, commit)

    # ------------------------------------------------------------------ stage 2
    def check_input(self, x: np.ndarray) -> np.ndarray:
        """``x`` as a 1-D uint64 vector if it is integer-valued in ``[0, levels]``, else raise."""
        arr = np.asarray(x)
        if arr.dtype.kind not in "biu":
            raise ValueError(f"secure aggregation sums integers; got dtype {arr.dtype}")
        arr = arr.reshape(-1)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > self.state.levels):
            raise ValueError(
                f"inputs must lie in [0, {self.state.levels}]; got [{int(arr.min())}, "
                f"{int(arr.max())}]"
            )
        return arr.astype(np.uint64)

    def mask(self, req: MaskRequest, x: np.ndarray) -> MaskReply:
        """``y_u`` over the neighbours whose ciphertexts decrypt; the others are reported."""
        self.expect(req.server_round, SHARED, "mask")
        st = self.state
        srcs = _ids(req.ciphertexts, "mask")
        unknown = sorted(set(srcs) - set(st.neighbours))
        if unknown:
            raise MalformedMessageError(f"mask: ciphertexts from non-neighbours {unknown}")
        values = self.check_input(x)
        held: dict[int, tuple[bytes, bytes]] = {}
        rejected: list[int] = []
        for v in sorted(srcs):
            try:
                plain = crypto.decrypt_shares(
                    req.ciphertexts[v],
                    c_private=st.c_private,
                    peer_c_public=st.neighbours[v].c_public,
                    run_id=st.run_id,
                    server_round=st.server_round,
                    src=v,
                    dst=self.node_id,
                )
                if len(plain) != PLAINTEXT_BYTES:
                    raise ValueError("wrong plaintext length")
                if (int.from_bytes(plain[:8], "big"), int.from_bytes(plain[8:16], "big")) != (
                    v,
                    self.node_id,
                ):
                    raise ValueError("plaintext names another sender or receiver")
                b_share = plain[16 : 16 + SHARE_BYTES]
                s_share = plain[16 + SHARE_BYTES :]
                for share in (b_share, s_share):
                    if decode_share(share)[0] != self.node_id:
                        raise ValueError("share is not at this node's x")
            except (crypto.DecryptionError, ValueError, ShamirError) as exc:
                logger.info("node %d: share ciphertext from %d rejected: %s", self.node_id, v, exc)
                rejected.append(v)
                continue
            held[v] = (b_share, s_share)
        if len(held) < st.threshold:
            raise RefusalError(
                f"mask: only {len(held)} neighbour(s) to mask with, fewer than t = {st.threshold}"
            )
        n, bits = values.size, st.bits
        y = values + self_mask(
            st.seed, n, bits, run_id=st.run_id, server_round=st.server_round, owner=self.node_id
        )
        for v in sorted(held):
            m = pair_mask(
                st.s_private,
                st.neighbours[v].s_public,
                n,
                bits,
                run_id=st.run_id,
                server_round=st.server_round,
                u=self.node_id,
                v=v,
            )
            y = y + m if pair_sign(self.node_id, v) > 0 else y - m
        y &= np.uint64((1 << bits) - 1)
        # The seed and private keys are no longer needed here: the neighbours hold their shares.
        self.state = replace(
            st,
            stage=MASKED,
            held=held,
            seed=b"",
            c_private=b"",
            s_private=b"",
            neighbours={},
            next_round=0,
            next_c_private=b"",
            next_s_private=b"",
        )
        return MaskReply(y, tuple(rejected))

    # ------------------------------------------------------------------ stage 3
    def unmask(self, req: UnmaskRequest) -> UnmaskReply:
        """Self-mask shares of survivors, mask-key shares of the dropped; never both for one.

        Refused unless the neighbours named survivors and dropped are exactly this node's
        accepted neighbours in and out of the round's survivor list, and the survivors' subgraph
        of the derived graph is connected: a server that splits the survivors by chosen drops
        into parts with no edge between them could otherwise unmask each part's sum.
        """
        self.expect(req.server_round, MASKED, "unmask")
        st = self.state
        surv = _ids(req.survivors, "unmask")
        drop = _ids(req.dropped, "unmask")
        both = sorted(set(surv) & set(drop))
        if both:
            raise RefusalError(
                f"unmask refused: node(s) {both} named both survivor and dropped; both shares "
                "would let the server remove every mask of their input"
            )
        if len(set(surv)) != len(surv) or len(set(drop)) != len(drop):
            raise MalformedMessageError("unmask: a node is named twice")
        unknown = sorted((set(surv) | set(drop)) - set(st.held))
        if unknown:
            raise RefusalError(f"unmask: this node holds no shares of {unknown}")
        everyone = _ids(req.all_survivors, "unmask")
        survivors = set(everyone)
        if self.node_id not in survivors or not survivors <= set(st.graph_ids):
            raise RefusalError(
                "unmask: the survivor list omits this node or names non-participants"
            )
        if set(surv) != set(st.held) & survivors or set(drop) != set(st.held) - survivors:
            raise RefusalError(
                "unmask: the neighbours named survivors and dropped do not match the round's "
                "survivor list"
            )
        graph = graph_from_seed(st.graph_seed, st.graph_ids, st.degree)
        if not is_connected(graph, survivors):
            raise RefusalError(
                f"unmask refused: the {len(survivors)} survivors' neighbour graph is "
                "disconnected, so the server would unmask partial sums"
            )
        if len(surv) + 1 < st.threshold:
            raise RefusalError(
                f"unmask: only {len(surv) + 1} survivor(s) named with this node, fewer than "
                f"t = {st.threshold}"
            )
        reply_b = {v: st.held[v][0] for v in surv}
        reply_s = {v: st.held[v][1] for v in drop}
        next_keys = None
        self.state = replace(st, stage=DONE, held={})
        if req.advertise_next:
            next_keys = self.advertise(st.server_round + 1)
        else:  # keys advertised with the mask reply, if any, are the next round's state now
            self._promote(st.next_round)
        return UnmaskReply(reply_b, reply_s, next_keys)


__all__ = ["CIPHERTEXT_BYTES", "ClientState", "SecAggClient", "pair_mask", "pair_sign", "self_mask"]

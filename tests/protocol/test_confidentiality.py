"""Confidentiality, tested by capture.

1. Node authentication (real processes, TLS + ``--enable-supernode-auth``, certificates and keys
   from ``docker/certs/make-certs.sh``, like the compose TLS loopback test): a registered node
   is let in; a node whose key was never registered, a node without an authentication key and a
   node without TLS are refused, and the SuperLink names the refused key.
2. Pair blobs (in process, the real ClientApp and ServerApp code): a third node, with its own
   key of the round, cannot open a blob meant for another node, whatever partner it claims; the
   intended partner can; and the server routes each blob to the sender's partner only.
3. What the server keeps: its log (every record, DEBUG included, of full protocol runs in the
   three common-randomness modes) and its output folder (events, metrics, summary, and every
   other file there, checkpoints included) never hold a seed, a private key, a pair key, the
   bits of ``z`` or a role: the exact bytes every client used are searched for raw, in hex, in
   base64 and as Python ``repr``; role words are searched for next to node ids.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message

# In-process harness: Flower task identity, tiny model and stub training (autouse fixtures).
from harness import RUN_ID, InProcessGrid, make_cfg, runtime
from wire_helpers import is_stage, run_plain_round

import corbin_fl.mechanisms.pairing
from corbin_fl import wire
from corbin_fl.app import client_app, server_app
from corbin_fl.app import train as client_train
from corbin_fl.app.config import AppConfig
from corbin_fl.client import encode, handlers, pair_crypto
from corbin_fl.config import APP_LOGGERS


@pytest.fixture(autouse=True)
def _no_client_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub training ignores the data: skip loading the node's partition."""
    monkeypatch.setattr(client_train, "local_dataset", lambda *args, **kwargs: None)


# ============================================================================ 2. pair blobs
class KeySpy:
    """Records every X25519 key pair the clients generate (public key -> private key)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.private_of: dict[bytes, bytes] = {}
        real = handlers.generate_keypair

        def spy() -> tuple[bytes, bytes]:
            sk, pk = real()
            self.private_of[pk] = sk
            return sk, pk

        monkeypatch.setattr(handlers, "generate_keypair", spy)


def test_a_third_node_cannot_open_another_pairs_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = InProcessGrid(make_cfg(num_rounds=1, cr_mode="relay"), 6)
    keys = KeySpy(monkeypatch)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    state = run_plain_round(rt, 1)
    assert len(state.pairs) == 3 and not state.dropped
    assert {m[wire.M_PAIRED] for m in state.client_metrics.values()} == {1.0}

    round_key = {nid: keys.private_of[pk] for nid, pk in state.pubkeys.items()}
    blobs = {
        m.metadata.src_node_id: m.content.config_records[wire.PAIR_REC][wire.BLOB]
        for m in grid.received
        if is_stage(m, wire.PAIR)
    }
    assert set(blobs) == set(state.partner)
    attempts = 0
    for sender, blob in blobs.items():
        partner = state.partner[sender]
        # The intended partner opens it (the check below can succeed).
        own = pair_crypto.PairContext(RUN_ID, 1, partner, sender)
        key = pair_crypto.derive_pair_key(round_key[partner], state.pubkeys[sender], own)
        y, seed = pair_crypto.open_blob(key, blob, own, wire.SEED_BYTES)
        assert y in (0, 1) and len(seed) == wire.SEED_BYTES
        # Every other node, with its own key of the round, fails whatever pair it claims.
        for third in state.pubkeys:
            if third in (sender, partner):
                continue
            for claimed_self, claimed_peer_key in (
                (third, state.pubkeys[sender]),  # "I am third, sender is my partner"
                (partner, state.pubkeys[sender]),  # "I am the partner" (wrong private key)
                (third, state.pubkeys[partner]),  # key agreement with the recipient instead
            ):
                ctx = pair_crypto.PairContext(RUN_ID, 1, claimed_self, sender)
                wrong = pair_crypto.derive_pair_key(round_key[third], claimed_peer_key, ctx)
                with pytest.raises(pair_crypto.BlobAuthError):
                    pair_crypto.open_blob(wrong, blob, ctx, wire.SEED_BYTES)
                attempts += 1
    assert attempts == 6 * 4 * 3

    # The server routed each blob to its sender's partner, and to nobody else.
    delivered: dict[bytes, list[int]] = {}
    for msg in grid.sent:
        if not is_stage(msg, wire.UPDATE):
            continue
        cfg_rec = msg.content.config_records[wire.CFG]
        if wire.PARTNER_BLOB in cfg_rec:
            blob = cfg_rec[wire.PARTNER_BLOB]
            assert isinstance(blob, bytes)
            delivered.setdefault(blob, []).append(msg.metadata.dst_node_id)
    assert {blob: nodes for blob, nodes in delivered.items()} == {
        blob: [state.partner[sender]] for sender, blob in blobs.items()
    }
    for msg in grid.sent:  # a pair instruction names the partner's public key only
        if is_stage(msg, wire.PAIR):
            rec = msg.content.config_records[wire.CFG]
            partner = state.partner[msg.metadata.dst_node_id]
            assert rec[wire.PARTNER] == partner
            assert rec[wire.PARTNER_PUBKEY] == state.pubkeys[partner]


def test_a_third_node_cannot_open_another_pairs_pipelined_blob(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The blobs for round 2 ride with round 1's update replies: sealed under the round-1 keys,
    bound to round 2; only the round-2 partner opens one, and the server relays each to it
    alone."""
    grid = InProcessGrid(make_cfg(num_rounds=2, cr_mode="relay"), 6)
    keys = KeySpy(monkeypatch)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    first = run_plain_round(rt, 1)
    round_key = {nid: keys.private_of[pk] for nid, pk in first.pubkeys.items()}
    blobs = {
        m.metadata.src_node_id: m.content.config_records[wire.REPLY][wire.NEXT_BLOB]
        for m in grid.received
        if is_stage(m, wire.UPDATE)
    }
    assert set(blobs) == set(first.next_partner) == set(grid.node_ids)
    for sender, blob in blobs.items():
        assert isinstance(blob, bytes)
        partner = first.next_partner[sender]
        own = pair_crypto.PairContext(RUN_ID, 2, partner, sender)
        key = pair_crypto.derive_pair_key(round_key[partner], first.pubkeys[sender], own)
        assert pair_crypto.open_blob(key, blob, own, wire.SEED_BYTES)[0] in (0, 1)
        for wrong_round in (1, 3):  # the same keys, another round: refused
            ctx = pair_crypto.PairContext(RUN_ID, wrong_round, partner, sender)
            wrong = pair_crypto.derive_pair_key(round_key[partner], first.pubkeys[sender], ctx)
            with pytest.raises(pair_crypto.BlobAuthError):
                pair_crypto.open_blob(wrong, blob, ctx, wire.SEED_BYTES)
        for third in set(grid.node_ids) - {sender, partner}:
            ctx = pair_crypto.PairContext(RUN_ID, 2, third, sender)
            wrong = pair_crypto.derive_pair_key(round_key[third], first.pubkeys[sender], ctx)
            with pytest.raises(pair_crypto.BlobAuthError):
                pair_crypto.open_blob(wrong, blob, ctx, wire.SEED_BYTES)
    second = run_plain_round(rt, 2)
    assert second.round_trips == 1 and second.carried_pairs == 3
    delivered = {
        msg.content.config_records[wire.CFG][wire.PARTNER_BLOB]: msg.metadata.dst_node_id
        for msg in grid.sent
        if is_stage(msg, wire.UPDATE) and msg.metadata.group_id == "2"
    }
    assert delivered == {blob: first.next_partner[sender] for sender, blob in blobs.items()}


# ============================================================================ 3. logs, files
ROLE_WORDS = re.compile(r"\b(lead|leads|leader|follow|follower|is-lead|role|q1|q2)\b", re.I)


class SecretSpy:
    """Captures every secret the clients use: private keys, pair keys, seeds (relay), derived
    seeds, exact-mode ``z`` bits, the expanded ``z`` of every pair, and each node's role."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.secrets: dict[str, list[bytes]] = {}
        self.roles: dict[int, list[bool]] = {}

        def keep(kind: str, value: bytes) -> bytes:
            self.secrets.setdefault(kind, []).append(bytes(value))
            return value

        real_keypair = handlers.generate_keypair
        real_pair_key = handlers.derive_pair_key
        real_seed = handlers.draw_seed
        real_derived = handlers.derive_randomness
        real_exact = handlers._exact_bits
        real_z = encode.shared_z
        real_lead = corbin_fl.mechanisms.pairing.is_lead

        def keypair() -> tuple[bytes, bytes]:
            sk, pk = real_keypair()
            return keep("private key", sk), pk

        def pair_key(*args: Any) -> bytes:
            return keep("pair key", real_pair_key(*args))

        def seed() -> bytes:
            return keep("seed", real_seed())

        def derived(*args: Any) -> Any:
            out = real_derived(*args)
            keep("derived seed", out.seed)
            return out

        def exact(*args: Any) -> bytes:
            return keep("exact z bits", real_exact(*args))

        def z(cfg: AppConfig, context: Any, rnd: int, shared: Any, *rest: Any) -> torch.Tensor:
            from corbin_fl.mechanisms.randomness import pack_z

            out = real_z(cfg, context, rnd, shared, *rest)
            keep("pair z", pack_z(out, cfg.d))
            return out

        def lead(self_id: int, partner_id: int, y_self: int, y_partner: int) -> bool:
            out = real_lead(self_id, partner_id, y_self, y_partner)
            self.roles.setdefault(int(self_id), []).append(out)
            return out

        monkeypatch.setattr(handlers, "generate_keypair", keypair)
        monkeypatch.setattr(handlers, "derive_pair_key", pair_key)
        monkeypatch.setattr(handlers, "draw_seed", seed)
        monkeypatch.setattr(handlers, "derive_randomness", derived)
        monkeypatch.setattr(handlers, "_exact_bits", exact)
        monkeypatch.setattr(encode, "shared_z", z)
        monkeypatch.setattr(corbin_fl.mechanisms.pairing, "is_lead", lead)


def encodings(secret: bytes) -> list[bytes]:
    """The forms a secret could take in a log line or a file."""
    forms = [
        secret,
        secret.hex().encode(),
        secret.hex().upper().encode(),
        binascii.b2a_base64(secret, newline=False),
        base64.urlsafe_b64encode(secret),
        base64.b64encode(secret).rstrip(b"="),
        base64.urlsafe_b64encode(secret).rstrip(b"="),
        repr(secret).encode()[2:-1],  # b'...' as Python prints it, without the quotes
        # a 16-byte window of each, for truncated prints (e.g. "id 3fa4...")
        secret.hex()[:32].encode(),
    ]
    return forms


def find_secrets(blob: bytes, secrets: dict[str, list[bytes]]) -> list[str]:
    """Which secrets (kind and index) occur in ``blob`` in any of their forms."""
    hits = []
    for kind, values in secrets.items():
        for i, secret in enumerate(values):
            if any(form in blob for form in encodings(secret)):
                hits.append(f"{kind} #{i}")
    return hits


def per_node_role_leaks(obj: Any, nodes: set[int], path: str = "") -> list[str]:
    """Role words in any JSON value that is keyed by, or mentions, a node id."""
    out: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if str(key).isdigit() and int(key) in nodes and ROLE_WORDS.search(json.dumps(value)):
                out.append(f"{path}/{key}: {value}")
            if ROLE_WORDS.fullmatch(str(key)):
                out.append(f"{path}/{key}")
            out += per_node_role_leaks(value, nodes, f"{path}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += per_node_role_leaks(value, nodes, f"{path}[{i}]")
    elif isinstance(obj, str) and mentions_node(obj, nodes) and ROLE_WORDS.search(obj):
        out.append(f"{path}: {obj}")
    return out


def mentions_node(text: str, nodes: set[int]) -> bool:
    return any(re.search(rf"(?<![\d.]){n}(?![\d.])", text) for n in nodes)


def _json_lines(path: Path) -> Iterator[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)
    else:
        yield json.loads(text)


def _log_texts(records: Iterable[logging.LogRecord]) -> list[str]:
    out = []
    for rec in records:
        out.append(rec.getMessage())
        if rec.exc_text:
            out.append(rec.exc_text)
        out.append(repr(rec.args))
    return out


def test_the_secret_search_finds_what_it_looks_for() -> None:
    """The search below can fail: every encoding of a planted secret is found."""
    secret = bytes(range(7, 39))
    for form in encodings(secret):
        assert find_secrets(b"round 3: " + form + b" ...", {"seed": [secret]}) == ["seed #0"]
    assert find_secrets(b"nothing here", {"seed": [secret]}) == []
    nodes = {101, 108}
    assert per_node_role_leaks({"dropped": {"101": "pair: is lead"}}, nodes)
    assert per_node_role_leaks({"x": ["node 108 follows"]}, nodes) == []  # "follows" != word
    assert per_node_role_leaks({"x": ["node 108 is the follower"]}, nodes)
    assert per_node_role_leaks({"role": 1}, nodes)
    assert per_node_role_leaks({"dropped": {"101": "pair: no reply within 3 s"}}, nodes) == []


@pytest.mark.parametrize(("mode", "nodes"), [("relay", 5), ("derived", 4), ("exact", 4)])
def test_server_logs_and_files_hold_no_secret_and_no_role(
    mode: str,
    nodes: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    spy = SecretSpy(monkeypatch)
    out_dir = tmp_path / "out"
    grid = InProcessGrid(
        make_cfg(num_rounds=2, cr_mode=mode, out_dir=str(out_dir), test_z_digest=True), nodes
    )
    # The ClientApp's lifespan sets the app loggers to INFO at every message; in this process
    # the server's loggers are the same objects, so keep them at DEBUG.
    monkeypatch.setattr(client_app, "configure_app_logging", lambda *args, **kwargs: None)
    caplog.set_level(logging.DEBUG)
    for name in APP_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    summary = server_app.run_training(grid, cfg)
    assert summary["participants_per_round"] == [nodes, nodes]

    # The spies saw what the run used (so the search below looks for real secrets).
    pairs = nodes // 2
    assert len(spy.secrets["private key"]) >= 2 * nodes
    assert len(spy.secrets["pair z"]) == 2 * 2 * pairs
    assert sum(len(v) for v in spy.roles.values()) == 2 * 2 * pairs
    assert {role for v in spy.roles.values() for role in v} == {True, False}
    if mode == "relay":
        assert len(spy.secrets["seed"]) == 2 * 2 * pairs
    if mode == "derived":
        assert len(spy.secrets["derived seed"]) == 2 * 2 * pairs
    if mode == "exact":
        assert len(spy.secrets["exact z bits"]) == 2 * 2 * pairs
    if mode != "derived":
        assert len(spy.secrets["pair key"]) == 2 * 2 * pairs

    # Logs: every record of the run, DEBUG included.
    assert any(
        r.levelno == logging.DEBUG and r.name.startswith("corbin_fl.server") for r in caplog.records
    )
    texts = _log_texts(caplog.records)
    leaks = [f"{hit} in log" for t in texts for hit in find_secrets(t.encode(), spy.secrets)]
    node_ids = set(grid.node_ids)
    leaks += [
        f"role in log: {t}" for t in texts if mentions_node(t, node_ids) and ROLE_WORDS.search(t)
    ]
    # Files: everything under out-dir (events, metrics, summary, checkpoints, ...).
    files = sorted(p for p in out_dir.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"events.jsonl", "metrics.jsonl", "summary.json"} <= names
    for path in files:
        data = path.read_bytes()
        leaks += [f"{hit} in {path.name}" for hit in find_secrets(data, spy.secrets)]
        if path.suffix in (".json", ".jsonl"):
            for obj in _json_lines(path):
                leaks += [f"{path.name}{x}" for x in per_node_role_leaks(obj, node_ids)]
        assert wire.M_IS_LEAD.encode() not in data
    assert not leaks, leaks

    # ... and nothing secret crossed the wire either (the server could not have logged it).
    for msg in grid.sent + grid.received:
        for blob in _payloads(msg):
            assert not find_secrets(blob, spy.secrets)


def _payloads(msg: Message) -> list[bytes]:
    if not msg.has_content():
        return [(msg.error.reason or "").encode()]
    out: list[bytes] = []
    for rec in msg.content.values():
        for value in rec.values():
            if isinstance(value, bytes):
                out.append(value)
            elif isinstance(value, str):
                out.append(value.encode())
            elif hasattr(value, "data"):
                out.append(value.data)
    return out

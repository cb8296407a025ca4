"""Mechanism dispatch of the client (imports torch; loaded lazily by ``client/handlers.py``).

:func:`encode_update` is Alg. 3 line 19 for one client: encode the local model ``w_i`` that the
app's train handler produced with the instruction's mechanism:

the encoder its registry entry names (:class:`corbin_fl.registry.Mechanism`), with the encoder
contract of :mod:`corbin_fl.registry`:

- :func:`encode_one_bit`: CorBin-FL's ``corbinq(w, c, r, eps, z, d, lead)`` with the pair's ``z``
  (Alg. 2), LDPQ's ``ldpq(w, c, r, eps)`` (Alg. 1) when unpaired, independent, partner gone or
  blob bad; packed bits;
- :func:`encode_bits`, :func:`encode_values`: any mechanism that releases range block by range
  block, with the ``block_release`` of its module (:mod:`corbin_fl.mechanisms.baselines.hooks`:
  noise, a sign, a clip); packed bits or float32;
- :func:`encode_levels`: a finite-output mechanism's ``b``-bit symbols, packed;
- :func:`encode_symbols`: integer symbols in a wire form of the mechanism's own (its ``pack``);
- :func:`encode_stateful`: a mechanism with a state on the node across rounds (Fed-CAD), kept
  in the node's ``context.state``.

``z = expand_seed(seed, context_label(run, round, a, b), m, d, p_x)``, the same on both sides of a
pair. Local quantization coins come from a ``torch.Generator`` seeded from the OS CSPRNG (the
server must not be able to predict them); only batch order uses the public run seed.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from corbin_fl import registry, wire
from corbin_fl.client.pair_crypto import z_digest
from corbin_fl.client.shared import Fallback, Shared
from corbin_fl.config import RunConfig
from corbin_fl.devices import pick_device
from corbin_fl.layout import ParamLayout, RangeBlock, range_blocks
from corbin_fl.mechanisms.packing import pack_bits, pack_symbols
from corbin_fl.mechanisms.quantizers import corbinq, ldpq
from corbin_fl.mechanisms.randomness import (
    context_label,
    expand_seed,
    pack_z,
    realized_px,
    unpack_z,
)
from corbin_fl.registry import finite_mechanism

logger = logging.getLogger(__name__)

STATE_RECORD = "corbin.{mechanism}"
"""``context.state`` ConfigRecord of a stateful mechanism's numbers (its ``STATE_SCALARS``); its
tensors are the ArrayRecord of the same name plus :data:`ARRAYS_SUFFIX`."""
ARRAYS_SUFFIX = ".arrays"


@dataclass(frozen=True)
class EncodeResult:
    """What the update reply carries."""

    array_key: str
    array: np.ndarray
    metrics: dict[str, float]
    z_digest: bytes | None


def quantization_generator(device: torch.device) -> torch.Generator:
    """A generator for the local coins, seeded from the OS CSPRNG."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63))
    return gen


# ----------------------------------------------------------------------------- main entry
def encode_update(
    cfg: RunConfig,
    context: Context,
    *,
    rnd: int,
    layout: ParamLayout,
    weights: np.ndarray,
    w_global: np.ndarray,
    center: np.ndarray,
    radius: np.ndarray,
    assignment: str,
    shared: Shared | Fallback | None,
    shared_seed: tuple[int, int, int] | None,
) -> EncodeResult:
    """Encode the trained model of one client (Alg. 3 line 19), on the GPU when there is one.

    Parameters
    ----------
    cfg : RunConfig
        The mechanism's settings, from the instruction.
    context : Context
        Node context (a stateful mechanism keeps its state in ``context.state``).
    rnd : int
        Round.
    layout : ParamLayout
        The model's layers (its floating-point arrays) in the flat vector.
    weights : np.ndarray
        The trained local model ``w_i``, float32 ``[m]``.
    w_global : np.ndarray
        The global model of the round ``w_g``, float32 ``[m]``.
    center, radius : np.ndarray
        Per-layer center and radius, float32 ``[L]``; with ``range-mode = "update"`` the range
        of ``w_i - w_g`` (``c = 0``, ``r = R``).
    assignment : str
        The server's assignment (``paired``, ``unpaired``, ...).
    shared : Shared | Fallback | None
        Resolved common randomness, the reason for a fall-back, or None (solo mechanisms).
    shared_seed : tuple[int, int, int] | None
        ``(seed, rank, clients)`` of a mechanism with a server-shared seed, else None.

    Returns
    -------
    EncodeResult
    """
    app_device = context.run_config.get("device", "auto")
    dev = encode_device(cfg.mechanism, app_device if isinstance(app_device, str) else "auto")
    g = torch.from_numpy(w_global).to(dev)
    w = torch.from_numpy(weights).to(dev)
    if cfg.quantizes_update:
        w.sub_(g)  # range-mode "update": encode w_i - w_g in [-R, R] (c = 0, r = R)
    c, r = torch.from_numpy(center), torch.from_numpy(radius)  # per layer: never expanded

    t0 = time.perf_counter()
    key, array, extra, digest = encode(
        cfg,
        context,
        w=w,
        w_global=g,
        c=c,
        r=r,
        layout=layout,
        rnd=rnd,
        assignment=assignment,
        shared=shared,
        shared_seed=shared_seed,
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    metrics: dict[str, float] = {
        wire.M_CLIP_FRACTION: float(clip_fraction(w, c, r, layout)),
        wire.M_ENCODE_SECONDS: float(time.perf_counter() - t0),
        **extra,
    }
    return EncodeResult(array_key=key, array=array, metrics=metrics, z_digest=digest)


def encode_device(mechanism: str, app_device: str = "auto") -> torch.device:
    """Where the update of ``mechanism`` is encoded (the registry's encoder contract).

    ``encode_device = "update"``: the device the app trains on, its run config's ``device``
    where it has one (this project's app), else ``"auto"``: the node's CUDA device when it has
    one, else the CPU (:func:`corbin_fl.devices.pick_device`); so a node told to train on the
    CPU never opens a CUDA context to encode. ``"cpu"``: the CPU.

    Raises
    ------
    ValueError
        ``app_device`` names a device this node does not have.
    """
    if registry.get(mechanism).encode_device == "cpu":
        return torch.device("cpu")
    return pick_device(app_device)


def clip_fraction(
    w: torch.Tensor, c: torch.Tensor, r: torch.Tensor, layout: ParamLayout | None = None
) -> float:
    """Fraction of the entries of ``w`` outside ``[c - r, c + r]`` (clipped by the mechanism)."""
    outside = 0
    for b in range_blocks(c, r, w.numel(), layout):
        part = w[b.lo : b.hi]
        c_b, r_b = _on(b.c, part), _on(b.r, part)
        outside += int(((part < c_b - r_b) | (part > c_b + r_b)).sum())
    return outside / max(w.numel(), 1)


def _on(v: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor | float:
    return v.to(like.device) if isinstance(v, torch.Tensor) else v


def by_block(
    w: torch.Tensor,
    blocks: Sequence[RangeBlock],
    fn: Callable[[slice, torch.Tensor | float, torch.Tensor | float], torch.Tensor],
    dtype: torch.dtype,
) -> torch.Tensor:
    """``out[lo:hi] = fn(slice(lo, hi), c_b, r_b)`` over ``blocks`` (:func:`range_blocks`).

    With per-layer ``c``, ``r`` (and ``layout``) the quantizers see one layer at a time with
    scalar ``c_l``, ``r_l``, so their temporaries are layer-sized and no model-sized ``c`` or
    ``r`` is ever built (client memory stays within 2x the float32 model; see
    ``bench/bench_memory.py``). The math is elementwise, so the result equals one call on the
    expanded per-element ``c``, ``r``.
    """
    out = torch.empty(w.numel(), dtype=dtype, device=w.device)
    for b in blocks:
        out[b.lo : b.hi] = fn(slice(b.lo, b.hi), _on(b.c, w), _on(b.r, w))
    return out


@dataclass
class EncodeInput:
    """What every registered encoder gets (``client.encode.encode`` builds it).

    Attributes
    ----------
    cfg : RunConfig
        The mechanism's settings, from the instruction.
    context : Context
        Node context (a stateful mechanism keeps its state in ``context.state``).
    w : torch.Tensor
        What is quantized: the trained model ``w_i``, or ``w_i - w_g`` in update range mode.
        Every tensor here and ``gen`` are on ``w.device`` (the registry's encoder contract).
    w_global : torch.Tensor
        The round's global model ``w_g``.
    blocks : Sequence[RangeBlock]
        ``w`` cut into blocks with one center and radius each.
    gen : torch.Generator
        The local coins, seeded from the OS CSPRNG.
    rnd : int
        Round.
    shared : Shared | Fallback | None
        The pair's common randomness, the reason for a fall-back, or None.
    shared_seed : tuple[int, int, int] | None
        ``(seed, rank, clients)`` of a mechanism with a server-shared seed, else None.
    flags : dict[str, float]
        The mechanism metrics (``paired``, ``fallback``, ``fallback-code``), filled in place.
    """

    cfg: RunConfig
    context: Context
    w: torch.Tensor
    w_global: torch.Tensor
    blocks: Sequence[RangeBlock]
    gen: torch.Generator
    rnd: int
    shared: Shared | Fallback | None
    shared_seed: tuple[int, int, int] | None
    flags: dict[str, float]


Encoded = tuple[str, np.ndarray, bytes | None]
"""``(array key, numpy array, z digest or None)`` of one encoded update."""


def encode(
    cfg: RunConfig,
    context: Context,
    *,
    w: torch.Tensor,
    w_global: torch.Tensor,
    c: torch.Tensor,
    r: torch.Tensor,
    rnd: int,
    assignment: str,
    shared: Shared | Fallback | None,
    shared_seed: tuple[int, int, int] | None,
    layout: ParamLayout | None = None,
) -> tuple[str, np.ndarray, dict[str, float], bytes | None]:
    """Encode ``w`` with the registered encoder of ``cfg.mechanism`` (:mod:`corbin_fl.registry`).

    ``c`` and ``r`` are per layer (``[L]``, with ``layout``; what the server sends) or per
    element (``[m]``, without ``layout``). ``assignment`` is checked by the caller; the
    encoders see its outcome in ``shared``.

    The registry's encoder contract is kept here: every tensor the encoder gets is on one device,
    ``w``'s device (``encode_device = "update"``) or the CPU (``"cpu"``), and its array comes
    back to the host (a ``torch.Tensor`` is copied there; anything but a numpy array is refused).

    Returns
    -------
    tuple
        ``(array key, numpy array, extra metrics, z digest or None)``.

    Raises
    ------
    TypeError
        If the encoder returns something other than a numpy array or a tensor.
    """
    mech = registry.get(cfg.mechanism)
    dev = torch.device("cpu") if mech.encode_device == "cpu" else w.device
    w, w_global, c, r = (t.to(dev) for t in (w, w_global, c, r))
    flags: dict[str, float] = {wire.M_PAIRED: 0.0, wire.M_FALLBACK: 0.0, wire.M_FALLBACK_CODE: 0.0}
    job = EncodeInput(
        cfg=cfg,
        context=context,
        w=w,
        w_global=w_global,
        blocks=range_blocks(c, r, w.numel(), layout),
        gen=quantization_generator(w.device),
        rnd=rnd,
        shared=shared,
        shared_seed=shared_seed,
        flags=flags,
    )
    key, array, digest = mech.encode_fn()(job)
    if isinstance(array, torch.Tensor):
        array = _np(array)
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"the encoder of {cfg.mechanism!r} returned a {type(array).__name__}, "
            "not a numpy array (corbin_fl.registry: the encoder contract)"
        )
    return key, array, flags, digest


def encode_one_bit(job: EncodeInput) -> Encoded:
    """corbin / augcorbin / ldpfl: CorBinQ with the pair's ``z`` (Alg. 2) when the pair's
    common randomness is resolved, LDPQ (Alg. 1) otherwise; one packed bit per parameter."""
    cfg, w, gen, shared = job.cfg, job.w, job.gen, job.shared
    digest = None
    if isinstance(shared, Shared):
        z = shared_z(cfg, job.context, job.rnd, shared, w.numel(), w.device)
        p_x = realized_px(cfg.p_x)
        lead = shared.lead
        bits = by_block(
            w,
            job.blocks,
            lambda s, c_b, r_b: corbinq(
                w[s], c_b, r_b, cfg.epsilon, z[s], cfg.d, lead, generator=gen, p_x=p_x
            ),
            torch.bool,
        )
        job.flags[wire.M_PAIRED] = 1.0
        if cfg.test_z_digest:
            digest = z_digest(pack_z(z, cfg.d))
        return wire.BITS, pack_bits(bits), digest
    if isinstance(shared, Fallback):
        job.flags[wire.M_FALLBACK_CODE] = float(wire.FALLBACK_REASONS.index(shared.reason))
        if shared.reason not in ("unpaired", "independent"):
            job.flags[wire.M_FALLBACK] = 1.0
            logger.info(
                "node %d, round %d: ldpq fall-back (%s)",
                job.context.node_id,
                job.rnd,
                shared.reason,
            )
    bits = by_block(
        w,
        job.blocks,
        lambda s, c_b, r_b: ldpq(w[s], c_b, r_b, cfg.epsilon, generator=gen),
        torch.bool,
    )
    return wire.BITS, pack_bits(bits), None


def shared_z(
    cfg: RunConfig, context: Context, rnd: int, shared: Shared, m: int, device: torch.device
) -> torch.Tensor:
    """The pair's codewords ``z`` (``m`` integers in ``[0, 2^d)``), identical on both sides."""
    if shared.exact:
        return unpack_z(shared.secret, m, cfg.d, device=device)
    label = context_label(context.run_id, rnd, context.node_id, shared.partner)
    return expand_seed(shared.secret, label, m, cfg.d, p_x=cfg.p_x, device=device)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def encode_bits(job: EncodeInput) -> Encoded:
    """One bit per parameter, range block by range block: the mechanism's registered
    ``block_release`` (:mod:`corbin_fl.mechanisms.baselines.hooks`), packed."""
    bits = by_block(job.w, job.blocks, _block_release(job), torch.bool)
    return wire.BITS, pack_bits(bits), None


def encode_values(job: EncodeInput) -> Encoded:
    """One float32 per parameter, range block by range block: the mechanism's registered
    ``block_release`` (:mod:`corbin_fl.mechanisms.baselines.hooks`)."""
    return wire.VALUES, _np(by_block(job.w, job.blocks, _block_release(job), torch.float32)), None


def _block_release(job: EncodeInput) -> Callable[..., torch.Tensor]:
    hook = registry.get(job.cfg.mechanism).hook("block_release")
    if hook is None:
        raise ValueError(f"{job.cfg.mechanism} registers no block_release for a block encoder")
    release: Callable[..., torch.Tensor] = hook(job)
    return release


def encode_symbols(job: EncodeInput) -> Encoded:
    """Integer symbols in a wire form of the mechanism's own: its registered ``block_release``
    range block by range block (int8), then its ``pack``
    (:mod:`corbin_fl.mechanisms.baselines.hooks`); the array key of its registered wire format."""
    pack = registry.get(job.cfg.mechanism).hook("pack")
    if pack is None:
        raise ValueError(f"{job.cfg.mechanism} registers no pack for encode_symbols")
    t = by_block(job.w, job.blocks, _block_release(job), torch.int8)
    key, _, _ = registry.update_spec(job.cfg, job.w.numel())
    return key, pack(_np(t), job.cfg), None


def encode_levels(job: EncodeInput) -> Encoded:
    """A finite-output mechanism (pbm, rqm, imvu): one ``b``-bit symbol per parameter, packed."""
    mech = finite_mechanism(job.cfg)
    w, gen = job.w, job.gen
    symbols = by_block(
        w, job.blocks, lambda s, c_b, r_b: mech.sample(w[s], c_b, r_b, generator=gen), torch.uint8
    )
    return wire.BITS, pack_symbols(symbols, mech.bits), None


def encode_stateful(job: EncodeInput) -> Encoded:
    """A mechanism with a state on the node across rounds (its registered ``node_state`` and
    ``stateful_release``, :mod:`corbin_fl.mechanisms.baselines.hooks`): the state saved in the
    node's ``context.state`` is restored, advanced by the release and saved again; float32."""
    entry = registry.get(job.cfg.mechanism)
    new, release = entry.hook("node_state"), entry.hook("stateful_release")
    if new is None or release is None:
        raise ValueError(f"{entry.name} registers no node_state / stateful_release hooks")
    name = STATE_RECORD.format(mechanism=entry.name)
    state = _load_state(new(job.cfg), job.context, name)
    out = release(state, job)
    _save_state(state, job.context, name)
    return wire.VALUES, _np(out), None


# ----------------------------------------------------------------------------- node state
def _load_state(state: Any, context: Context, name: str) -> Any:
    """``state`` with what ``context.state`` keeps under ``name`` (unchanged in its first
    round): its ``STATE_SCALARS`` from the ConfigRecord ``name``, its ``STATE_TENSORS`` from the
    ArrayRecord ``name + ".arrays"`` (None where absent)."""
    scalars = context.state.config_records.get(name)
    if scalars is None:
        return state
    loaded: dict[str, Any] = {
        **state.state_dict(),
        **{k: scalars[k] for k in state.STATE_SCALARS},
    }
    tensors = context.state.array_records.get(name + ARRAYS_SUFFIX)
    for key in state.STATE_TENSORS:
        loaded[key] = (
            torch.from_numpy(tensors[key].numpy().copy())
            if tensors is not None and key in tensors
            else None
        )
    state.load_state_dict(loaded)
    return state


def _save_state(state: Any, context: Context, name: str) -> None:
    """Keep ``state``'s ``STATE_SCALARS`` (and its ``STATE_TENSORS`` once it has them) in
    ``context.state`` under ``name``."""
    saved = state.state_dict()
    context.state.config_records[name] = ConfigRecord({k: saved[k] for k in state.STATE_SCALARS})
    if all(saved[k] is not None for k in state.STATE_TENSORS):
        context.state.array_records[name + ARRAYS_SUFFIX] = ArrayRecord(
            {k: wire.to_array(_np(saved[k])) for k in state.STATE_TENSORS}
        )

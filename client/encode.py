"""Local training and mechanism dispatch of the client (imports torch; loaded lazily).

:func:`train_and_encode` is Alg. 3 lines 4 and 19 for one client: load the global model, train on
the local partition, then encode the updated local model ``w_i`` with the run's mechanism:

============  ==========================================================  =====================
mechanism     encoding of the update                                      wire
============  ==========================================================  =====================
corbin        ``corbinq(w, c, r, eps, z, d, lead)`` with the pair's ``z``  packed bits, m
              (Alg. 2); ``ldpq`` when unpaired/partner gone/blob bad
augcorbin     as corbin; the server's gamma-fraction is ``independent``   packed bits, m
ldpfl         ``ldpq(w, c, r, eps)`` (Alg. 1)                             packed bits, m
gaussian      ``clip(w) + N(0, sigma^2)``, analytic sigma for (eps, delta) float32, m
laplace       ``clip(w) + Lap(2r/eps)``                                   float32, m
fedavg        ``w`` (no clip, no privacy)                                 float32, m
cq            correlated quantization with the server's shared seed       packed bits, m
ternary       ternary stochastic compressor (fdp paper Def. 6)            2 bits or int8, m
fedcad        FedCAD noisy update ``w - w_g`` (Fed-CAD Alg. 1)            float32, m
============  ==========================================================  =====================

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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from client.pair_crypto import z_digest
from client.shared import Fallback, Shared
from corbin_fl import wire
from corbin_fl.config import RunConfig

if TYPE_CHECKING:
    from corbin_fl.models import ParamLayout, RangeBlock

logger = logging.getLogger(__name__)

STATE_PARTITION = "corbin.partition"
"""``context.state`` ConfigRecord ``{"key": ...}``: what the cached partition rows were computed for
(dataset, split, partitioner, partition); the rows are the ArrayRecord
:data:`STATE_PARTITION_ROWS` (a RecordDict has one namespace for all record types)."""
STATE_PARTITION_ROWS = "corbin.partition.rows"
STATE_FEDCAD = "corbin.fedcad"
STATE_FEDCAD_ARRAYS = "corbin.fedcad.arrays"
"""``context.state`` ConfigRecord of the FedCAD scalars (round, v, E[Diff]); the tensors
``prev_update`` and ``mu`` are the ArrayRecord :data:`STATE_FEDCAD_ARRAYS`."""


@dataclass(frozen=True)
class EncodeResult:
    """What the update reply carries."""

    array_key: str
    array: np.ndarray
    metrics: dict[str, float]
    z_digest: bytes | None


# ----------------------------------------------------------------------------- local task
class LocalTask:
    """Model skeleton, layout, device and dataset facts of this process (built once).

    In deployment every message starts a new ClientApp process, so the cache only helps within a
    message; in simulation it spares rebuilding the model every round.
    """

    _cache: ClassVar[dict[tuple[Any, ...], LocalTask]] = {}

    def __init__(self, cfg: RunConfig) -> None:
        from corbin_fl.data import dataset_info
        from corbin_fl.models import build_model, layout_of
        from corbin_fl.training import pick_device

        self.device = pick_device(cfg.device)
        self.info = dataset_info(cfg.dataset, cfg.data_dir or None)
        self.model = build_model(
            cfg.model, self.info.in_channels, self.info.num_classes, seed=cfg.seed
        )
        self.layout = layout_of(self.model)

    @classmethod
    def get(cls, cfg: RunConfig) -> LocalTask:
        """The cached task for ``cfg``'s model, dataset and device."""
        key = (cfg.model, cfg.dataset, cfg.data_dir, cfg.device, cfg.seed)
        task = cls._cache.get(key)
        if task is None:
            task = cls._cache[key] = LocalTask(cfg)
        return task


def _train_seed(cfg: RunConfig, partition: int, rnd: int) -> int:
    """Public, reproducible batch-order seed per (run seed, partition, round)."""
    return int(
        np.random.SeedSequence([cfg.seed, partition, rnd]).generate_state(1, np.uint64)[0] >> 1
    )


def quantization_generator(device: torch.device) -> torch.Generator:
    """A generator for the local coins, seeded from the OS CSPRNG."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63))
    return gen


# ----------------------------------------------------------------------------- local data
def local_dataset(cfg: RunConfig, context: Context, pid: int, num: int) -> Any:
    """The node's training partition, with its row indices kept in ``context.state``.

    In deployment every message runs in a fresh ClientApp process; computing the partition
    needs the ``flwr_datasets`` partitioners (Hugging Face ``datasets``, pandas, pyarrow: several
    seconds of imports), so only the first round does it and later rounds reuse the rows.
    """
    from corbin_fl.data import client_rows, dataset_rows

    key = "|".join(
        str(v)
        for v in (
            cfg.dataset,
            cfg.data_dir,
            cfg.data_seed,
            cfg.use_official_test,
            cfg.partitioner,
            cfg.dirichlet_alpha,
            pid,
            num,
        )
    )
    tag = context.state.config_records.get(STATE_PARTITION)
    cached = context.state.array_records.get(STATE_PARTITION_ROWS)
    if tag is not None and cached is not None and tag.get("key") == key and "rows" in cached:
        return dataset_rows(cfg.dataset, cached["rows"].numpy(), data_dir=cfg.data_dir or None)
    rows = client_rows(
        cfg.dataset,
        pid,
        num,
        partitioner=cfg.partitioner,
        dirichlet_alpha=cfg.dirichlet_alpha,
        data_seed=cfg.data_seed,
        data_dir=cfg.data_dir or None,
        use_official_test=cfg.use_official_test,
    )
    context.state.array_records[STATE_PARTITION_ROWS] = ArrayRecord(
        {"rows": wire.to_array(np.ascontiguousarray(rows, dtype=np.int64))}
    )
    context.state.config_records[STATE_PARTITION] = ConfigRecord({"key": key})
    return dataset_rows(cfg.dataset, rows, data_dir=cfg.data_dir or None)


# ----------------------------------------------------------------------------- main entry
def train_and_encode(
    task: LocalTask,
    cfg: RunConfig,
    context: Context,
    *,
    rnd: int,
    partition: tuple[int, int],
    weights: np.ndarray,
    center: np.ndarray,
    radius: np.ndarray,
    assignment: str,
    shared: Shared | Fallback | None,
    cq: tuple[int, int, int] | None,
) -> EncodeResult:
    """Train on the local partition and encode the updated model (Alg. 3 lines 4 and 19).

    Parameters
    ----------
    task : LocalTask
        Model skeleton and device.
    cfg : RunConfig
        Run configuration.
    context : Context
        Node context (FedCAD keeps its state in ``context.state``).
    rnd : int
        Round.
    partition : tuple[int, int]
        ``(partition-id, num-partitions)``.
    weights : np.ndarray
        Global model, float32 ``[m]``.
    center, radius : np.ndarray
        Per-layer center and radius, float32 ``[L]``.
    assignment : str
        The server's assignment (``paired``, ``unpaired``, ...).
    shared : Shared | Fallback | None
        Resolved common randomness, the reason for a fall-back, or None (solo mechanisms).
    cq : tuple[bytes, int, int] | None
        ``(seed, rank, clients)`` of the CQ baseline.

    Returns
    -------
    EncodeResult
    """
    from corbin_fl.models import flatten, load_flat
    from corbin_fl.training import train_local

    dev = task.device
    model = task.model
    w_global = torch.from_numpy(weights).to(dev)
    load_flat(model, w_global)
    pid, num = partition
    data = local_dataset(cfg, context, pid, num)
    trained = train_local(
        model,
        data,
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        seed=_train_seed(cfg, pid, rnd),
        device=dev,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        max_steps=cfg.max_steps or None,
    )
    w = flatten(model).to(dev)
    if cfg.quantizes_update:
        w.sub_(w_global)  # range-mode "update": encode w_i - w_g in [-R, R] (c = 0, r = R)
    c, r = torch.from_numpy(center), torch.from_numpy(radius)  # per layer: never expanded

    t0 = time.perf_counter()
    key, array, extra, digest = encode(
        cfg,
        context,
        w=w,
        w_global=w_global,
        c=c,
        r=r,
        layout=task.layout,
        rnd=rnd,
        assignment=assignment,
        shared=shared,
        cq=cq,
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    encode_seconds = time.perf_counter() - t0
    outside = clip_fraction(w, c, r, task.layout)
    metrics: dict[str, float] = {
        wire.M_TRAIN_LOSS: float(trained.loss),
        wire.M_NUM_EXAMPLES: float(trained.num_examples),
        wire.M_STEPS: float(trained.steps),
        wire.M_TRAIN_SECONDS: float(trained.seconds),
        wire.M_CLIP_FRACTION: float(outside),
        wire.M_ENCODE_SECONDS: float(encode_seconds),
        **extra,
    }
    return EncodeResult(array_key=key, array=array, metrics=metrics, z_digest=digest)


def clip_fraction(
    w: torch.Tensor, c: torch.Tensor, r: torch.Tensor, layout: ParamLayout | None = None
) -> float:
    """Fraction of the entries of ``w`` outside ``[c - r, c + r]`` (clipped by the mechanism)."""
    from corbin_fl.models import range_blocks

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
    cq: tuple[int, int, int] | None,
    layout: ParamLayout | None = None,
) -> tuple[str, np.ndarray, dict[str, float], bytes | None]:
    """Encode the local model ``w`` with ``cfg.mechanism`` (no training; used by tests too).

    ``c`` and ``r`` are per layer (``[L]``, with ``layout``; what the server sends) or per
    element (``[m]``, without ``layout``).

    Returns
    -------
    tuple
        ``(array key, numpy array, extra metrics, z digest or None)``.
    """
    from corbin_fl.models import range_blocks
    from mechanisms.packing import pack_bits
    from mechanisms.quantizers import corbinq, ldpq
    from mechanisms.randomness import realized_px

    mech = cfg.mechanism
    gen = quantization_generator(w.device)
    blocks = range_blocks(c, r, w.numel(), layout)
    flags: dict[str, float] = {wire.M_PAIRED: 0.0, wire.M_FALLBACK: 0.0, wire.M_FALLBACK_CODE: 0.0}
    if mech in ("corbin", "augcorbin", "ldpfl"):
        digest = None
        if isinstance(shared, Shared):
            z = shared_z(cfg, context, rnd, shared, w.numel(), w.device)
            p_x = realized_px(cfg.p_x)
            lead = shared.lead
            bits = by_block(
                w,
                blocks,
                lambda s, c_b, r_b: corbinq(
                    w[s], c_b, r_b, cfg.epsilon, z[s], cfg.d, lead, generator=gen, p_x=p_x
                ),
                torch.bool,
            )
            flags[wire.M_PAIRED] = 1.0
            if cfg.test_z_digest:
                from mechanisms.randomness import pack_z

                digest = z_digest(pack_z(z, cfg.d))
        else:
            if isinstance(shared, Fallback):
                code = wire.FALLBACK_REASONS.index(shared.reason)
                flags[wire.M_FALLBACK_CODE] = float(code)
                if shared.reason not in ("unpaired", "independent"):
                    flags[wire.M_FALLBACK] = 1.0
                    logger.info(
                        "node %d, round %d: ldpq fall-back (%s)",
                        context.node_id,
                        rnd,
                        shared.reason,
                    )
            bits = by_block(
                w,
                blocks,
                lambda s, c_b, r_b: ldpq(w[s], c_b, r_b, cfg.epsilon, generator=gen),
                torch.bool,
            )
        return wire.BITS, pack_bits(bits), flags, digest
    return _encode_baseline(
        cfg, context, w=w, w_global=w_global, blocks=blocks, gen=gen, cq=cq, flags=flags
    )


def shared_z(
    cfg: RunConfig, context: Context, rnd: int, shared: Shared, m: int, device: torch.device
) -> torch.Tensor:
    """The pair's codewords ``z`` (``m`` integers in ``[0, 2^d)``), identical on both sides."""
    from mechanisms.randomness import context_label, expand_seed, unpack_z

    if shared.exact:
        return unpack_z(shared.secret, m, cfg.d, device=device)
    label = context_label(context.run_id, rnd, context.node_id, shared.partner)
    return expand_seed(shared.secret, label, m, cfg.d, p_x=cfg.p_x, device=device)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _encode_baseline(
    cfg: RunConfig,
    context: Context,
    *,
    w: torch.Tensor,
    w_global: torch.Tensor,
    blocks: Sequence[RangeBlock],
    gen: torch.Generator,
    cq: tuple[int, int, int] | None,
    flags: dict[str, float],
) -> tuple[str, np.ndarray, dict[str, float], bytes | None]:
    """The baselines of the paper's Section V (one round trip, no pairing)."""
    from mechanisms.packing import pack_bits

    mech = cfg.mechanism
    if mech == "gaussian":
        from mechanisms.baselines.gaussian import gaussian

        out = by_block(
            w,
            blocks,
            lambda s, c_b, r_b: gaussian(w[s], c_b, r_b, cfg.epsilon, cfg.delta, generator=gen),
            torch.float32,
        )
        return wire.VALUES, _np(out), flags, None
    if mech == "laplace":
        from mechanisms.baselines.laplace import laplace

        out = by_block(
            w,
            blocks,
            lambda s, c_b, r_b: laplace(w[s], c_b, r_b, cfg.epsilon, generator=gen),
            torch.float32,
        )
        return wire.VALUES, _np(out), flags, None
    if mech == "fedavg":
        from mechanisms.baselines.vanilla import vanilla

        return wire.VALUES, _np(vanilla(w)), flags, None
    if mech == "cq":
        from mechanisms.baselines.cq import cq as cq_quantize
        from mechanisms.baselines.cq import cq_shared_randomness

        if cq is None:
            raise ValueError("cq needs the shared seed, rank and client count")
        seed, rank, n = cq
        _, offsets = cq_shared_randomness(seed, n, (w.numel(),), device=w.device)
        bits = by_block(
            w,
            blocks,
            lambda s, c_b, r_b: cq_quantize(
                w[s], c_b, r_b, rank, n, shared_offset=offsets[s], generator=gen
            ),
            torch.bool,
        )
        return wire.BITS, pack_bits(bits), flags, None
    if mech == "ternary":
        from mechanisms.baselines.ternary import ternary

        sparsity = cfg.ternary_sparsity
        t = by_block(
            w,
            blocks,
            lambda s, c_b, r_b: ternary(w[s], c_b, r_b, cfg.epsilon, sparsity, generator=gen),
            torch.int8,
        )
        key, _, _ = wire.ternary_update_spec(w.numel(), cfg.ternary_encoding)
        return key, wire.encode_ternary(_np(t), cfg.ternary_encoding), flags, None
    if mech == "fedcad":
        fed = _load_fedcad(cfg, context)
        noisy = fed.perturb(w - w_global.to(w.device), generator=gen)
        _save_fedcad(fed, context)
        return wire.VALUES, _np(noisy), flags, None
    raise ValueError(f"unknown mechanism {mech!r}")


# ----------------------------------------------------------------------------- FedCAD state
_FEDCAD_SCALARS = ("version", "round", "v", "expected_diff")


def _new_fedcad(cfg: RunConfig) -> Any:
    from mechanisms.baselines.fedcad import FedCAD

    return FedCAD(
        cfg.fedcad_clip,
        cfg.epsilon,
        cfg.delta,
        gamma=cfg.fedcad_gamma,
        sigma_diff=cfg.fedcad_sigma_diff,
        diff_init=cfg.fedcad_diff_init,
        diff_floor=cfg.fedcad_diff_floor,
    )


def _load_fedcad(cfg: RunConfig, context: Context) -> Any:
    """The node's FedCAD object, restored from ``context.state`` (fresh in its first round)."""
    fed = _new_fedcad(cfg)
    scalars = context.state.config_records.get(STATE_FEDCAD)
    if scalars is None:
        return fed
    state: dict[str, Any] = {**fed.state_dict(), **{k: scalars[k] for k in _FEDCAD_SCALARS}}
    tensors = context.state.array_records.get(STATE_FEDCAD_ARRAYS)
    for key in ("prev_update", "mu"):
        state[key] = (
            torch.from_numpy(tensors[key].numpy().copy())
            if tensors is not None and key in tensors
            else None
        )
    fed.load_state_dict(state)
    return fed


def _save_fedcad(fed: Any, context: Context) -> None:
    state = fed.state_dict()
    context.state.config_records[STATE_FEDCAD] = ConfigRecord(
        {k: state[k] for k in _FEDCAD_SCALARS}
    )
    if state["prev_update"] is not None:
        context.state.array_records[STATE_FEDCAD_ARRAYS] = ArrayRecord(
            {k: wire.to_array(_np(state[k])) for k in ("prev_update", "mu")}
        )

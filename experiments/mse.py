"""The quantizer-MSE experiment (paper Appendix F, Experiment 8 and Fig. 4): no federation.

**Grid**: for every eps and every point of a ``G x G`` grid of ``(w1, w2)`` in
``[c - r, c + r]^2``, the pair MSE ``E[(Q1(w1) + Q2(w2) - w1 - w2)^2]`` of CorBinQ (Alg. 2, one
shared codeword) and of two independent LDPQ (Alg. 1), sampled with the real quantizers of
:mod:`mechanisms.quantizers`, next to the closed forms of :mod:`mechanisms.theory`. A point's SE
is ``sqrt(s^2 / N)`` over its ``N`` draws; the grid average's is ``sqrt(sum SE_i^2) / G^2``.
**Real weights**: two clients train one initial CNN on their own IID partitions; their weights
are quantized as a pair with the per-layer range ``c = (max + min) / 2``, ``r = (max - min) / 2``
over both, ``repeats`` times; per layer the per-parameter pair MSE, measured (SE over repeats)
and closed form.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corbin_fl.experiments.results import Stat, write_table
from corbin_fl.experiments.spec import MSESpec, RealWeightsSpec
from corbin_fl.fsio import atomic_write_bytes

logger = logging.getLogger(__name__)

_MAX_CHUNK_ELEMENTS = 2_000_000
"""Elements per sampling chunk (samples x grid points), bounds the memory to ~100 MB."""
_QUANTIZERS = ("corbin", "ldpq")
_ARRAYS = tuple(f"{q}_{part}" for q in _QUANTIZERS for part in ("measured", "se", "closed"))
"""The measured mean, its SE and the closed form of both quantizers (fields, CSV columns)."""


def _device(device: str | torch.device | None) -> torch.device:
    from corbin_fl.devices import pick_device

    return pick_device(device)


@dataclass(frozen=True)
class GridMSE:
    """Measured (samples of all seeds pooled) and closed-form pair MSE, ``[e, i, j]`` at
    ``epsilons[e]``, ``w[i]``, ``w[j]``; ``*_seed_means``: grid averages per seed, ``(S, E)``."""

    w: np.ndarray
    epsilons: tuple[float, ...]
    center: float
    radius: float
    d: int
    samples_per_seed: int
    seeds: tuple[int, ...]
    corbin_measured: np.ndarray
    corbin_se: np.ndarray
    corbin_closed: np.ndarray
    ldpq_measured: np.ndarray
    ldpq_se: np.ndarray
    ldpq_closed: np.ndarray
    corbin_seed_means: np.ndarray
    ldpq_seed_means: np.ndarray

    def eps_index(self, eps: float) -> int:
        """Index of ``eps`` in :attr:`epsilons`; ``KeyError`` if it was not measured."""
        for k, e in enumerate(self.epsilons):
            if math.isclose(e, eps, rel_tol=1e-12, abs_tol=0.0):
                return k
        raise KeyError(f"eps={eps} was not measured (have {list(self.epsilons)})")

    def grid_mean(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Grid-averaged measured MSE of ``which`` and its standard error, shape ``(E,)`` each."""
        meas, se, _ = _arrays(self, which)
        points = meas.shape[1] * meas.shape[2]
        return meas.mean(axis=(1, 2)), np.sqrt((se**2).sum(axis=(1, 2))) / points

    def seed_stat(self, which: str, k: int) -> Stat:
        """Mean ± std over seeds of the grid-averaged measured MSE at ``epsilons[k]``."""
        arr = self.corbin_seed_means if which == "corbin" else self.ldpq_seed_means
        return Stat.of(arr[:, k])

    def z_scores(self, which: str) -> np.ndarray:
        """``(measured - closed) / SE`` per point, ``(E, G, G)``; a point with SE = 0 (every
        draw gave one error) scores 0 if the two agree to ``1e-6`` of the largest closed form
        at that eps (the quantizers work in float32), ``inf`` otherwise."""
        meas, se, closed = _arrays(self, which)
        diff = meas - closed
        tol = 1e-6 * np.abs(closed).max(axis=(1, 2), keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(se > 0, diff / np.where(se > 0, se, 1.0), 0.0)
        return np.where((se == 0) & (np.abs(diff) > tol), np.inf, z)


def _arrays(data: GridMSE | RealWeightsMSE, which: str) -> list[np.ndarray]:
    """``[measured, se, closed]`` of quantizer ``which`` (``"corbin"`` or ``"ldpq"``)."""
    if which not in _QUANTIZERS:
        raise ValueError(f"which must be 'corbin' or 'ldpq', got {which!r}")
    return [getattr(data, f"{which}_{part}") for part in ("measured", "se", "closed")]


class _Accumulator:
    """Running sum and sum of squares (float64) of per-point squared errors."""

    def __init__(self, shape: tuple[int, ...], device: torch.device) -> None:
        self.s = torch.zeros(shape, dtype=torch.float64, device=device)
        self.ss = torch.zeros(shape, dtype=torch.float64, device=device)
        self.n = 0

    def add(self, err2: torch.Tensor) -> None:
        self.s += err2.sum(dim=0)
        self.ss += (err2 * err2).sum(dim=0)
        self.n += int(err2.shape[0])

    def mean_se(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.n
        mean = self.s / n
        var = (self.ss - n * mean * mean).clamp_min(0.0) / max(n - 1, 1)
        return mean.cpu().numpy(), torch.sqrt(var / n).cpu().numpy()


def _pair_errors(
    w1: torch.Tensor,
    w2: torch.Tensor,
    c: float | torch.Tensor,
    r: float | torch.Tensor,
    eps: float,
    d: int,
    n: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared pair errors of ``n`` draws of CorBinQ and of LDPQ, ``(n, *w1.shape)``."""
    from corbin_fl.mechanisms.quantizers import corbinq, decode, ldpq

    shape = (n, *w1.shape)
    a = w1.expand(shape)
    b = w2.expand(shape)
    cc = c.expand(shape) if isinstance(c, torch.Tensor) else c
    rr = r.expand(shape) if isinstance(r, torch.Tensor) else r
    target = a.double() + b.double()
    z = torch.randint(0, 2**d, shape, generator=generator, device=a.device, dtype=torch.int64)
    q1 = decode(corbinq(a, cc, rr, eps, z, d, lead=True, generator=generator), cc, rr, eps)
    q2 = decode(corbinq(b, cc, rr, eps, z, d, lead=False, generator=generator), cc, rr, eps)
    corbin = (q1.double() + q2.double() - target) ** 2
    l1 = decode(ldpq(a, cc, rr, eps, generator=generator), cc, rr, eps)
    l2 = decode(ldpq(b, cc, rr, eps, generator=generator), cc, rr, eps)
    ldp = (l1.double() + l2.double() - target) ** 2
    return corbin, ldp


def measure_grid(
    spec: MSESpec,
    seeds: Sequence[int],
    *,
    device: str | torch.device | None = "cpu",
    on_step: Callable[[int, int], None] | None = None,
) -> GridMSE:
    """The pair MSE over the grid of ``spec``, one seeded generator per seed, on ``device``
    (``cpu``, ``cuda``, ``auto``); ``on_step(done, total)`` after each (eps, seed)."""
    if not seeds:
        raise ValueError("seeds must not be empty")
    from corbin_fl.mechanisms.theory import corbin_pair_mse, ldpq_pair_mse

    dev = _device(device)
    c, r, d = float(spec.center), float(spec.radius), int(spec.d)
    w = np.linspace(c - r, c + r, spec.grid_points)
    w1_np, w2_np = np.meshgrid(w, w, indexing="ij")
    w1 = torch.tensor(w1_np, dtype=torch.float32, device=dev)
    w2 = torch.tensor(w2_np, dtype=torch.float32, device=dev)
    # the quantizers see float32 inputs: evaluate the closed forms at the same values
    w1_f = w1.double().cpu().numpy()
    w2_f = w2.double().cpu().numpy()
    points = spec.grid_points**2
    chunk = max(1, _MAX_CHUNK_ELEMENTS // points)
    n_eps, n_seeds = len(spec.epsilons), len(seeds)
    shape = (n_eps, spec.grid_points, spec.grid_points)
    out = {name: np.zeros(shape) for name in _ARRAYS}
    seed_means = {q: np.zeros((n_seeds, n_eps)) for q in _QUANTIZERS}
    for k, eps in enumerate(spec.epsilons):
        pooled = {q: _Accumulator(w1.shape, dev) for q in _QUANTIZERS}
        for s_idx, seed in enumerate(seeds):
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(seed) * 1_000_003 + k)
            own = {q: _Accumulator(w1.shape, dev) for q in _QUANTIZERS}
            done = 0
            while done < spec.samples:
                n = min(chunk, spec.samples - done)
                errors = _pair_errors(w1, w2, c, r, float(eps), d, n, gen)
                for q, err in zip(_QUANTIZERS, errors, strict=True):
                    own[q].add(err)
                    pooled[q].add(err)
                done += n
            for q in _QUANTIZERS:
                seed_means[q][s_idx, k] = own[q].mean_se()[0].mean()
            if on_step is not None:
                on_step(k * n_seeds + s_idx + 1, n_eps * n_seeds)
        for q in _QUANTIZERS:
            out[f"{q}_measured"][k], out[f"{q}_se"][k] = pooled[q].mean_se()
        out["corbin_closed"][k] = corbin_pair_mse(w1_f, w2_f, c, r, float(eps), d)
        out["ldpq_closed"][k] = ldpq_pair_mse(w1_f, w2_f, c, r, float(eps))
        logger.info(
            "eps=%g: CorBinQ %.5g (closed %.5g), LDPQ %.5g (closed %.5g)",
            eps,
            *(out[f"{q}_{part}"][k].mean() for q in _QUANTIZERS for part in ("measured", "closed")),
        )
    return GridMSE(
        w=w,
        epsilons=tuple(float(e) for e in spec.epsilons),
        center=c,
        radius=r,
        d=d,
        samples_per_seed=spec.samples,
        seeds=tuple(int(s) for s in seeds),
        **out,
        corbin_seed_means=seed_means["corbin"],
        ldpq_seed_means=seed_means["ldpq"],
    )


@dataclass(frozen=True)
class RealWeightsMSE:
    """Per-layer per-parameter pair MSE on trained weights, ``[e, layer]``; the last layer,
    ``"all"``, averages every parameter."""

    layers: tuple[str, ...]
    sizes: tuple[int, ...]
    epsilons: tuple[float, ...]
    d: int
    repeats: int
    radius: tuple[float, ...]
    corbin_measured: np.ndarray
    corbin_se: np.ndarray
    corbin_closed: np.ndarray
    ldpq_measured: np.ndarray
    ldpq_se: np.ndarray
    ldpq_closed: np.ndarray


def trained_pair(
    spec: RealWeightsSpec, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[str], list[int]]:
    """``(w1, w2, layer names, sizes)``: client ``k`` of 2 trains one initial model on IID
    partition ``k`` with shuffling seed ``seed + k``."""
    from corbin_fl.app.data import client_dataset, dataset_info
    from corbin_fl.app.models import build_model
    from corbin_fl.app.training import train_local
    from corbin_fl.layout import flatten, layout_of

    info = dataset_info(spec.dataset)
    init = build_model(spec.model, info.in_channels, info.num_classes, seed=int(seed))
    weights = []
    for k in range(2):
        data = client_dataset(
            spec.dataset, k, spec.num_partitions, partitioner="iid", data_seed=spec.data_seed
        )
        model = copy.deepcopy(init)
        train_local(
            model,
            data,
            epochs=spec.local_epochs,
            batch_size=spec.batch_size,
            seed=int(seed) + k,
            device=device,
        )
        weights.append(flatten(model).to(device))
    layout = layout_of(init)
    return weights[0], weights[1], list(layout.names), list(layout.sizes)


def measure_real_weights(
    spec: MSESpec,
    seed: int,
    *,
    device: str | torch.device | None = "cpu",
    on_step: Callable[[int, int], None] | None = None,
) -> RealWeightsMSE:
    """The pair MSE on two trained clients' weights (``ValueError`` without
    ``spec.real_weights``); ``on_step(done, total)`` after training and after each eps."""
    if spec.real_weights is None:
        raise ValueError("spec.real_weights is not set ([mse.real-weights] table)")
    from corbin_fl.mechanisms.theory import corbin_pair_mse, ldpq_pair_mse

    rw = spec.real_weights
    dev = _device(device)
    w1, w2, names, sizes = trained_pair(rw, seed, dev)
    if on_step is not None:
        on_step(1, len(spec.epsilons) + 1)
    offsets = np.cumsum([0, *sizes])
    c_list, r_list = [], []
    for lo, hi in itertools.pairwise(offsets.tolist()):
        seg_lo = float(torch.minimum(w1[lo:hi].min(), w2[lo:hi].min()))
        seg_hi = float(torch.maximum(w1[lo:hi].max(), w2[lo:hi].max()))
        c_list.append((seg_hi + seg_lo) / 2)
        r_list.append(max((seg_hi - seg_lo) / 2, 1e-3))
    size_t = torch.tensor(sizes, device=dev)
    c = torch.repeat_interleave(torch.tensor(c_list, dtype=torch.float32, device=dev), size_t)
    r = torch.repeat_interleave(torch.tensor(r_list, dtype=torch.float32, device=dev), size_t)
    layer_of = torch.repeat_interleave(torch.arange(len(sizes), device=dev), size_t)
    n_eps = len(spec.epsilons)
    res = {name: np.zeros((n_eps, len(sizes) + 1)) for name in _ARRAYS}
    w1_np, w2_np = w1.double().cpu().numpy(), w2.double().cpu().numpy()
    c_np, r_np = c.double().cpu().numpy(), r.double().cpu().numpy()
    size_np = np.asarray(sizes, dtype=float)

    def layer_means(sums: np.ndarray) -> np.ndarray:
        """Per-layer means of per-layer sums, then the mean over every parameter (``"all"``)."""
        return np.append(sums / size_np, sums.sum() / size_np.sum())

    for k, eps in enumerate(spec.epsilons):
        gen = torch.Generator(device=dev)
        gen.manual_seed(int(seed) * 1_000_003 + 7919 * k + 1)
        per_rep = {q: np.zeros((rw.repeats, len(sizes) + 1)) for q in _QUANTIZERS}
        for rep in range(rw.repeats):
            errors = _pair_errors(w1, w2, c, r, float(eps), spec.d, 1, gen)
            for q, err in zip(_QUANTIZERS, errors, strict=True):
                sums = torch.zeros(len(sizes), dtype=torch.float64, device=dev)
                sums.index_add_(0, layer_of, err[0])
                per_rep[q][rep] = layer_means(sums.cpu().numpy())
        for q, arr in per_rep.items():
            res[f"{q}_measured"][k] = arr.mean(axis=0)
            res[f"{q}_se"][k] = (
                arr.std(axis=0, ddof=1) / math.sqrt(rw.repeats) if rw.repeats > 1 else 0.0
            )
        closed = {
            "corbin": corbin_pair_mse(w1_np, w2_np, c_np, r_np, float(eps), spec.d),
            "ldpq": ldpq_pair_mse(w1_np, w2_np, c_np, r_np, float(eps)),
        }
        for q, values in closed.items():
            binned = np.bincount(
                layer_of.cpu().numpy(), weights=np.asarray(values), minlength=len(sizes)
            )
            res[f"{q}_closed"][k] = layer_means(binned)
        if on_step is not None:
            on_step(k + 2, len(spec.epsilons) + 1)
    return RealWeightsMSE(
        layers=(*names, "all"),
        sizes=(*sizes, int(sum(sizes))),
        epsilons=tuple(float(e) for e in spec.epsilons),
        d=spec.d,
        repeats=rw.repeats,
        radius=(*r_list, max(r_list)),
        **res,
    )


def write_grid_csv(path: Path, grid: GridMSE) -> None:
    """One row per ``(eps, w1, w2)``: measured mean and SE and closed form, both quantizers."""
    eps, w1, w2 = np.meshgrid(grid.epsilons, grid.w, grid.w, indexing="ij")
    columns = {"epsilon": eps, "w1": w1, "w2": w2}
    columns.update({name: getattr(grid, name) for name in _ARRAYS})
    write_table(path, pd.DataFrame({k: np.ravel(v) for k, v in columns.items()}))


def write_real_csv(path: Path, real: RealWeightsMSE) -> None:
    """One row per ``(eps, layer)``: per-parameter pair MSE measured (SE) and closed form."""
    n_eps = len(real.epsilons)
    columns = {
        "epsilon": np.repeat(real.epsilons, len(real.layers)),
        "layer": np.tile(np.array(real.layers, dtype=object), n_eps),
        "params": np.tile(real.sizes, n_eps),
        "radius": np.tile(real.radius, n_eps),
    }
    columns.update({name: np.ravel(getattr(real, name)) for name in _ARRAYS})
    write_table(path, pd.DataFrame(columns))


def save_measurement(path: Path, data: GridMSE | RealWeightsMSE) -> None:
    """Save a measurement as ``.npz`` (arrays, the other fields as JSON), atomically."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, object] = {"type": type(data).__name__}
    for f in dataclasses.fields(data):
        value = getattr(data, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        else:
            meta[f.name] = list(value) if isinstance(value, tuple) else value
    npz = io.BytesIO()
    np.savez(npz, __meta__=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(path, npz.getvalue())


def load_measurement(path: Path) -> GridMSE | RealWeightsMSE:
    """Load what :func:`save_measurement` wrote (``ValueError`` for an unknown type)."""
    with np.load(Path(path), allow_pickle=False) as npz:
        meta = json.loads(str(npz["__meta__"]))
        arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
    kind = meta.pop("type", None)
    cls = {"GridMSE": GridMSE, "RealWeightsMSE": RealWeightsMSE}.get(str(kind))
    if cls is None:
        raise ValueError(f"{path}: unknown measurement type {kind!r}")
    kwargs: dict[str, object] = dict(arrays)
    for f in dataclasses.fields(cls):
        if f.name in meta:
            value = meta[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)

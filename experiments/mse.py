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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from corbin_fl.devices import pick_device
from corbin_fl.experiments.plots import THREAT_NOTE, _annotate, _figure, save
from corbin_fl.experiments.report import (
    CONFIDENCE,
    Difference,
    Status,
    Target,
    _check,
    _figures,
    _header,
    _table,
    render_targets,
    verdict,
)
from corbin_fl.experiments.results import Stat, write_table
from corbin_fl.experiments.spec import ExperimentSpec, MSESpec, RealWeightsSpec
from corbin_fl.fsio import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

_MAX_CHUNK_ELEMENTS = 2_000_000
"""Elements per sampling chunk (samples x grid points), bounds the memory to ~100 MB."""
_NAMES = {"corbin": "CorBinQ", "ldpq": "LDPQ"}
"""The two quantizers: field prefix and name."""
_ARRAYS = tuple(f"{q}_{part}" for q in _NAMES for part in ("measured", "se", "closed"))
"""The measured mean, its SE and the closed form of both quantizers (fields, CSV columns)."""


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

    def closed_mean(self, which: str) -> np.ndarray:
        """Grid-averaged closed-form MSE of ``which``, shape ``(E,)``."""
        return _arrays(self, which)[2].mean(axis=(1, 2))

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
    if which not in _NAMES:
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

    dev = pick_device(device)
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
    seed_means = {q: np.zeros((n_seeds, n_eps)) for q in _NAMES}
    for k, eps in enumerate(spec.epsilons):
        pooled = {q: _Accumulator(w1.shape, dev) for q in _NAMES}
        for s_idx, seed in enumerate(seeds):
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(seed) * 1_000_003 + k)
            own = {q: _Accumulator(w1.shape, dev) for q in _NAMES}
            done = 0
            while done < spec.samples:
                n = min(chunk, spec.samples - done)
                errors = _pair_errors(w1, w2, c, r, float(eps), d, n, gen)
                for q, err in zip(_NAMES, errors, strict=True):
                    own[q].add(err)
                    pooled[q].add(err)
                done += n
            for q in _NAMES:
                seed_means[q][s_idx, k] = own[q].mean_se()[0].mean()
            if on_step is not None:
                on_step(k * n_seeds + s_idx + 1, n_eps * n_seeds)
        for q in _NAMES:
            out[f"{q}_measured"][k], out[f"{q}_se"][k] = pooled[q].mean_se()
        out["corbin_closed"][k] = corbin_pair_mse(w1_f, w2_f, c, r, float(eps), d)
        out["ldpq_closed"][k] = ldpq_pair_mse(w1_f, w2_f, c, r, float(eps))
        logger.info(
            "eps=%g: CorBinQ %.5g (closed %.5g), LDPQ %.5g (closed %.5g)",
            eps,
            *(out[f"{q}_{part}"][k].mean() for q in _NAMES for part in ("measured", "closed")),
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
    dev = pick_device(device)
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
        per_rep = {q: np.zeros((rw.repeats, len(sizes) + 1)) for q in _NAMES}
        for rep in range(rw.repeats):
            errors = _pair_errors(w1, w2, c, r, float(eps), spec.d, 1, gen)
            for q, err in zip(_NAMES, errors, strict=True):
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


QUANTIZER_NOTE = (
    f"CorBinQ: ε_p per parameter vs one uplink (A) only, no DP vs the server (B); LDPQ: "
    f"ε_p-LDP per parameter vs A and B; {THREAT_NOTE}"
)
"""The guarantees of the two quantizers of the MSE figures, in their captions."""


def _grid_title(what: str, grid: GridMSE) -> str:
    return (
        f"{what}\nfixed: center c={grid.center:g}, radius r={grid.radius:g}, d={grid.d}, "
        f"{grid.samples_per_seed} samples per point and seed, seeds "
        f"{', '.join(map(str, grid.seeds))}"
    )


def heatmaps_figure(grid: GridMSE, epsilons: Sequence[float]) -> Figure:
    """Heat maps of the pair MSE over ``(w1, w2)``, CorBinQ and LDPQ, measured and closed
    form, one row (one colour scale) per eps of ``epsilons`` (paper Fig. 4)."""
    rows = [grid.eps_index(e) for e in epsilons]
    if not rows:
        raise ValueError("no eps_p to draw heat maps for")
    fig, axes = _figure(4 * len(rows), 4, w=3.4, h=3.0)
    w = grid.w
    half = (w[1] - w[0]) / 2 if len(w) > 1 else 0.5
    extent = (w[0] - half, w[-1] + half, w[0] - half, w[-1] + half)
    heat: dict[str, Any] = {"origin": "lower", "extent": extent, "cmap": "viridis", "vmin": 0.0}
    for r, k in enumerate(rows):
        panels = [
            (getattr(grid, f"{q}_{part}")[k], f"{name} {what}")
            for q, name in _NAMES.items()
            for part, what in (("measured", "measured"), ("closed", "closed form"))
        ]
        vmax = float(max(np.max(p) for p, _ in panels))
        row = axes[4 * r : 4 * r + 4]
        for ax, (data, name) in zip(row, panels, strict=True):
            im = ax.imshow(data.T, vmax=vmax, aspect="equal", **heat)
            ax.set(xlabel="$w_1$", ylabel="$w_2$")
            ax.set_title(f"{name}, ε_p={grid.epsilons[k]:g}", fontsize=9)
        fig.colorbar(im, ax=row, shrink=0.8, label="pair MSE")
    _annotate(
        fig,
        _grid_title("Pair MSE of CorBinQ and LDPQ over the weight pair (w1, w2)", grid),
        "measured: empirical pair MSE, samples pooled over seeds; closed form: "
        "mechanisms.theory (corbin_pair_mse, ldpq_pair_mse) at the same (w1, w2); one colour "
        f"scale per row (per ε_p). {QUANTIZER_NOTE}",
    )
    return fig


def vs_epsilon_figure(grid: GridMSE) -> Figure:
    """Grid-averaged pair MSE vs eps_p, measured (± 3 SE) and closed form (left), and the
    ratio CorBinQ / LDPQ with the 1/2 line of the target check (right)."""
    fig, (ax, ax2) = _figure(2, 2, w=5.0)
    eps = np.asarray(grid.epsilons)
    (cm, cse), (lm, lse) = grid.grid_mean("corbin"), grid.grid_mean("ldpq")
    cc, lc = grid.closed_mean("corbin"), grid.closed_mean("ldpq")
    ax.errorbar(eps, cm, yerr=3 * cse, fmt="o", capsize=3, label="CorBinQ measured (±3 SE)")
    ax.plot(eps, cc, "-", label="CorBinQ closed form")
    ax.errorbar(eps, lm, yerr=3 * lse, fmt="s", capsize=3, label="LDPQ measured (±3 SE)")
    ax.plot(eps, lc, "--", label="LDPQ closed form")
    ax.set(yscale="log", ylabel="pair MSE, mean over $(w_1, w_2)$ grid")
    ax2.plot(eps, cm / lm, "o", label="measured")
    ax2.plot(eps, cc / lc, "-", label="closed form")
    ax2.axhline(0.5, color="grey", linestyle=":", label="1/2: target CorBinQ ≤ LDPQ / 2")
    ax2.set_ylabel("MSE ratio CorBinQ / LDPQ")
    for a in (ax, ax2):
        a.set(xscale="log", xlabel="PLDP budget $\\epsilon_p$ (per parameter)")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    _annotate(
        fig,
        _grid_title("Grid-averaged pair MSE vs ε_p", grid),
        "error bars: ± 3 standard errors of the grid-averaged MSE (samples pooled over seeds); "
        f"right: ratio of the grid averages. {QUANTIZER_NOTE}",
    )
    return fig


def real_weights_figure(real: RealWeightsMSE) -> Figure:
    """Per-parameter pair MSE on real CNN weights, per layer: CorBinQ vs LDPQ (measured ± 3 SE
    and closed form), one panel per eps_p (log scale; error bars clipped at zero)."""
    eps = list(real.epsilons)
    if not eps:
        raise ValueError("the real-weights measurement has no eps_p")
    fig, axes = _figure(len(eps), 3, w=max(4.0, 0.45 * len(real.layers) + 2.0))
    x = np.arange(len(real.layers))
    width = 0.4

    def err(mean: np.ndarray, se: np.ndarray) -> np.ndarray:
        return np.vstack([np.minimum(3 * se, 0.99 * mean), 3 * se])

    for k, ax in enumerate(axes):
        cm, cs = real.corbin_measured[k], real.corbin_se[k]
        lm, ls = real.ldpq_measured[k], real.ldpq_se[k]
        ax.bar(x - width / 2, cm, width, yerr=err(cm, cs), capsize=2, label="CorBinQ measured")
        ax.bar(x + width / 2, lm, width, yerr=err(lm, ls), capsize=2, label="LDPQ measured")
        ax.plot(x - width / 2, real.corbin_closed[k], "kD", ms=3, zorder=5, label="closed form")
        ax.plot(x + width / 2, real.ldpq_closed[k], "kD", ms=3, zorder=5)
        ax.set(yscale="log", ylabel="pair MSE per parameter")
        ax.set_xticks(x, real.layers, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"ε_p={eps[k]:g}", fontsize=9)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(fontsize=7)
    _annotate(
        fig,
        "Per-parameter pair MSE on two clients' trained CNN weights, per layer\nfixed: "
        f"d={real.d}, c_j and r_j = midpoint and half-range of layer j over both clients, "
        f"{real.repeats} quantization repeats",
        "error bars: ± 3 standard errors over the repeats (clipped at zero on the log axis); "
        f"'all': every parameter of the model. {QUANTIZER_NOTE}",
    )
    return fig


TARGET_RULE = (
    "The agreement target passes when every measured average is within 3 standard errors of "
    "its closed form (|z| <= 3). The ratio target reads the two-sided "
    f"{100 * CONFIDENCE:g}% normal interval of the measured ratio (delta-method SE from the "
    "standard errors of the two MSEs): **PASS** when the whole interval lies below 1/2, **MISS** "
    "when it lies above, **not resolved** when it contains 1/2; with several comparisons a MISS "
    "if one misses, else not resolved if one is not resolved, else PASS."
)
"""The rule of the MSE target checks, stated above their table in the MSE report."""


def _ratio(a: float, se_a: float, b: float, se_b: float) -> Difference:
    """``a / b`` with its delta-method standard error and normal interval."""
    ratio = a / b
    return Difference.normal(ratio, abs(ratio) * math.hypot(se_a / a, se_b / b))


def mse_targets(grid: GridMSE, real: RealWeightsMSE | None) -> list[Target]:
    """The two MSE targets: measured within 3 SE of the closed form; CorBinQ <= LDPQ / 2 at
    eps_p = 0.5 (grid average, and on real weights when measured)."""
    averages = {  # part -> quantizer -> (epsilons, measured, SE, closed form) of the averages
        "grid": {q: (grid.epsilons, *grid.grid_mean(q), grid.closed_mean(q)) for q in _NAMES}
    }
    if real is not None:  # the last column: every parameter
        averages["real weights"] = {
            q: (real.epsilons, *(a[:, -1] for a in _arrays(real, q))) for q in _NAMES
        }
    worst: dict[str, tuple[float, str]] = {}  # part -> the largest |z| (the last) and its numbers
    for part, of in averages.items():
        for q, (epsilons, meas, se, closed) in of.items():
            for k, eps in enumerate(epsilons):
                z = (meas[k] - closed[k]) / se[k] if se[k] > 0 else 0.0
                if abs(z) >= abs(worst.get(part, (0.0, ""))[0]):
                    worst[part] = (z, f"{_NAMES[q]} eps={eps:g}: {meas[k]:.5g} vs {closed[k]:.5g}")
    n_checks = 2 * len(grid.epsilons) * len(averages)
    detail = f"{n_checks} averages (grid; real weights) checked; largest |z|: " + "; ".join(
        f"{part}: z={z:+.2f} ({what})" for part, (z, what) in worst.items()
    )
    agree: Status = "PASS" if all(abs(z) <= 3.0 for z, _ in worst.values()) else "MISS"
    targets = [_check("pair MSE measured within 3 SE of the closed form", [(agree, detail)], "")]
    name = "CorBinQ MSE <= LDPQ MSE / 2 at eps_p = 0.5"
    try:
        k = grid.eps_index(0.5)
    except KeyError:
        return [*targets, Target(name, "N/A", "eps_p = 0.5 not measured")]
    (cm, cse), (lm, lse) = grid.grid_mean("corbin"), grid.grid_mean("ldpq")
    closed_ratio = grid.corbin_closed[k].mean() / grid.ldpq_closed[k].mean()
    ratio = _ratio(float(cm[k]), float(cse[k]), float(lm[k]), float(lse[k]))
    checks = [
        (
            verdict(ratio, 0.5, "below"),
            f"grid average: {cm[k]:.5g} / {lm[k]:.5g} = {ratio.value:.3f} "
            f"({ratio.fmt(3)}; closed form {closed_ratio:.3f})",
        )
    ]
    if real is not None and 0.5 in real.epsilons:
        kr = real.epsilons.index(0.5)
        rr = _ratio(*(float(a[kr, -1]) for q in _NAMES for a in _arrays(real, q)[:2]))
        checks.append(
            (verdict(rr, 0.5, "below"), f"real weights: ratio {rr.value:.3f} ({rr.fmt(3)})")
        )
    return [*targets, _check(name, checks, "")]


def write_report(
    path: Path,
    spec: ExperimentSpec,
    grid: GridMSE,
    real: RealWeightsMSE | None,
    figures: Mapping[str, Path],
    *,
    command: str,
) -> list[Target]:
    """Write ``report.md`` of the quantizer-MSE experiment; return the target checks."""
    assert spec.mse is not None
    m = spec.mse
    lines = [
        *_header(spec, command),
        "## Setup",
        "",
        f"- center c = {m.center:g}, radius r = {m.radius:g}, shared bits d = {m.d}",
        f"- grid: {m.grid_points} x {m.grid_points} points (w1, w2) in [c - r, c + r]^2",
        f"- draws: {m.samples} per point per seed; seeds {list(grid.seeds)}",
        "- pair MSE = E[(Q1(w1) + Q2(w2) - w1 - w2)^2]; CorBinQ = Alg. 2 (lead rule for w1, "
        "follow rule for w2, one uniform codeword z in [0, 2^d)); LDPQ = two independent Alg. 1",
        "- closed forms: `mechanisms.theory.corbin_pair_mse` (exact, finite d) and "
        "`mechanisms.theory.ldpq_pair_mse`",
        "",
        "## Grid-averaged pair MSE",
        "",
        "Measured: mean ± std over seeds of the grid average (pooled SE in parentheses); "
        "z = (measured - closed) / SE; 'points within 3 SE' counts the grid points whose "
        "measured MSE is within 3 SE of the closed form.",
        "",
    ]
    means = {q: grid.grid_mean(q) for q in _NAMES}
    closed = {q: grid.closed_mean(q) for q in _NAMES}
    within = {q: np.abs(grid.z_scores(q)) <= 3 for q in _NAMES}
    rows = []
    for k, eps in enumerate(grid.epsilons):
        row = [f"{eps:g}"]
        for q in _NAMES:
            (mean, se), c = means[q], closed[q][k]
            row += [
                f"{Stat.of(getattr(grid, f'{q}_seed_means')[:, k]).fmt(1.0, 5)} ({se[k]:.2g})",
                f"{c:.5g}",
                f"{(mean[k] - c) / se[k]:+.2f}" if se[k] > 0 else "0",
            ]
        ratio = means["corbin"][0][k] / means["ldpq"][0][k]
        row += [
            f"{ratio:.3f} ({closed['corbin'][k] / closed['ldpq'][k]:.3f})",
            f"{np.mean(within['corbin'][k]):.1%} / {np.mean(within['ldpq'][k]):.1%}",
        ]
        rows.append(row)
    header = [h for q in _NAMES.values() for h in (f"{q} measured", f"{q} closed", "z")]
    points = "points within 3 SE (CorBinQ / LDPQ)"
    lines.append(_table(["eps_p", *header, "ratio measured (closed)", points], rows))
    if real is not None:
        rw = m.real_weights
        assert rw is not None
        lines += [
            "",
            "## Pair MSE on real model weights",
            "",
            f"Two clients trained `{rw.model}` on `{rw.dataset}` for {rw.local_epochs} local "
            f"epoch(s) (batch {rw.batch_size}, IID partitions 0 and 1 of {rw.num_partitions}) "
            "from the same initial weights; per-layer c and r from the layer-wise min/max over "
            f"both clients; {real.repeats} quantizations per eps. Per-parameter pair MSE, "
            "measured ± SE (closed form):",
            "",
        ]
        rows = [
            [name, str(real.sizes[li]), f"{real.radius[li]:.3g}"]
            + [
                f"{real.corbin_measured[k, li]:.4g} ± {real.corbin_se[k, li]:.1g} "
                f"({real.corbin_closed[k, li]:.4g}) / {real.ldpq_measured[k, li]:.4g} "
                f"({real.ldpq_closed[k, li]:.4g})"
                for k in range(len(real.epsilons))
            ]
            for li, name in enumerate(real.layers)
        ]
        header = ["layer", "params", "r (all: max)"]
        lines.append(
            _table([*header, *(f"CorBinQ / LDPQ, eps={e:g}" for e in real.epsilons)], rows)
        )
    lines += _figures(figures, Path(path).parent)
    targets = mse_targets(grid, real)
    lines += ["", "## Quick-scale targets", "", TARGET_RULE, "", render_targets(targets), ""]
    lines += [
        "## Files",
        "",
        "- `mse_grid.csv`: per (eps, w1, w2): measured mean, SE and closed form, both quantizers",
        "- `mse_real_weights.csv`: per (eps, layer): per-parameter pair MSE" if real else "",
        "",
    ]
    atomic_write_text(path, "\n".join(lines))
    return targets


def measure(
    spec: ExperimentSpec,
    root: Path,
    *,
    device: str = "cpu",
    on_step: Callable[[str, int, int], None] = lambda what, done, total: None,
) -> None:
    """Measure the quantizer MSE of ``spec`` and save it in ``root`` (``mse_grid.npz``,
    ``mse_real.npz``), so that :func:`finalize` redraws without sampling again;
    ``on_step(what, done, total)`` as it goes."""
    assert spec.mse is not None
    grid = measure_grid(
        spec.mse, spec.seeds, device=device, on_step=partial(on_step, "grid (eps x seed)")
    )
    save_measurement(root / "mse_grid.npz", grid)
    if spec.mse.real_weights is not None:
        step = partial(on_step, "real weights (train, eps)")
        real = measure_real_weights(spec.mse, spec.seeds[0], device=device, on_step=step)
        save_measurement(root / "mse_real.npz", real)


def finalize(spec: ExperimentSpec, root: Path, command: str) -> tuple[list[Target], Path | None]:
    """Write the MSE CSVs, figures and report in ``root`` from the saved measurements; return
    the target checks and the report (``None`` before a measurement)."""
    if not (root / "mse_grid.npz").is_file():
        logger.warning("%s: no measurement yet; nothing to report", spec.name)
        return [], None
    assert spec.mse is not None
    grid = load_measurement(root / "mse_grid.npz")
    real = load_measurement(root / "mse_real.npz") if (root / "mse_real.npz").is_file() else None
    assert isinstance(grid, GridMSE) and not isinstance(real, GridMSE)
    write_grid_csv(root / "mse_grid.csv", grid)
    if real is not None:
        write_real_csv(root / "mse_real_weights.csv", real)
    draw = {
        "mse-heatmap": lambda: heatmaps_figure(grid, spec.mse.heatmap_epsilons),  # type: ignore[union-attr]
        "mse-vs-epsilon": lambda: vs_epsilon_figure(grid),
        "mse-real-weights": lambda: real_weights_figure(real),  # type: ignore[arg-type]
    }
    figures = {
        name: save(draw[name](), root / "figures" / f"{name}.png")
        for name in spec.figures
        if name != "mse-real-weights" or real is not None
    }
    targets = write_report(root / "report.md", spec, grid, real, figures, command=command)
    return targets, root / "report.md"

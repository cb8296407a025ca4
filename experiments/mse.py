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
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from corbin_fl.app.data import client_dataset, dataset_info
from corbin_fl.app.models import build_model
from corbin_fl.app.training import train_local
from corbin_fl.devices import pick_device
from corbin_fl.experiments import report as rp
from corbin_fl.experiments.plots import THREAT_NOTE, annotate, new_figure, save
from corbin_fl.experiments.results import TEXTS, Stat, write_table
from corbin_fl.experiments.spec import ExperimentSpec, MSESpec
from corbin_fl.fsio import atomic_write_text
from corbin_fl.layout import flatten, layer_ids, layout_of
from corbin_fl.mechanisms.quantizers import corbinq, decode, ldpq
from corbin_fl.mechanisms.theory import corbin_pair_mse, ldpq_pair_mse

logger = logging.getLogger(__name__)

_MAX_CHUNK_ELEMENTS = 2_000_000
"""Elements per sampling chunk (samples x grid points), bounds the memory to ~100 MB."""
_NAMES = {"corbin": "CorBinQ", "ldpq": "LDPQ"}
"""The two quantizers: field prefix and name."""
_PARTS = ("measured", "se", "closed")
_ARRAYS = tuple(f"{q}_{part}" for q in _NAMES for part in _PARTS)
"""The measured mean, its SE and the closed form of both quantizers (fields, CSV columns)."""


@dataclass(frozen=True)
class _Measurement:
    """Measured mean, its SE and closed form of the pair MSE of both quantizers at ``d`` shared
    bits, ``[e, ...]`` at ``epsilons[e]``."""

    epsilons: tuple[float, ...]
    d: int
    corbin_measured: np.ndarray
    corbin_se: np.ndarray
    corbin_closed: np.ndarray
    ldpq_measured: np.ndarray
    ldpq_se: np.ndarray
    ldpq_closed: np.ndarray

    def of(self, q: str) -> list[np.ndarray]:
        """``[measured, se, closed]`` of quantizer ``q`` (``"corbin"`` or ``"ldpq"``)."""
        return [getattr(self, f"{q}_{part}") for part in _PARTS]


@dataclass(frozen=True)
class GridMSE(_Measurement):
    """Pair MSE ``[e, i, j]`` at ``w[i]``, ``w[j]`` (samples of all seeds pooled);
    ``*_seed_means``: grid averages per seed, ``(S, E)``."""

    w: np.ndarray
    center: float
    radius: float
    samples_per_seed: int
    seeds: tuple[int, ...]
    corbin_seed_means: np.ndarray
    ldpq_seed_means: np.ndarray

    def averages(self, q: str) -> list[np.ndarray]:
        """Grid averages of quantizer ``q``: measured, its SE ``sqrt(sum SE_i^2) / G^2`` and
        closed form, shape ``(E,)`` each."""
        meas, se, closed = self.of(q)
        points = meas.shape[1] * meas.shape[2]
        return [
            meas.mean(axis=(1, 2)),
            np.sqrt((se**2).sum(axis=(1, 2))) / points,
            closed.mean(axis=(1, 2)),
        ]

    def z_scores(self, q: str) -> np.ndarray:
        """``(measured - closed) / SE`` per point, ``(E, G, G)``; a point with SE = 0 (every
        draw gave one error) scores 0 if the two agree to ``1e-6`` of the largest closed form
        at that eps (the quantizers work in float32), ``inf`` otherwise."""
        meas, se, closed = self.of(q)
        diff, tol = meas - closed, 1e-6 * np.abs(closed).max(axis=(1, 2), keepdims=True)
        z = diff / np.where(se > 0, se, 1.0)
        return np.where(se > 0, z, np.where(np.abs(diff) > tol, np.inf, 0.0))


@dataclass(frozen=True)
class RealWeightsMSE(_Measurement):
    """Per-layer per-parameter pair MSE on trained weights, ``[e, layer]``; the last layer,
    ``"all"``, averages every parameter."""

    layers: tuple[str, ...]
    sizes: tuple[int, ...]
    repeats: int
    radius: tuple[float, ...]

    def averages(self, q: str) -> list[np.ndarray]:
        """Measured, SE and closed form of quantizer ``q`` over every parameter, ``(E,)``."""
        return [a[:, -1] for a in self.of(q)]


def _pair_errors(
    w1: torch.Tensor, w2: torch.Tensor, c: Any, r: Any, eps: float, d: int, n: int, gen: Any
) -> list[torch.Tensor]:
    """Squared pair errors ``(Q1(w1) + Q2(w2) - w1 - w2)^2`` of ``n`` draws of CorBinQ and of
    LDPQ, ``(n, *w1.shape)`` each."""
    shape = (n, *w1.shape)
    a, b = w1.expand(shape), w2.expand(shape)
    c, r = (x.expand(shape) if isinstance(x, torch.Tensor) else x for x in (c, r))
    target = a.double() + b.double()
    z = torch.randint(0, 2**d, shape, generator=gen, device=a.device, dtype=torch.int64)

    def err(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
        return (decode(q1, c, r, eps).double() + decode(q2, c, r, eps).double() - target) ** 2

    return [
        err(*(corbinq(x, c, r, eps, z, d, lead=x is a, generator=gen) for x in (a, b))),
        err(*(ldpq(x, c, r, eps, generator=gen) for x in (a, b))),
    ]


def measure_grid(
    spec: MSESpec, seeds: Sequence[int], *, device: Any = "cpu", on_step: Callable | None = None
) -> GridMSE:
    """The pair MSE over the grid of ``spec``, one seeded generator per seed, on ``device``
    (``cpu``, ``cuda``, ``auto``); ``on_step(done, total)`` after each (eps, seed)."""
    if not seeds:
        raise ValueError("seeds must not be empty")
    dev = pick_device(device)
    c, r, d, G = float(spec.center), float(spec.radius), int(spec.d), spec.grid_points
    w = np.linspace(c - r, c + r, G)
    w1, w2 = (
        torch.tensor(x, dtype=torch.float32, device=dev) for x in np.meshgrid(w, w, indexing="ij")
    )
    # the quantizers see float32 inputs: evaluate the closed forms at the same values
    w1_f, w2_f = w1.double().cpu().numpy(), w2.double().cpu().numpy()
    chunk = max(1, _MAX_CHUNK_ELEMENTS // G**2)
    n_eps, n_seeds = len(spec.epsilons), len(seeds)
    out: dict[str, Any] = {name: np.zeros((n_eps, G, G)) for name in _ARRAYS}
    out |= {f"{q}_seed_means": np.zeros((n_seeds, n_eps)) for q in _NAMES}
    zeros = lambda: torch.zeros(w1.shape, dtype=torch.float64, device=dev)  # noqa: E731
    for k, eps in enumerate(map(float, spec.epsilons)):
        pooled = {q: [zeros(), zeros()] for q in _NAMES}  # sums of errors and of their squares
        for s_idx, seed in enumerate(seeds):
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(seed) * 1_000_003 + k)
            own = {q: zeros() for q in _NAMES}
            for done in range(0, spec.samples, chunk):
                n = min(chunk, spec.samples - done)
                for q, err in zip(_NAMES, _pair_errors(w1, w2, c, r, eps, d, n, gen), strict=True):
                    own[q] += err.sum(dim=0)
                    pooled[q][0] += err.sum(dim=0)
                    pooled[q][1] += (err * err).sum(dim=0)
            for q in _NAMES:
                out[f"{q}_seed_means"][s_idx, k] = (own[q] / spec.samples).cpu().numpy().mean()
            if on_step is not None:
                on_step(k * n_seeds + s_idx + 1, n_eps * n_seeds)
        n = spec.samples * n_seeds
        for q, (s, ss) in pooled.items():
            mean = s / n
            var = (ss - n * mean * mean).clamp_min(0.0) / max(n - 1, 1)
            out[f"{q}_measured"][k] = mean.cpu().numpy()
            out[f"{q}_se"][k] = torch.sqrt(var / n).cpu().numpy()
        out["corbin_closed"][k] = corbin_pair_mse(w1_f, w2_f, c, r, eps, d)
        out["ldpq_closed"][k] = ldpq_pair_mse(w1_f, w2_f, c, r, eps)
        means = (out[f"{q}_{part}"][k].mean() for q in _NAMES for part in ("measured", "closed"))
        logger.info("eps=%g: CorBinQ %.5g (closed %.5g), LDPQ %.5g (closed %.5g)", eps, *means)
    out |= {"w": w, "center": c, "radius": r, "samples_per_seed": spec.samples}
    return GridMSE(
        epsilons=tuple(map(float, spec.epsilons)), d=d, seeds=tuple(map(int, seeds)), **out
    )


def measure_real_weights(
    spec: MSESpec, seed: int, *, device: Any = "cpu", on_step: Callable | None = None
) -> RealWeightsMSE:
    """The pair MSE on two trained clients' weights (``ValueError`` without
    ``spec.real_weights``): client ``k`` of 2 trains one initial model on IID partition ``k``
    with shuffling seed ``seed + k``; ``on_step(done, total)`` after training and each eps."""
    if (rw := spec.real_weights) is None:
        raise ValueError("spec.real_weights is not set ([mse.real-weights] table)")
    dev, step = pick_device(device), on_step or (lambda done, total: None)
    info = dataset_info(rw.dataset)
    init = build_model(rw.model, info.in_channels, info.num_classes, seed=int(seed))
    part: dict[str, Any] = {"partitioner": "iid", "data_seed": rw.data_seed}
    how: dict[str, Any] = {"epochs": rw.local_epochs, "batch_size": rw.batch_size, "device": dev}
    w = []
    for k in range(2):
        data = client_dataset(rw.dataset, k, rw.num_partitions, **part)
        train_local(model := copy.deepcopy(init), data, seed=int(seed) + k, **how)
        w.append(flatten(model).to(dev))
    step(1, len(spec.epsilons) + 1)
    layout = layout_of(init)
    sizes, layer_of = list(layout.sizes), layer_ids(layout, dev)
    c_list, r_list = [], []
    for a, b in zip(w[0].split(sizes), w[1].split(sizes), strict=True):
        lo, hi = float(torch.minimum(a.min(), b.min())), float(torch.maximum(a.max(), b.max()))
        c_list.append((hi + lo) / 2)
        r_list.append(max((hi - lo) / 2, 1e-3))
    c, r = (torch.tensor(v, dtype=torch.float32, device=dev)[layer_of] for v in (c_list, r_list))
    res: dict[str, Any] = {name: np.zeros((len(spec.epsilons), len(sizes) + 1)) for name in _ARRAYS}
    size_np, layer_np = np.asarray(sizes, dtype=float), layer_of.cpu().numpy()

    def layer_means(sums: np.ndarray) -> np.ndarray:
        """Per-layer means of per-layer sums, then the mean over every parameter (``"all"``)."""
        return np.append(sums / size_np, sums.sum() / size_np.sum())

    w1n, w2n, cn, rn = (x.double().cpu().numpy() for x in (w[0], w[1], c, r))
    for k, eps in enumerate(map(float, spec.epsilons)):
        gen = torch.Generator(device=dev)
        gen.manual_seed(int(seed) * 1_000_003 + 7919 * k + 1)
        per_rep = {q: np.zeros((rw.repeats, len(sizes) + 1)) for q in _NAMES}
        for rep in range(rw.repeats):
            errors = _pair_errors(w[0], w[1], c, r, eps, spec.d, 1, gen)
            for q, err in zip(_NAMES, errors, strict=True):
                sums = torch.zeros(len(sizes), dtype=torch.float64, device=dev)
                per_rep[q][rep] = layer_means(sums.index_add_(0, layer_of, err[0]).cpu().numpy())
        closed = {
            "corbin": corbin_pair_mse(w1n, w2n, cn, rn, eps, spec.d),
            "ldpq": ldpq_pair_mse(w1n, w2n, cn, rn, eps),
        }
        for q, arr in per_rep.items():
            res[f"{q}_measured"][k] = arr.mean(axis=0)
            res[f"{q}_se"][k] = (
                arr.std(axis=0, ddof=1) / math.sqrt(rw.repeats) if rw.repeats > 1 else 0.0
            )
            binned = np.bincount(layer_np, weights=np.asarray(closed[q]), minlength=len(sizes))
            res[f"{q}_closed"][k] = layer_means(binned)
        step(k + 2, len(spec.epsilons) + 1)
    res |= {"layers": (*layout.names, "all"), "sizes": (*sizes, sum(sizes)), "repeats": rw.repeats}
    return RealWeightsMSE(
        epsilons=tuple(map(float, spec.epsilons)), d=spec.d, radius=(*r_list, max(r_list)), **res
    )


MEASUREMENT = "mse_measurement.csv"
"""The measurement of an mse experiment, in its folder: :func:`measurement_table` as CSV."""
COLUMNS = (
    *("part", "epsilon", "seed", "w1", "w2", "layer", "params", "center", "radius", "d", "draws"),
    *_ARRAYS,
)
"""The measurement's columns; ``part``: ``grid`` (a grid point, seeds pooled), ``grid-seed``
(the grid average of one seed: ``*_measured`` only) or ``real-weights`` (a layer, ``all`` last)."""
_INT_COLUMNS = ("seed", "params", "d", "draws")
"""The integer columns (empty in the rows of a part without them)."""


def measurement_table(grid: GridMSE, real: RealWeightsMSE | None = None) -> pd.DataFrame:
    """The measurement in long format, :data:`COLUMNS`: one row per ``(eps, w1, w2)`` of the
    grid, per ``(eps, seed)`` and per ``(eps, layer)`` of ``real``; ``draws``: the draws per
    point that a row's measured value averages (samples x seeds, samples, repeats)."""
    eps, w1, w2 = np.meshgrid(grid.epsilons, grid.w, grid.w, indexing="ij")
    fixed = {"center": grid.center, "radius": grid.radius, "d": grid.d}
    points = {"part": "grid", "epsilon": eps, "w1": w1, "w2": w2} | fixed
    points |= {"draws": grid.samples_per_seed * len(grid.seeds)}
    points |= {a: getattr(grid, a) for a in _ARRAYS}
    eps_s, seed = np.meshgrid(grid.epsilons, grid.seeds, indexing="ij")
    seeds = {"part": "grid-seed", "epsilon": eps_s, "seed": seed} | fixed
    seeds |= {"draws": grid.samples_per_seed}
    seeds |= {f"{q}_measured": getattr(grid, f"{q}_seed_means").T for q in _NAMES}
    parts = [points, seeds]
    if real is not None:
        n = len(real.epsilons)
        parts.append(
            {"part": "real-weights", "epsilon": np.repeat(real.epsilons, len(real.layers))}
            | {"layer": np.tile(np.array(real.layers, dtype=object), n)}
            | {"params": np.tile(real.sizes, n), "radius": np.tile(real.radius, n)}
            | {"d": real.d, "draws": real.repeats}
            | {a: getattr(real, a) for a in _ARRAYS}
        )
    frames = [
        pd.DataFrame({k: np.ravel(v) if isinstance(v, np.ndarray) else v for k, v in p.items()})
        for p in parts
    ]
    table = pd.concat(frames, ignore_index=True).reindex(columns=list(COLUMNS))
    return table.astype(dict.fromkeys(_INT_COLUMNS, "Int64"))


def _rows(part: pd.DataFrame, keys: list[str], index: list[Any]) -> pd.DataFrame:
    """The rows of ``part`` in the order of the product of ``index`` over ``keys``
    (``ValueError`` if one is missing)."""
    rows = part.set_index(keys).reindex(pd.MultiIndex.from_product(index, names=keys))
    if rows.index.size != len(part) or rows["part"].isna().any():
        raise ValueError(f"{part['part'].iloc[0]} rows: not one per {' x '.join(keys)}")
    return rows


def _one(part: pd.DataFrame, column: str) -> Any:
    """The value of ``column`` shared by every row of ``part`` (``ValueError`` otherwise)."""
    if len(values := part[column].unique()) != 1:
        raise ValueError(f"{part['part'].iloc[0]} rows: {column} not one value: {values}")
    return values[0]


def _array(rows: pd.DataFrame, column: str, *shape: int) -> np.ndarray:
    """Column ``column`` of ``rows`` as a float array of ``shape``."""
    return rows[column].to_numpy(dtype=float).reshape(shape)


def read_measurement(path: Path) -> tuple[GridMSE, RealWeightsMSE | None]:
    """The grid and real-weights (``None`` if not measured) measurements of a
    :func:`measurement_table` CSV (``pd.read_csv``; its Python parser reads every float as
    written, as pandas 2's default C parser does not always)."""
    table = pd.read_csv(path, engine="python", keep_default_na=False, na_values=[""])
    parts = {name: rows for name, rows in table.groupby("part", sort=False)}
    if "grid" not in parts or "grid-seed" not in parts:
        raise ValueError(f"{path}: no grid measurement")
    g, s = parts["grid"], parts["grid-seed"]
    epsilons = tuple(map(float, pd.unique(g["epsilon"])))
    w = np.sort(pd.unique(g["w1"]))
    seeds = tuple(int(x) for x in pd.unique(s["seed"]))
    points = _rows(g, ["epsilon", "w1", "w2"], [epsilons, w, w])
    per_seed = _rows(s, ["seed", "epsilon"], [seeds, epsilons])
    grid = GridMSE(
        epsilons=epsilons,
        d=int(_one(g, "d")),
        **{a: _array(points, a, len(epsilons), len(w), len(w)) for a in _ARRAYS},
        w=w,
        center=float(_one(g, "center")),
        radius=float(_one(g, "radius")),
        samples_per_seed=int(_one(s, "draws")),
        seeds=seeds,
        **{
            f"{q}_seed_means": _array(per_seed, f"{q}_measured", len(seeds), len(epsilons))
            for q in _NAMES
        },
    )
    if (r := parts.get("real-weights")) is None:
        return grid, None
    epsilons = tuple(map(float, pd.unique(r["epsilon"])))
    layers = tuple(map(str, pd.unique(r["layer"])))
    per_layer = _rows(r, ["epsilon", "layer"], [epsilons, layers])
    first = per_layer.loc[epsilons[0]]
    real = RealWeightsMSE(
        epsilons=epsilons,
        d=int(_one(r, "d")),
        **{a: _array(per_layer, a, len(epsilons), len(layers)) for a in _ARRAYS},
        layers=layers,
        sizes=tuple(int(x) for x in first["params"]),
        repeats=int(_one(r, "draws")),
        radius=tuple(float(x) for x in first["radius"]),
    )
    return grid, real


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
    rows = [grid.epsilons.index(e) for e in epsilons]
    if not rows:
        raise ValueError("no eps_p to draw heat maps for")
    fig, axes = new_figure(4 * len(rows), 4, w=3.4, h=3.0)
    w = grid.w
    half = (w[1] - w[0]) / 2 if len(w) > 1 else 0.5
    heat: dict[str, Any] = {"origin": "lower", "cmap": "viridis", "vmin": 0.0, "aspect": "equal"}
    heat["extent"] = (w[0] - half, w[-1] + half, w[0] - half, w[-1] + half)
    for r, k in enumerate(rows):
        panels = [
            (getattr(grid, f"{q}_{part}")[k], f"{name} {what}")
            for q, name in _NAMES.items()
            for part, what in (("measured", "measured"), ("closed", "closed form"))
        ]
        vmax = float(max(np.max(p) for p, _ in panels))
        row = axes[4 * r : 4 * r + 4]
        for ax, (data, name) in zip(row, panels, strict=True):
            im = ax.imshow(data.T, vmax=vmax, **heat)
            ax.set(xlabel="$w_1$", ylabel="$w_2$")
            ax.set_title(f"{name}, ε_p={grid.epsilons[k]:g}", fontsize=9)
        fig.colorbar(im, ax=row, shrink=0.8, label="pair MSE")
    annotate(
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
    fig, (ax, ax2) = new_figure(2, 2, w=5.0)
    eps = np.asarray(grid.epsilons)
    (cm, cse, cc), (lm, lse, lc) = grid.averages("corbin"), grid.averages("ldpq")
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
    annotate(
        fig,
        _grid_title("Grid-averaged pair MSE vs ε_p", grid),
        "error bars: ± 3 standard errors of the grid-averaged MSE (samples pooled over seeds); "
        f"right: ratio of the grid averages. {QUANTIZER_NOTE}",
    )
    return fig


def real_weights_figure(real: RealWeightsMSE) -> Figure:
    """Per-parameter pair MSE on real CNN weights, per layer: CorBinQ vs LDPQ (measured ± 3 SE
    and closed form), one panel per eps_p (log scale; error bars clipped at zero)."""
    if not real.epsilons:
        raise ValueError("the real-weights measurement has no eps_p")
    fig, axes = new_figure(len(real.epsilons), 3, w=max(4.0, 0.45 * len(real.layers) + 2.0))
    x = np.arange(len(real.layers))
    for k, ax in enumerate(axes):
        for q, dx in (("corbin", -0.2), ("ldpq", 0.2)):
            m, se, _ = (a[k] for a in real.of(q))
            err = np.vstack([np.minimum(3 * se, 0.99 * m), 3 * se])
            ax.bar(x + dx, m, 0.4, yerr=err, capsize=2, label=f"{_NAMES[q]} measured")
        ax.plot(x - 0.2, real.corbin_closed[k], "kD", ms=3, zorder=5, label="closed form")
        ax.plot(x + 0.2, real.ldpq_closed[k], "kD", ms=3, zorder=5)
        ax.set(yscale="log", ylabel="pair MSE per parameter")
        ax.set_xticks(x, real.layers, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"ε_p={real.epsilons[k]:g}", fontsize=9)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(fontsize=7)
    annotate(
        fig,
        "Per-parameter pair MSE on two clients' trained CNN weights, per layer\nfixed: "
        f"d={real.d}, c_j and r_j = midpoint and half-range of layer j over both clients, "
        f"{real.repeats} quantization repeats",
        "error bars: ± 3 standard errors over the repeats (clipped at zero on the log axis); "
        f"'all': every parameter of the model. {QUANTIZER_NOTE}",
    )
    return fig


TARGET_RULE = TEXTS["mse-target-rule"].format(confidence=100 * rp.CONFIDENCE)
"""The rule of the MSE target checks, stated above their table in the MSE report."""


def mse_targets(grid: GridMSE, real: RealWeightsMSE | None) -> list[rp.Target]:
    """The two MSE targets: every average measured within 3 SE of its closed form; CorBinQ <=
    LDPQ / 2 at eps_p = 0.5 on the delta-method SE of the ratio ``a / b``, ``|a / b|
    sqrt((SE_a / a)^2 + (SE_b / b)^2)`` (grid average, and on real weights when measured)."""
    parts: dict[str, GridMSE | RealWeightsMSE] = {"grid": grid}
    parts |= {"real weights": real} if real is not None else {}
    worst: dict[str, tuple[float, str]] = {}  # part -> the largest |z| (the last) and its numbers
    for part, data in parts.items():
        for q in _NAMES:
            for eps, m, se, closed in zip(data.epsilons, *data.averages(q), strict=True):
                z = (m - closed) / se if se > 0 else 0.0
                if abs(z) >= abs(worst.get(part, (0.0, ""))[0]):
                    worst[part] = (z, f"{_NAMES[q]} eps={eps:g}: {m:.5g} vs {closed:.5g}")
    detail = f"{2 * len(grid.epsilons) * len(parts)} averages (grid; real weights) checked; "
    detail += "largest |z|: " + "; ".join(f"{p}: z={z:+.2f} ({x})" for p, (z, x) in worst.items())
    agree: rp.Status = "PASS" if all(abs(z) <= 3.0 for z, _ in worst.values()) else "MISS"
    targets = [rp.combine("pair MSE measured within 3 SE of the closed form", [(agree, detail)])]
    name = "CorBinQ MSE <= LDPQ MSE / 2 at eps_p = 0.5"
    if 0.5 not in grid.epsilons:
        return [*targets, rp.Target(name, "N/A", "eps_p = 0.5 not measured")]
    checks: list[tuple[rp.Status, str]] = []
    for part, data in parts.items():
        if 0.5 in data.epsilons:
            k = data.epsilons.index(0.5)
            (a, se_a, ca), (b, se_b, cb) = ([float(v[k]) for v in data.averages(q)] for q in _NAMES)
            ratio = rp.Difference.normal(a / b, abs(a / b) * math.hypot(se_a / a, se_b / b))
            text = f"{ratio.value:.3f} ({ratio.fmt(3)}"
            text = (
                f"grid average: {a:.5g} / {b:.5g} = {text}; closed form {ca / cb:.3f})"
                if part == "grid"
                else f"real weights: ratio {text})"
            )
            checks.append((rp.verdict(ratio, 0.5, "below"), text))
    return [*targets, rp.combine(name, checks)]


def measure(
    spec: ExperimentSpec, root: Path, *, device: str = "cpu", on_step: Callable | None = None
) -> None:
    """Measure the quantizer MSE of ``spec`` and save it in ``root`` (:data:`MEASUREMENT`, the
    grid as soon as it is measured), so that :func:`finalize` redraws without sampling again;
    ``on_step(what, done, total)`` as it goes."""
    assert spec.mse is not None
    step = on_step or (lambda what, done, total: None)
    how: dict[str, Any] = {"device": device, "on_step": partial(step, "grid (eps x seed)")}
    grid = measure_grid(spec.mse, spec.seeds, **how)
    write_table(root / MEASUREMENT, measurement_table(grid))
    if spec.mse.real_weights is not None:
        how["on_step"] = partial(step, "real weights (train, eps)")
        real = measure_real_weights(spec.mse, spec.seeds[0], **how)
        write_table(root / MEASUREMENT, measurement_table(grid, real))


def finalize(spec: ExperimentSpec, root: Path, command: str) -> tuple[list[rp.Target], Path | None]:
    """Write the MSE figures and ``report.md`` in ``root`` from the saved measurement
    (:data:`MEASUREMENT`); return the target checks and the report (``None`` before a
    measurement)."""
    if not (root / MEASUREMENT).is_file():
        logger.warning("%s: no measurement yet; nothing to report", spec.name)
        return [], None
    assert spec.mse is not None
    m, path = spec.mse, root / "report.md"
    grid, real = read_measurement(root / MEASUREMENT)
    draw: dict[str, Callable[[], Figure]] = {
        "mse-heatmap": lambda: heatmaps_figure(grid, m.heatmap_epsilons),
        "mse-vs-epsilon": lambda: vs_epsilon_figure(grid),
    }
    if real is not None:
        draw["mse-real-weights"] = lambda: real_weights_figure(real)
    figures = {n: save(draw[n](), root / "figures" / f"{n}.png") for n in spec.figures if n in draw}
    avg = {q: grid.averages(q) for q in _NAMES}
    within = {q: np.abs(grid.z_scores(q)) <= 3 for q in _NAMES}
    rows = []
    for k, eps in enumerate(grid.epsilons):
        row = [f"{eps:g}"]
        for q, (mean, se, closed) in avg.items():
            stat = Stat.of(getattr(grid, f"{q}_seed_means")[:, k])
            z = f"{(mean[k] - closed[k]) / se[k]:+.2f}" if se[k] > 0 else "0"
            row += [f"{stat.fmt(1.0, 5)} ({se[k]:.2g})", f"{closed[k]:.5g}", z]
        ratio = avg["corbin"][0][k] / avg["ldpq"][0][k]
        row += [
            f"{ratio:.3f} ({avg['corbin'][2][k] / avg['ldpq'][2][k]:.3f})",
            f"{np.mean(within['corbin'][k]):.1%} / {np.mean(within['ldpq'][k]):.1%}",
        ]
        rows.append(row)
    header = [h for q in _NAMES.values() for h in (f"{q} measured", f"{q} closed", "z")]
    points = "points within 3 SE (CorBinQ / LDPQ)"
    lines = [
        *rp.header(spec, command),
        *rp.section("Setup", TEXTS["mse-setup"].format(m=m, seeds=list(grid.seeds))),
        *rp.section(
            "Grid-averaged pair MSE",
            TEXTS["mse-grid-intro"],
            rp.table(["eps_p", *header, "ratio measured (closed)", points], rows),
        ),
    ]
    if real is not None and (rw := m.real_weights) is not None:
        text = TEXTS["mse-real-weights"].format(rw=rw, repeats=real.repeats)
        (cm, cs, cc), (lm, _, lc) = real.of("corbin"), real.of("ldpq")
        rows = [
            [name, str(real.sizes[i]), f"{real.radius[i]:.3g}"]
            + [
                f"{cm[k, i]:.4g} ± {cs[k, i]:.1g} ({cc[k, i]:.4g}) / {lm[k, i]:.4g} "
                f"({lc[k, i]:.4g})"
                for k in range(len(real.epsilons))
            ]
            for i, name in enumerate(real.layers)
        ]
        header = ["layer", "params", "r (all: max)"]
        header += [f"CorBinQ / LDPQ, eps={e:g}" for e in real.epsilons]
        lines += rp.section("Pair MSE on real model weights", text, rp.table(header, rows))
    targets = mse_targets(grid, real)
    lines += rp.figures_section(figures, root)
    lines += rp.section("Quick-scale targets", TARGET_RULE, rp.targets_table(targets))
    lines += rp.section("Files", TEXTS["mse-files"])
    atomic_write_text(path, "\n".join(lines))
    return targets, path

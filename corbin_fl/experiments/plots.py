"""PNG figures of an experiment (matplotlib's object API with the Agg canvas; no pyplot state).

Federated figures use the lambda-selected runs of each setting
(:func:`corbin_fl.experiments.results.group_results`) and show the mean over seeds with a
band / error bar of one sample standard deviation:

* ``accuracy-vs-round``: test accuracy per round, one line per mechanism, one panel per value
  of the other varying keys;
* ``accuracy-bar``: test accuracy at the validation-selected round and final-round accuracy;
* ``accuracy-vs-epsilon`` / ``-d`` / ``-dropout`` / ``-clients``: test accuracy at the
  validation-selected round against the swept key, one line per mechanism; a mechanism that
  was run at a single value of that key (a reference such as FedAvg) is a horizontal line.

MSE figures (paper Fig. 4) take the arrays of :mod:`corbin_fl.experiments.mse`.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from corbin_fl.config import MECHANISMS
from corbin_fl.experiments.results import GroupResult, group_label
from corbin_fl.experiments.spec import CLIENTS_KEY

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from corbin_fl.experiments.mse import GridMSE, RealWeightsMSE

logger = logging.getLogger(__name__)

X_KEY_OF_FIGURE = {
    "accuracy-vs-epsilon": "epsilon",
    "accuracy-vs-d": "d",
    "accuracy-vs-dropout": "dropout-prob",
    "accuracy-vs-clients": CLIENTS_KEY,
}
_X_LABEL = {
    "epsilon": "PLDP budget $\\epsilon_p$",
    "d": "shared random bits per parameter $d$",
    "dropout-prob": "dropout probability $p$",
    CLIENTS_KEY: "number of clients $n$",
}


def _wrap(title: str, width: int = 70) -> str:
    """A figure title on lines of at most ``width`` characters (long spec descriptions)."""
    return textwrap.fill(title, width)


def _figure(ncols: int = 1, nrows: int = 1, *, w: float = 5.0, h: float = 3.6) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - matplotlib is a declared extra
        raise ImportError(
            "figures need matplotlib: pip install 'corbin-fl[plots]' (or matplotlib>=3.8)"
        ) from exc
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _int_ticks(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    logger.info("wrote %s", path)
    return path


def _mech(g: GroupResult) -> str:
    return str(g.setting.get("mechanism", "run"))


def _color(mechanism: str) -> str | None:
    """One colour per mechanism in every figure (matplotlib's ``C0``..``C9`` cycle)."""
    return f"C{MECHANISMS.index(mechanism) % 10}" if mechanism in MECHANISMS else None


def _facets(groups: Sequence[GroupResult], keys: Sequence[str]) -> dict[str, list[GroupResult]]:
    other = [k for k in keys if k != "mechanism"]
    facets: dict[str, list[GroupResult]] = {}
    for g in groups:
        facets.setdefault(group_label(g.setting, other) if other else "", []).append(g)
    return facets


def plot_accuracy_vs_round(
    groups: Sequence[GroupResult], keys: Sequence[str], path: Path, *, title: str = ""
) -> Path:
    """Test accuracy (mean ± std over seeds) per round, one line per mechanism.

    Parameters
    ----------
    groups
        Lambda-selected settings.
    keys
        Varying setting keys; every key but ``mechanism`` splits the figure into panels.
    path
        Output PNG.
    """
    facets = _facets(groups, keys)
    n = len(facets)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig = _figure(ncols, nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, (label, members) in zip(axes.flat, facets.items(), strict=False):
        for g in members:
            rounds, mean, std = g.curve("test_accuracy")
            line = ax.plot(
                rounds,
                100 * mean,
                marker=".",
                color=_color(_mech(g)),
                label=f"{_mech(g)} (λ={g.global_lr:g})",
            )
            ax.fill_between(
                rounds, 100 * (mean - std), 100 * (mean + std), alpha=0.2, color=line[0].get_color()
            )
        _int_ticks(ax)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(label or title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title and n > 1:
        fig.suptitle(_wrap(title))
    return _save(fig, path)


def plot_accuracy_bar(
    groups: Sequence[GroupResult], keys: Sequence[str], path: Path, *, title: str = ""
) -> Path:
    """Bars of the test accuracy at the selected round and at the final round (± std)."""
    labels = [group_label(g.setting, keys) for g in groups]
    x = np.arange(len(groups))
    fig = _figure(w=max(5.0, 0.7 * len(groups) + 2))
    ax = fig.subplots()
    colors = [_color(_mech(g)) for g in groups]
    sel = [g.test for g in groups]
    fin = [g.final_test for g in groups]
    width = 0.4
    ax.bar(
        x - width / 2,
        [100 * s.mean for s in sel],
        width,
        yerr=[100 * (s.std if s.n > 1 else 0.0) for s in sel],
        label="test acc. at val-selected round",
        capsize=3,
        color=colors if all(colors) else None,
    )
    ax.bar(
        x + width / 2,
        [100 * s.mean for s in fin],
        width,
        yerr=[100 * (s.std if s.n > 1 else 0.0) for s in fin],
        label="final-round test acc.",
        capsize=3,
        color=colors if all(colors) else None,
        alpha=0.45,
        hatch="//",
    )
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(_wrap(title), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_accuracy_vs(
    groups: Sequence[GroupResult],
    x_key: str,
    keys: Sequence[str],
    path: Path,
    *,
    title: str = "",
    log_x: bool | None = None,
) -> Path:
    """Test accuracy at the selected round against ``x_key``, one line per mechanism.

    Groups are split into lines by every varying key except ``x_key``; a line with a single
    point (a reference run at one value of ``x_key``) is drawn as a horizontal dashed line.

    Raises
    ------
    ValueError
        If no group sets ``x_key``.
    """
    line_keys = [k for k in keys if k != x_key]
    lines: dict[str, list[GroupResult]] = {}
    for g in groups:
        if g.setting.get(x_key) is None:
            continue
        lines.setdefault(group_label(g.setting, line_keys), []).append(g)
    if not lines:
        raise ValueError(f"no run sets {x_key!r}; cannot plot accuracy vs {x_key}")
    all_x = sorted({float(g.setting[x_key]) for ms in lines.values() for g in ms})  # type: ignore[arg-type]
    if log_x is None:
        log_x = x_key == "epsilon" and len(all_x) > 1 and all_x[-1] / max(all_x[0], 1e-12) > 20
    fig = _figure(w=5.5)
    ax = fig.subplots()
    mechs_per_line = {label: {_mech(g) for g in ms} for label, ms in lines.items()}
    one_line_per_mech = all(len(m) == 1 for m in mechs_per_line.values()) and len(
        {next(iter(m)) for m in mechs_per_line.values()}
    ) == len(lines)
    for label, members in lines.items():
        color = _color(_mech(members[0])) if one_line_per_mech else None
        members = sorted(members, key=lambda g: float(g.setting[x_key]))  # type: ignore[arg-type]
        xs = np.array([float(g.setting[x_key]) for g in members])  # type: ignore[arg-type]
        stats = [g.test for g in members]
        mean = np.array([100 * s.mean for s in stats])
        std = np.array([100 * (s.std if s.n > 1 else 0.0) for s in stats])
        if len(members) == 1 and len(all_x) > 1:
            line = ax.axhline(mean[0], linestyle="--", color=color, label=f"{label} (reference)")
            ax.axhspan(mean[0] - std[0], mean[0] + std[0], alpha=0.1, color=line.get_color())
        else:
            ax.errorbar(xs, mean, yerr=std, marker="o", capsize=3, color=color, label=label)
    if x_key in ("d", CLIENTS_KEY):
        _int_ticks(ax)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(_X_LABEL.get(x_key, x_key))
    ax.set_ylabel("test accuracy (%) at val-selected round")
    ax.set_title(_wrap(title), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


# --------------------------------------------------------------------------- MSE figures


def _heat(
    ax: Axes, data: np.ndarray, extent: list[float], vmin: float, vmax: float, title: str
) -> Any:
    im = ax.imshow(
        data.T,
        origin="lower",
        extent=extent,
        vmin=vmin,
        vmax=vmax,
        cmap="viridis",
        aspect="equal",
    )
    ax.set_xlabel("$w_1$")
    ax.set_ylabel("$w_2$")
    ax.set_title(title, fontsize=9)
    return im


def plot_mse_heatmaps(grid: GridMSE, epsilons: Sequence[float], path: Path) -> Path:
    """Heat maps of the pair MSE over ``(w1, w2)``: CorBinQ and LDPQ, measured and closed form.

    One row per ``eps``; the four panels of a row share one colour scale, so measured and
    closed form can be compared by eye (paper Fig. 4).
    """
    rows = [grid.eps_index(e) for e in epsilons]
    fig = _figure(4, len(rows), w=3.4, h=3.0)
    axes = fig.subplots(len(rows), 4, squeeze=False)
    w = grid.w
    half = (w[1] - w[0]) / 2 if len(w) > 1 else 0.5
    extent = [w[0] - half, w[-1] + half, w[0] - half, w[-1] + half]
    for r, k in enumerate(rows):
        panels = [
            (grid.corbin_measured[k], "CorBinQ measured"),
            (grid.corbin_closed[k], "CorBinQ closed form"),
            (grid.ldpq_measured[k], "LDPQ measured"),
            (grid.ldpq_closed[k], "LDPQ closed form"),
        ]
        vmax = float(max(np.max(p) for p, _ in panels))
        im = None
        for c, (data, name) in enumerate(panels):
            im = _heat(axes[r, c], data, extent, 0.0, vmax, f"{name}, ε={grid.epsilons[k]:g}")
        fig.colorbar(im, ax=list(axes[r, :]), shrink=0.8, label="pair MSE")
    return _save(fig, path)


def plot_mse_vs_epsilon(grid: GridMSE, path: Path) -> Path:
    """Grid-averaged pair MSE vs eps_p, measured (± 3 SE) and closed form, both quantizers.

    Left: the MSE averaged over the ``(w1, w2)`` grid (log-log). Right: the ratio
    CorBinQ / LDPQ, measured and closed form, with the 1/2 line of the target check.
    """
    fig = _figure(2, 1, w=5.0)
    ax, ax2 = fig.subplots(1, 2)
    eps = np.asarray(grid.epsilons)
    cm, cse = grid.grid_mean("corbin")
    lm, lse = grid.grid_mean("ldpq")
    cc = grid.corbin_closed.mean(axis=(1, 2))
    lc = grid.ldpq_closed.mean(axis=(1, 2))
    ax.errorbar(eps, cm, yerr=3 * cse, fmt="o", capsize=3, label="CorBinQ measured (±3 SE)")
    ax.plot(eps, cc, "-", label="CorBinQ closed form")
    ax.errorbar(eps, lm, yerr=3 * lse, fmt="s", capsize=3, label="LDPQ measured (±3 SE)")
    ax.plot(eps, lc, "--", label="LDPQ closed form")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("PLDP budget $\\epsilon_p$")
    ax.set_ylabel("pair MSE, mean over $(w_1, w_2)$ grid")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax2.plot(eps, cm / lm, "o", label="measured")
    ax2.plot(eps, cc / lc, "-", label="closed form")
    ax2.axhline(0.5, color="grey", linestyle=":", label="1/2")
    ax2.set_xscale("log")
    ax2.set_xlabel("PLDP budget $\\epsilon_p$")
    ax2.set_ylabel("MSE ratio CorBinQ / LDPQ")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=7)
    return _save(fig, path)


def plot_mse_real_weights(real: RealWeightsMSE, path: Path) -> Path:
    """Per-parameter pair MSE on real CNN weights, per layer: CorBinQ vs LDPQ (measured ± 3 SE
    and closed form), one panel per eps_p (log scale; error bars clipped at zero)."""
    eps = list(real.epsilons)
    ncols = min(3, len(eps))
    nrows = math.ceil(len(eps) / ncols)
    fig = _figure(ncols, nrows, w=max(4.0, 0.45 * len(real.layers) + 2.0), h=3.6)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    x = np.arange(len(real.layers))
    width = 0.4

    def err(mean: np.ndarray, se: np.ndarray) -> np.ndarray:
        return np.vstack([np.minimum(3 * se, 0.99 * mean), 3 * se])

    for k, ax in enumerate(axes.flat):
        if k >= len(eps):
            ax.set_visible(False)
            continue
        cm, cs = real.corbin_measured[k], real.corbin_se[k]
        lm, ls = real.ldpq_measured[k], real.ldpq_se[k]
        ax.bar(x - width / 2, cm, width, yerr=err(cm, cs), capsize=2, label="CorBinQ measured")
        ax.bar(x + width / 2, lm, width, yerr=err(lm, ls), capsize=2, label="LDPQ measured")
        ax.plot(x - width / 2, real.corbin_closed[k], "kD", ms=3, zorder=5, label="closed form")
        ax.plot(x + width / 2, real.ldpq_closed[k], "kD", ms=3, zorder=5)
        ax.set_yscale("log")
        ax.set_xticks(x, real.layers, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("pair MSE per parameter")
        ax.set_title(f"ε={eps[k]:g}", fontsize=9)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return _save(fig, path)

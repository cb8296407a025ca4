"""PNG figures of an experiment (matplotlib's object API on the Agg canvas, no pyplot state).

Every figure says what it shows: a title that starts with what is drawn, then the experiment's
description and the settings all its runs share (:func:`fixed_settings`); a caption with what
the error bars are (one sample std over the seeds) and the y-axis rule (:func:`accuracy_ylim`:
at least ``MIN_Y_SPAN`` points and ``STD_SPAN`` seed stds, so seed noise does not read as a
trend); a legend entry for every line, each mechanism with its privacy guarantee and the threat
models of SECURITY.md it holds against, as its runs' ``summary.json`` states them
(:func:`group_kind`; :data:`THREAT_NOTE` keys the letters). Federated figures
draw the lambda-selected settings (:func:`experiments.results.group_results`); the MSE figures
are in :mod:`experiments.mse`. ``*_figure`` builds a figure, :func:`save` writes it.
"""

from __future__ import annotations

import io
import logging
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from corbin_fl import registry
from corbin_fl.config import MECHANISMS, PAIRED_MECHANISMS, RunConfig
from corbin_fl.experiments.results import GroupResult, Stat, finite, group_label, privacy_view
from corbin_fl.experiments.spec import CLIENTS_KEY, RunValue
from corbin_fl.fsio import atomic_write_bytes
from corbin_fl.mechanisms.accounting import THREAT_MODELS
from corbin_fl.mechanisms.protection import MEANINGFUL_EPS, NO_PROTECTION

logger = logging.getLogger(__name__)

X_KEY_OF_FIGURE = {
    "accuracy-vs-epsilon": "epsilon",
    "accuracy-vs-d": "d",
    "accuracy-vs-dropout": "dropout-prob",
    "accuracy-vs-clients": CLIENTS_KEY,
}
_X_LABEL = {  # the x-axis label and the x-axis in a title
    "epsilon": ("PLDP budget $\\epsilon_p$ (per parameter)", "the per-parameter budget ε_p"),
    "d": ("shared random bits per parameter $d$", "the shared random bits per parameter d"),
    "dropout-prob": ("dropout probability $p$", "the dropout probability p"),
    CLIENTS_KEY: ("number of clients $n$", "the number of clients n"),
}
_ACC_LABEL = "test accuracy (%) at val-selected round"
MIN_Y_SPAN = 20.0
"""Smallest y-axis span of an accuracy line figure, in percentage points."""
STD_SPAN = 5.0
"""An accuracy line figure's y-axis also spans at least this many of its largest seed std."""

THREAT_NOTE = "threat models (SECURITY.md): " + "; ".join(
    f"{key}: {name}" for key, name in THREAT_MODELS.items()
)

PAIRED_KIND = "ε_p per parameter vs one uplink (A) only; no DP vs the server (B)"
LDP_KIND = "ε_p-LDP per parameter vs one uplink (A) and the server (B)"
APPROX_LDP_KIND = "(ε_p, δ)-LDP per parameter vs one uplink (A) and the server (B)"
UPDATE_KIND = "(ε, δ)-DP per client update vs one uplink (A) and the server (B)"
CENTRAL_KIND = "(ε, δ)-DP of the released models (C); trusts the server: no DP vs A, B"
NO_DP_KIND = "no DP vs any threat model (A-D)"
_KINDS: dict[str, tuple[str, str, str, str]] = {
    # guarantee class: DP against (of A, B), bar colour, legend entry, bar label
    PAIRED_KIND: ("A", "tab:blue", "ε_p/param. vs A only; no DP vs B",
                  "ε_p={epsilon:g}/param.\nvs A only;\nno DP vs B"),
    LDP_KIND: ("AB", "tab:green", "ε_p-LDP/param. vs A, B", "ε_p={epsilon:g}/param.\nvs A, B"),
    APPROX_LDP_KIND: ("AB", "tab:purple", "(ε_p, δ)-LDP/param. vs A, B",
                    "(ε_p={epsilon:g}, δ={delta:g})\nper param. vs A, B"),
    UPDATE_KIND: ("AB", "tab:orange", "(ε, δ)-DP/update vs A, B",
                  "(ε={epsilon:g}, δ={delta:g})\nper update vs A, B"),
    CENTRAL_KIND: ("", "tab:red", "(ε, δ) central vs C; no DP vs A, B",
                   "(ε={epsilon:g}, δ={delta:g})\ncentral vs C;\nno DP vs A, B"),
    NO_DP_KIND: ("", "tab:gray", "no DP vs A-D", "no DP vs A-D"),
}  # fmt: skip
DP_AGAINST = {kind: frozenset(v[0]) for kind, v in _KINDS.items()}
"""Of A and B, the threat models each class gives DP against, as the accountant reports them
(``threat_models[key]["dp"]``; a unit test holds them together)."""
GUARANTEE_COLORS = {kind: v[1] for kind, v in _KINDS.items()}
"""One colour per guarantee class in the bar chart (legend order)."""
SHORT_KIND = {kind: v[2] for kind, v in _KINDS.items()}
"""A line's guarantee in a legend entry."""
_RANGED_KINDS = frozenset({PAIRED_KIND, LDP_KIND, APPROX_LDP_KIND, CENTRAL_KIND})
"""Classes whose mechanisms encode within a range (``range-mode`` applies)."""
_KIND_SCOPES = {UPDATE_KIND: "per update", CENTRAL_KIND: "central, all rounds"}
"""What eps bounds for the guarantee classes whose budget is not per parameter."""


@dataclass(frozen=True)
class Guarantee:
    """A setting's guarantee class ``kind`` and its bar ``label`` with the setting's numbers."""

    kind: str
    label: str


def guarantee_kind(mechanism: str) -> str | None:
    """The guarantee class of ``mechanism`` from its registration (``None`` if unknown)."""
    if (mech := registry.REGISTRY.get(mechanism)) is None:
        return None
    if not mech.local_dp:
        return CENTRAL_KIND if mech.has_delta else NO_DP_KIND
    if mech.pairs:
        return PAIRED_KIND
    return (
        UPDATE_KIND if mech.dp_unit == "update" else APPROX_LDP_KIND if mech.has_delta else LDP_KIND
    )


def independent_share(mechanism: object) -> bool:
    """Whether ``mechanism`` is registered with an independent share (``gamma`` applies)."""
    entry = registry.REGISTRY.get(str(mechanism))
    return entry is not None and entry.independent_share


def scopes() -> dict[str, str]:
    """What eps bounds for each registered mechanism whose budget is not per parameter (by its
    guarantee class, :data:`_KIND_SCOPES`), in registration order."""
    kinds = {name: guarantee_kind(name) for name in registry.REGISTRY}
    return {name: _KIND_SCOPES[k] for name, k in kinds.items() if k in _KIND_SCOPES}


def report_kind(report: Mapping[str, Any] | None) -> str | None:
    """The guarantee class a run's privacy report states (``summary.json``'s ``privacy``, as
    :func:`experiments.results.privacy_view` reads it), from the threat models whose entry
    says ``dp``: A and B, with a per-parameter delta > 0 (Gaussian), a per-parameter eps alone
    (LDP) or per update (no per-parameter entry); A alone (paired); neither: C (central) or
    none (no DP). ``None`` without threat models, or with B and not A (no class of these)."""
    tm = report.get("threat_models") if isinstance(report, Mapping) else None
    if not isinstance(tm, Mapping):
        return None
    dp = {k for k, e in tm.items() if isinstance(e, Mapping) and e.get("dp") is True}
    if {"A", "B"} <= dp:
        if not isinstance(pp := tm["A"].get("per_parameter"), Mapping):
            return UPDATE_KIND
        return APPROX_LDP_KIND if finite(pp.get("delta"), 0.0) else LDP_KIND
    if "B" in dp:
        return None
    return PAIRED_KIND if "A" in dp else CENTRAL_KIND if "C" in dp else NO_DP_KIND


def group_kind(g: GroupResult) -> str | None:
    """The guarantee class of a setting as its runs' ``summary.json`` states it
    (:func:`report_kind`); for runs without a privacy report, its mechanism's
    (:func:`guarantee_kind`)."""
    run = next((r for r in g.runs if r.summary.get("privacy")), None)
    kind = report_kind(privacy_view(run.summary)) if run is not None else None
    return kind if kind is not None else guarantee_kind(_mech(g))


def guarantee(setting: Mapping[str, RunValue], kind: str | None = None) -> Guarantee:
    """The guarantee of a setting of class ``kind`` (by default its mechanism's,
    :func:`guarantee_kind`) with its ``epsilon`` and ``delta``; ``ValueError`` without a
    known class or a finite number its label needs."""
    if not isinstance(mech := setting.get("mechanism"), str):
        raise ValueError(f"the setting names no mechanism ({mech!r}); cannot state its guarantee")
    if (kind := kind or guarantee_kind(mech)) is None:
        known = sorted(registry.REGISTRY)
        raise ValueError(f"no privacy guarantee is known for mechanism {mech!r}; known: {known}")
    label = _KINDS[kind][3]
    numbers = {key: finite(setting.get(key)) for key in ("epsilon", "delta") if "{" + key in label}
    if (key := next((k for k, v in numbers.items() if v is None), None)) is not None:
        raise ValueError(
            f"mechanism {mech!r}: the run config has no finite {key!r} ({setting.get(key)!r}); "
            "cannot state its privacy guarantee"
        )
    return Guarantee(kind, label.format(**numbers))


def _mech(g: GroupResult) -> str:
    return str(g.setting.get("mechanism", "run"))


def _fmt(value: RunValue) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_TITLE_KEYS = (  # a setting in a figure title: its key and its name
    ("mechanism", "mechanism"), ("dataset", "dataset"), ("model", "model"),
    ("partitioner", "partition"), (CLIENTS_KEY, "clients"), ("clients-per-round", "clients/round"),
    ("num-rounds", "rounds"), ("local-epochs", "local epochs"), ("batch-size", "batch"),
)  # fmt: skip


def fixed_settings(groups: Sequence[GroupResult], keys: Sequence[str]) -> str:
    """The settings every plotted group shares, e.g. ``"dataset=mnist, clients=10, ..."``.

    A key not among the varying ``keys`` is listed when every group that sets it sets the same
    value, and only where it applies (``d`` with a paired mechanism, ``γ`` with AugCorBin,
    ``δ`` with a guarantee that has one, ``R`` where settings quantize the update, dropout and
    clients per round when not 0); eps is ``ε_p`` when every private mechanism has a
    per-parameter budget.
    """
    mechs = {_mech(g) for g in groups}
    kinds = {_mech(g): group_kind(g) for g in groups}
    private = {m for m, kind in kinds.items() if kind not in (NO_DP_KIND, None)}

    def fixed(key: str) -> RunValue | None:
        values = {repr(g.setting[key]): g.setting[key] for g in groups if key in g.setting}
        return next(iter(values.values())) if len(values) == 1 and key not in keys else None

    def named(key: str, name: str, applies: object = True) -> list[str]:
        value = fixed(key)
        zero = key in ("clients-per-round", "dropout-prob") and value == 0  # left out when 0
        return [f"{name}={_fmt(value)}"] if value is not None and applies and not zero else []

    parts = [part for key, name in _TITLE_KEYS for part in named(key, name)]
    if (eps := fixed("epsilon")) is not None and private:
        scope = scopes()
        special = sorted(private & set(scope))
        rest = "; ".join(f"{m}: {scope[m]}" for m in special)
        parts.append(
            f"ε={_fmt(eps)} {scope[special[0]]}"
            if len(private) == 1 and special
            else f"ε={_fmt(eps)} (per parameter; {rest})"
            if special
            else f"ε_p={_fmt(eps)}"
        )
    parts += named("delta", "δ", any(registry.REGISTRY[m].has_delta for m in private))
    parts += named("d", "d", mechs & PAIRED_MECHANISMS)
    parts += named("gamma", "γ", any(independent_share(m) for m in mechs))
    ranged = any(kind in _RANGED_KINDS for kind in kinds.values())
    parts += named("range-mode", "range-mode", ranged)
    range_mode, radius = fixed("range-mode"), fixed("update-radius")  # radius: where quantized
    if radius is not None and range_mode in ("update", None):
        text = "derived" if radius == 0 else _fmt(radius)
        parts.append(f"R={text}" if range_mode == "update" else f"R={text} (update range)")
    return ", ".join(parts + named("dropout-prob", "dropout"))


def figure_title(
    shows: str, description: str, groups: Sequence[GroupResult], keys: Sequence[str]
) -> str:
    """What the figure ``shows``, then ``experiment: <description>`` and ``fixed: <...>``."""
    fixed = fixed_settings(groups, keys)
    lines = (shows, description and f"experiment: {description}", fixed and f"fixed: {fixed}")
    return "\n".join(t for t in lines if t)


def seed_note(groups: Sequence[GroupResult], what: str = "error bars") -> str:
    """``"<what>: ± 1 sample std (ddof=1) over 3 seeds (0, 1, 2)"``, or that there is one seed."""
    counts = sorted({len(g.runs) for g in groups})
    seeds = ", ".join(map(str, sorted({r.seed for g in groups for r in g.runs})))
    if not counts or counts[-1] < 2:
        return f"one seed per setting ({seeds}): no {what}"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{what}: ± 1 sample std (ddof=1) over {n} seeds ({seeds})"


Y_RULE = (
    f"y-axis spans ≥ {MIN_Y_SPAN:g} points and ≥ {STD_SPAN:g} × the largest seed std, "
    "so seed noise does not read as a trend"
)
_LINE_NOTE = f"{Y_RULE}; [ ]: the mechanism's guarantee; {THREAT_NOTE}"
"""The end of a line figure's caption."""


def accuracy_ylim(lo: float, hi: float, max_std: float) -> tuple[float, float]:
    """y-limits (percent) for accuracies in ``[lo, hi]``: a span of ``max(1.1 (hi - lo),
    MIN_Y_SPAN, STD_SPAN * max_std)`` centred on the data, shifted into ``[0, 100]``."""
    if not all(math.isfinite(v) for v in (lo, hi, max_std)) or lo > hi:
        raise ValueError(f"accuracy range [{lo}, {hi}] with std {max_std} is not a finite range")
    span = max(1.1 * (hi - lo), MIN_Y_SPAN, STD_SPAN * max(max_std, 0.0))
    span = min(span, 100.0) if lo >= 0.0 and hi <= 100.0 else span
    bottom, top = (lo + hi) / 2 - span / 2, (lo + hi) / 2 + span / 2
    if bottom < 0.0 <= lo:
        bottom, top = 0.0, span
    if top > 100.0 >= hi:
        bottom, top = 100.0 - span, 100.0
    return bottom, top


_Bands = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
"""The ``(low, high, seed std)`` of the error bars or bands a figure draws, in percent."""


def _ylim(bands: _Bands) -> tuple[float, float]:
    """:func:`accuracy_ylim` of the accuracies a figure draws."""
    lo, hi = min(float(np.min(b[0])) for b in bands), max(float(np.max(b[1])) for b in bands)
    return accuracy_ylim(lo, hi, max(0.0, *(float(np.max(b[2])) for b in bands)))


def _percent(stats: Sequence[Stat], bands: _Bands) -> tuple[np.ndarray, np.ndarray]:
    """Means and seed stds (0 for one seed) of accuracy ``stats``, in percent; their error bars
    are added to ``bands``."""
    mean = np.array([100 * s.mean for s in stats])
    std = np.array([100 * s.spread for s in stats])
    bands.append((mean - std, mean + std, std))
    return mean, std


def new_figure(
    n: int = 1, max_cols: int = 1, *, w: float = 5.0, h: float = 3.6, **kw: Any
) -> tuple[Figure, list[Axes]]:
    """A figure of ``n`` panels of ``w`` x ``h`` inches, at most ``max_cols`` per row (``kw``
    go to ``subplots``), and its panels row by row."""
    ncols = min(max_cols, n)
    fig = Figure(figsize=(w * ncols, h * math.ceil(n / ncols)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(math.ceil(n / ncols), ncols, squeeze=False, **kw).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def annotate(fig: Figure, title: str, caption: str, *, caption_ax: Axes | None = None) -> None:
    """Title on top, caption under the plot (the x-label of ``caption_ax`` if given), wrapped
    to the figure's width (about 12 characters per inch at 10 pt, 15 at 8 pt); the figure grows
    by their lines."""

    def wrap(text: str, width: int) -> str:  # existing line breaks are kept
        return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))

    title = wrap(title, max(40, int(fig.get_figwidth() * 12))) if title else ""
    caption = wrap(caption, max(50, int(fig.get_figwidth() * 15))) if caption else ""
    if title:
        fig.suptitle(title, fontsize=10)
    if caption:
        (fig.supxlabel if caption_ax is None else caption_ax.set_xlabel)(caption, fontsize=8)
    lines = sum(text.count("\n") + 1 for text in (title, caption) if text)
    fig.set_figheight(fig.get_figheight() + 0.17 * lines)


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to the PNG ``path`` (atomically, folders created); return ``path``."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    atomic_write_bytes(path, png.getvalue())
    logger.info("wrote %s", path)
    return Path(path)


def _mech_order(mech: str) -> int:
    return MECHANISMS.index(mech) if mech in MECHANISMS else len(MECHANISMS)


def _color(mech: str) -> str | None:
    """One colour per mechanism in every line figure (matplotlib's ``C0``..``C9`` cycle)."""
    return f"C{_mech_order(mech) % 10}" if mech in MECHANISMS else None


def _with_kind(label: str, g: GroupResult) -> str:
    """``label`` followed by the short guarantee class of setting ``g`` (if known,
    :func:`group_kind`)."""
    kind = group_kind(g)
    return f"{label} [{SHORT_KIND[kind]}]" if kind is not None else label


def legend_outside(fig: Figure, handles: Sequence[Any], labels: Sequence[str]) -> None:
    """The figure's legend right of its axes, ``loc="outside right center"`` (the constrained
    layout makes room for it; a legend at the top would overlap the title, which the layout
    does not stack with it); the figure grows by the legend's drawn width so that the axes
    keep theirs. Call it once the title and caption are wrapped (:func:`annotate`)."""
    if not labels:
        return
    legend = fig.legend(handles, labels, fontsize=7, loc="outside right center")
    fig.draw_without_rendering()  # lays the legend out: its width in inches below
    size = legend.get_window_extent().transformed(fig.dpi_scale_trans.inverted())
    fig.set_figwidth(fig.get_figwidth() + size.width)


def _check_groups(groups: Sequence[GroupResult]) -> None:
    if not groups:
        raise ValueError("no settings to plot (no finished run)")


def accuracy_vs_round_figure(
    groups: Sequence[GroupResult], keys: Sequence[str], *, title: str = ""
) -> Figure:
    """Test accuracy (mean ± std over seeds) per round, one line per mechanism, one panel per
    value of the other varying keys (one y-axis); ``ValueError`` if ``groups`` is empty."""
    _check_groups(groups)
    other = [k for k in keys if k != "mechanism"]
    facets: dict[str, list[GroupResult]] = {}
    for g in groups:
        facets.setdefault(group_label(g.setting, other) if other else "", []).append(g)
    fig, axes = new_figure(len(facets), 4, sharey=True)
    bands: _Bands = []
    for ax, (facet, members) in zip(axes, facets.items(), strict=True):
        for g in members:
            rounds, mean, std = g.curve("test_accuracy")
            if rounds.size == 0:
                continue
            label = _with_kind(f"{_mech(g)} (λ={g.global_lr:g})", g)
            line = ax.plot(rounds, 100 * mean, marker=".", color=_color(_mech(g)), label=label)
            low, high = 100 * (mean - std), 100 * (mean + std)
            ax.fill_between(rounds, low, high, alpha=0.2, color=line[0].get_color())
            bands.append((low, high, 100 * std))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="round", ylabel="test accuracy (%)")
        if facet:
            ax.set_title(facet, fontsize=9)
        ax.grid(alpha=0.3)
        if len(facets) > 1:
            ax.legend(fontsize=7)
    if bands:
        axes[0].set_ylim(*_ylim(bands))
    annotate(
        fig,
        figure_title("Test accuracy per round", title, groups, keys),
        f"lines: mean test accuracy; {seed_note(groups, 'bands')}; λ: the validation-selected "
        f"global learning rate; {_LINE_NOTE}",
    )
    if len(facets) == 1:
        legend_outside(fig, *axes[0].get_legend_handles_labels())
    return fig


def accuracy_bar_figure(
    groups: Sequence[GroupResult], keys: Sequence[str], *, title: str = ""
) -> Figure:
    """Bars of the test accuracy at the selected and at the final round (± std), coloured and
    labelled by the guarantee (:func:`guarantee`), ordered by class; ``ValueError`` if
    ``groups`` is empty or a guarantee cannot be stated."""
    _check_groups(groups)
    order = list(GUARANTEE_COLORS)  # bars of one guarantee class side by side, classes in order
    pairs = sorted(
        [(g, guarantee(g.setting, group_kind(g))) for g in groups],
        key=lambda p: order.index(p[1].kind),
    )
    groups = [g for g, _ in pairs]
    labels = [  # one varying key per line, then the guarantee
        "\n".join([*group_label(g.setting, keys).split(", "), gu.label]) for g, gu in pairs
    ]
    x = np.arange(len(groups))
    fig, (ax,) = new_figure(w=max(6.0, 1.25 * len(groups) + 1.5), h=4.2)
    style: dict[str, Any] = {"capsize": 3, "edgecolor": "black", "linewidth": 0.5}
    style["color"] = [GUARANTEE_COLORS[gu.kind] for _, gu in pairs]
    hatched: dict[str, Any] = {"alpha": 0.45, "hatch": "//"}
    stats = [g.test for g in groups], [g.final_test for g in groups]
    for offset, stat, extra in zip((-0.2, 0.2), stats, ({}, hatched), strict=True):
        mean, std = _percent(stat, [])
        ax.bar(x + offset, mean, 0.4, yerr=std, **style, **extra)
    tops = [100 * (s.mean + s.spread) for s in (*stats[0], *stats[1]) if s.n]
    ax.set_ylim(0.0, max([100.0, *tops]))
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(axis="y", alpha=0.3)
    kinds = [k for k in GUARANTEE_COLORS if k in {gu.kind for _, gu in pairs}]
    handles = [Patch(facecolor=GUARANTEE_COLORS[k], edgecolor="black", label=k) for k in kinds]
    handles += [
        Patch(facecolor="white", edgecolor="black", label="test acc. at val-selected round"),
        Patch(facecolor="white", edgecolor="black", hatch="//", label="final-round test acc."),
    ]
    what = "colour: privacy guarantee of the mechanism; hatch: which round"
    fig.legend(
        handles=handles, loc="outside lower center", ncols=2, title=what, fontsize=7,
        title_fontsize=7,
    )  # fmt: skip
    shows = "Test accuracy per mechanism at the val-selected and the final round"
    annotate(
        fig,
        figure_title(shows, title, groups, keys),
        f"bars: mean over seeds; {seed_note(groups)}. ε_p bounds one parameter, ε one whole "
        "update: the numbers under the bars are not one unit and do not rank the mechanisms' "
        f"privacy; {THREAT_NOTE}",
        caption_ax=ax,
    )
    return fig


def accuracy_vs_figure(
    groups: Sequence[GroupResult], x_key: str, keys: Sequence[str], *, title: str = ""
) -> Figure:
    """Test accuracy at the selected round against ``x_key``, one line per value of the other
    varying keys; a line of one point (a reference) is a dashed horizontal line with a ± 1 std
    band. ``ValueError`` if no group sets ``x_key`` or none has a test accuracy."""

    def x_of(g: GroupResult) -> float:
        return float(g.setting[x_key])

    lines: dict[str, list[GroupResult]] = {}
    for g in groups:
        if g.setting.get(x_key) is not None:
            lines.setdefault(group_label(g.setting, [k for k in keys if k != x_key]), []).append(g)
    if not lines:
        raise ValueError(f"no run sets {x_key!r}; cannot plot accuracy vs {x_key}")
    all_x = sorted({x_of(g) for ms in lines.values() for g in ms})
    fig, (ax,) = new_figure(w=5.5)
    mechs_per_line = {label: {_mech(g) for g in ms} for label, ms in lines.items()}
    mechs = [m for ms in mechs_per_line.values() for m in ms]
    one_line_per_mech = len(mechs) == len(set(mechs)) == len(lines)  # each its own mechanism
    handles: list[Any] = []
    labels: list[str] = []
    bands: _Bands = []
    plotted: list[GroupResult] = []
    for label, members in lines.items():
        mech = _mech(members[0])
        color = _color(mech) if one_line_per_mech else None
        label = _with_kind(label, members[0]) if mechs_per_line[label] == {mech} else label
        if not (members := [g for g in sorted(members, key=x_of) if g.test.n]):
            continue
        plotted += members
        mean, std = _percent([g.test for g in members], bands)
        if len(members) == 1 and len(all_x) > 1:
            line = ax.axhline(mean[0], linestyle="--", color=color)
            band = ax.axhspan(mean[0] - std[0], mean[0] + std[0], alpha=0.1, color=line.get_color())
            handles.append((line, Patch(color=band.get_facecolor())))
            labels.append(f"{label}: reference, not swept over {x_key} (band ± 1 std)")
        else:
            xs = np.array([x_of(g) for g in members])
            handles.append(ax.errorbar(xs, mean, yerr=std, marker="o", capsize=3, color=color))
            labels.append(label)
    if not plotted:
        raise ValueError(f"no finished test accuracy to plot against {x_key!r}")
    if x_key in ("d", CLIENTS_KEY):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if x_key == "epsilon" and len(all_x) > 1 and all_x[-1] / max(all_x[0], 1e-12) > 20:
        ax.set_xscale("log")
    x_label, x_title = _X_LABEL.get(x_key, (x_key, x_key))
    rest = "; ".join(
        f"{m}: {scope.split(',')[0]}"
        for m, scope in scopes().items()
        if m in {_mech(g) for g in plotted}
    )
    if x_key == "epsilon" and rest:
        x_label = f"privacy budget $\\epsilon$ ($\\epsilon_p$ per parameter; {rest})"
    ax.set(xlabel=x_label, ylabel=_ACC_LABEL, ylim=_ylim(bands))
    ax.grid(alpha=0.3)
    annotate(
        fig,
        figure_title(f"Test accuracy vs {x_title}", title, groups, keys),
        f"points: mean test accuracy at each run's validation-selected round; "
        f"{seed_note(plotted)}; {_LINE_NOTE}",
    )
    legend_outside(fig, handles, labels)
    return fig


def bits_per_parameter(setting: Mapping[str, RunValue]) -> int | None:
    """Uplink bits per parameter of a setting's mechanism, from its registered wire format
    (``corbin``: its one bit, the shared randomness aside); None without a mechanism."""
    mech = setting.get("mechanism")
    if not isinstance(mech, str) or mech not in registry.REGISTRY:
        return None
    fields = set(RunConfig.keys())
    cfg = RunConfig.from_flower(
        {"range-mode": "update", **{k: v for k, v in setting.items() if k in fields}}
    )
    _, dtype, length = registry.get(mech).wire(8, cfg)  # 8 parameters fill whole bytes
    return int(length * dtype.itemsize)  # 8 parameters' bytes = bits per parameter


def accuracy_vs_bits_figure(
    groups: Sequence[GroupResult], keys: Sequence[str], *, title: str = ""
) -> Figure:
    """Test accuracy against uplink bits per parameter, one panel per eps_p, one line per
    mechanism (the paired ones a star at their one bit); ``ValueError`` if no group has a
    mechanism, an epsilon and a finished test accuracy."""
    _check_groups(groups)
    panels: dict[float, dict[str, list[tuple[int, GroupResult]]]] = {}
    for g in groups:
        eps, bits = g.setting.get("epsilon"), bits_per_parameter(g.setting)
        if bits is not None and isinstance(eps, int | float) and g.test.n:
            panels.setdefault(float(eps), {}).setdefault(_mech(g), []).append((bits, g))
    if not panels:
        raise ValueError("no finished run with a mechanism and an epsilon to plot")
    fig, axes = new_figure(len(panels), len(panels), w=3.6, sharey=True)
    bands: _Bands = []
    handles: dict[str, Any] = {}
    mechs = sorted({m for panel in panels.values() for m in panel}, key=_mech_order)
    for ax, eps in zip(axes, sorted(panels), strict=True):
        for mech, points in sorted(panels[eps].items(), key=lambda kv: _mech_order(kv[0])):
            points.sort(key=lambda p: p[0])
            mean, std = _percent([g.test for _, g in points], bands)
            marker, size = ("*", 9) if mech in PAIRED_MECHANISMS else ("o", 5)
            color = f"C{mechs.index(mech) % 10}"  # distinct within this figure
            xs = np.array([b for b, _ in points], dtype=float)
            handles[mech] = ax.errorbar(
                xs, mean, yerr=std, marker=marker, markersize=size, capsize=3, color=color
            )
        ax.set_title(f"ε_p = {_fmt(eps)}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    all_bits = sorted({b for panel in panels.values() for ps in panel.values() for b, _ in ps})
    for ax in axes:
        ax.set_xticks(all_bits, [str(b) for b in all_bits])
        ax.set_xlabel("uplink bits per parameter")
    axes[0].set_ylabel(_ACC_LABEL)
    axes[0].set_ylim(*_ylim(bands))
    first = {m: ps[0][1] for panel in panels.values() for m, ps in panel.items()}
    labels = [
        _with_kind(f"{m}, 1 bit + shared randomness" if m in PAIRED_MECHANISMS else m, first[m])
        for m in handles
    ]
    plotted = [g for panel in panels.values() for ps in panel.values() for _, g in ps]
    shows = "Test accuracy vs uplink bits per parameter, one panel per ε_p"
    annotate(
        fig,
        figure_title(shows, title, groups, [k for k in keys if k != "epsilon"]),
        "one panel per eps_p; points: mean test accuracy at each run's validation-selected "
        f"round against the mechanism's uplink bits per parameter; {seed_note(plotted)}; "
        f"{_LINE_NOTE}",
    )
    # Then the legend beside the panels, once title and caption are wrapped to their width.
    legend_outside(fig, list(handles.values()), labels)
    return fig


def uplink_bits(g: GroupResult) -> float:
    """Uplink bits per parameter of a setting as its first run measured them: bytes up (every
    stage) per client and round, from ``metrics.jsonl``, over the run's ``num_params``."""
    run = g.runs[0]
    clients = sum(finite(row.get("participants")) or 0.0 for row in run.rows)
    return 8 * run.uplink_bytes / (clients * float(run.summary["num_params"]))


def accuracy_vs_server_eps_figure(
    groups: Sequence[GroupResult], keys: Sequence[str], *, title: str = ""
) -> Figure:
    """Test accuracy against the eps of the whole run against the server (threat model B, log
    x), one point per setting; the settings without one in a 'no DP' panel at the right; each
    point's legend entry gives its uplink bits per parameter (:func:`uplink_bits`) and, with
    secure aggregation, the width b of its masked symbols (``metrics.jsonl``)."""
    _check_groups(groups)
    shown = [g for g in groups if g.test.n]
    eps = [g.privacy("server_eps_run") for g in shown]
    fig, axes = new_figure(2, 2, w=3.2, sharey=True, gridspec_kw={"width_ratios": [2.2, 1]})
    bands: _Bands = []
    handles: list[Any] = []
    labels: list[str] = []
    no_dp: list[str] = []  # the names in the right panel, left to right
    label_keys = [k for k in keys if k != "secure-aggregation"]
    for i, (g, e) in enumerate(zip(shown, eps, strict=True)):
        mean, std = _percent([g.test], bands)
        name = group_label(g.setting, label_keys)
        ax, x = (axes[0], e) if e is not None else (axes[1], float(len(no_dp := [*no_dp, name])))
        style: dict[str, Any] = {"marker": "os^Dv<>p"[i % 8], "color": f"C{i % 10}", "capsize": 3}
        handles.append(ax.errorbar([x], mean, yerr=std, **style))
        sa = g.runs[0].rows[0].get("secure_aggregation")  # its b-bit masked symbols
        name += f" + SecAgg, b = {sa['b']}" if isinstance(sa, Mapping) else ""
        labels.append(f"{name}: {uplink_bits(g):.3g} bits/param")
    delta = _fmt(shown[0].setting.get("delta", "?")) if shown else "?"
    above = [e for e in eps if e is not None and e > MEANINGFUL_EPS]
    if above:  # shade where the run's eps bounds nothing (mechanisms/protection.py)
        axes[0].axvspan(MEANINGFUL_EPS, 3 * max(above), color="0.9", zorder=0)
        axes[0].text(
            MEANINGFUL_EPS * 1.1, 0.02, f"ε > {MEANINGFUL_EPS:g}: {NO_PROTECTION}",
            transform=axes[0].get_xaxis_transform(), fontsize=7, color="0.35",
        )  # fmt: skip
    axes[0].set(xscale="log", xlabel=f"ε against the server (B) over the run, δ = {delta}")
    axes[0].set_ylabel(_ACC_LABEL)
    axes[1].set(xlim=(0.5, len(no_dp) + 0.5), xlabel="no (ε, δ) against the server")
    axes[1].set_xticks(range(1, len(no_dp) + 1), no_dp, rotation=30, fontsize=7, ha="right")
    axes[0].set_ylim(*_ylim(bands))
    for ax in axes:
        ax.grid(alpha=0.3)
    annotate(
        fig,
        figure_title("Test accuracy vs the guarantee against the server (B)", title, shown, keys),
        "points: mean test accuracy at each run's validation-selected round against the run's "
        "ε vs the server (SECURITY.md threat model B; with SecAgg it sees only the sum); "
        + (
            f"shaded: ε > {MEANINGFUL_EPS:g}, formally DP and practically none "
            f"({NO_PROTECTION}: mechanisms/protection.py); "
            if above
            else ""
        )
        + f"{seed_note(shown)}; bits/param: uplink bytes per client and round (all stages) × 8 / m",
    )
    legend_outside(fig, handles, labels)
    return fig

"""The flat-vector view of a model that the mechanisms work on, and the layer-wise ranges.

The mechanisms quantize one float32 vector ``w`` of length ``m``: the model's floating-point
``state_dict`` entries (parameters and float buffers such as BatchNorm running statistics; integer
buffers such as ``num_batches_tracked`` are skipped), flattened in ``state_dict`` order. A *layer*
is one such entry; the paper's center/radius are layer-wise (arXiv 2409.13133, Sec. V-2: "The
center and radius are shared by the server at each round based on the layer-wise minimum and
maximum parameter values in the previous round"), see :func:`layer_center_radius`.

This is the building block's array layout: any model, any task. This project's own models are in
``corbin_fl.app.models``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from corbin_fl.mechanisms.validate import require, why_interval

__all__ = [
    "ParamLayout",
    "RangeBlock",
    "expand_per_element",
    "flatten",
    "layer_center_radius",
    "layer_ids",
    "layout_of",
    "load_flat",
    "range_blocks",
]


# --------------------------------------------------------------------------- flat view
@dataclass(frozen=True)
class ParamLayout:
    """Where each floating-point ``state_dict`` entry lives in the flat vector.

    Attributes
    ----------
    names : tuple of str
        ``state_dict`` keys, in order.
    shapes : tuple of tuple of int
        Their shapes.
    offsets : tuple of int
        Start of each entry in the flat vector (``offsets[0] = 0``).
    sizes : tuple of int
        Number of elements of each entry.
    m : int
        Total length ``sum(sizes)``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    m: int

    def __post_init__(self) -> None:
        n = len(self.names)
        if n == 0:
            raise ValueError("a ParamLayout needs at least one layer")
        if not len(self.shapes) == len(self.offsets) == len(self.sizes) == n:
            raise ValueError("names, shapes, offsets and sizes must have the same length")
        if len(set(self.names)) != n:
            raise ValueError("layer names must be unique")
        expected = 0
        for name, shape, off, size in zip(
            self.names, self.shapes, self.offsets, self.sizes, strict=True
        ):
            if size != math.prod(shape) or size < 1:
                raise ValueError(f"layer {name!r}: size {size} does not match shape {shape}")
            if off != expected:
                raise ValueError(f"layer {name!r}: offset {off}, expected {expected}")
            expected += size
        if self.m != expected:
            raise ValueError(f"m = {self.m} but the layers hold {expected} elements")

    @property
    def num_layers(self) -> int:
        """Number of entries (layers) ``L``."""
        return len(self.names)

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the names and shapes: equal layouts have equal fingerprints."""
        h = hashlib.sha256()
        for name, shape in zip(self.names, self.shapes, strict=True):
            h.update(f"{name}:{','.join(map(str, shape))};".encode())
        return h.hexdigest()


def _float_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def layout_of(model: nn.Module) -> ParamLayout:
    """The :class:`ParamLayout` of ``model``'s floating-point ``state_dict`` entries.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    ParamLayout
    """
    entries = _float_entries(model)
    if not entries:
        raise ValueError("the model has no floating-point parameters or buffers")
    sizes = tuple(int(v.numel()) for _, v in entries)
    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += s
    return ParamLayout(
        names=tuple(k for k, _ in entries),
        shapes=tuple(tuple(int(d) for d in v.shape) for _, v in entries),
        offsets=tuple(offsets),
        sizes=sizes,
        m=total,
    )


def flatten(model: nn.Module) -> torch.Tensor:
    """The model's floating-point ``state_dict`` as one float32 vector ``w`` of length ``m``.

    ``w[offsets[l] : offsets[l] + sizes[l]] = state_dict[names[l]].reshape(-1)`` for every layer
    ``l`` of :func:`layout_of`.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    torch.Tensor
        float32, shape ``(m,)``, on the model's device, detached (a copy).
    """
    entries = _float_entries(model)
    if not entries:
        raise ValueError("the model has no floating-point parameters or buffers")
    return torch.cat([v.detach().reshape(-1).to(torch.float32) for _, v in entries])


def _check_vec(vec: object, layout: ParamLayout, what: str = "vec") -> torch.Tensor:
    if not isinstance(vec, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(vec).__name__}")
    if not vec.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor, got {vec.dtype}")
    if vec.ndim != 1 or vec.numel() != layout.m:
        raise ValueError(f"{what} must have shape ({layout.m},), got {tuple(vec.shape)}")
    return vec


def load_flat(model: nn.Module, vec: torch.Tensor) -> None:
    """Copy a flat vector into the model's floating-point ``state_dict`` (inverse of flatten).

    Parameters
    ----------
    model : torch.nn.Module
        Updated in place; integer buffers are left unchanged.
    vec : torch.Tensor
        Floating-point, shape ``(m,)``, all finite; any device (copied to the model's).

    Raises
    ------
    TypeError
        ``vec`` is not a floating-point tensor.
    ValueError
        Wrong length or non-finite entries (the model is then left unchanged).
    """
    layout = layout_of(model)
    _check_vec(vec, layout)
    if not bool(torch.isfinite(vec).all()):
        bad = int((~torch.isfinite(vec)).sum())
        raise ValueError(f"vec has {bad} non-finite entries")
    state = dict(_float_entries(model))
    with torch.no_grad():
        for name, shape, off, size in zip(
            layout.names, layout.shapes, layout.offsets, layout.sizes, strict=True
        ):
            state[name].copy_(vec[off : off + size].reshape(shape))


def layer_ids(layout: ParamLayout, device: torch.device | str | None = None) -> torch.Tensor:
    """Layer index of every element of the flat vector.

    Parameters
    ----------
    layout : ParamLayout
    device : torch.device or str, optional

    Returns
    -------
    torch.Tensor
        int64, shape ``(m,)``: ``ids[j] = l`` for ``offsets[l] <= j < offsets[l] + sizes[l]``.
    """
    sizes = torch.tensor(layout.sizes, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(layout.num_layers, device=device), sizes)


def layer_center_radius(
    vec: torch.Tensor,
    layout: ParamLayout,
    margin: float = 0.0,
    min_radius: float = 1e-3,
    quantile: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-wise center and radius of a flat vector (paper, Sec. V-2).

    For layer ``l`` with values ``v_l``, ``lo_l = Q_{1-q}(v_l)`` and ``hi_l = Q_q(v_l)`` (with the
    default ``q = 1``: ``min v_l`` and ``max v_l``, the paper's rule), ``c_l = (hi_l + lo_l) / 2``
    and ``r_l = max((hi_l - lo_l) / 2 * (1 + margin), min_radius)``. With ``q = 1`` every value of
    the layer lies in ``[c_l - r_l, c_l + r_l]`` (the interval the quantizers of Alg. 1 and 2
    need); with ``q < 1`` the outer ``1 - q`` tails on each side are left out (and clipped by the
    clients).

    Parameters
    ----------
    vec : torch.Tensor
        Floating-point, shape ``(m,)``, finite.
    layout : ParamLayout
    margin : float
        Relative enlargement of the radius, ``>= 0`` (room for the local updates to move).
    min_radius : float
        Lower bound on the radius, ``> 0`` (a constant layer gets ``min_radius``).
    quantile : float
        ``q`` in (0.5, 1]; ``1`` is min/max.

    Returns
    -------
    (c_layer, r_layer) : tuple of torch.Tensor
        float32, shape ``(L,)`` each, on ``vec``'s device.

    Raises
    ------
    TypeError, ValueError
        Wrong type, length, non-finite values, negative margin or non-positive min_radius.
    """
    _check_vec(vec, layout)
    if isinstance(margin, bool) or not isinstance(margin, int | float):
        raise TypeError(f"margin must be a float, got {type(margin).__name__}")
    if isinstance(min_radius, bool) or not isinstance(min_radius, int | float):
        raise TypeError(f"min_radius must be a float, got {type(min_radius).__name__}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be finite and >= 0, got {margin}")
    if not (math.isfinite(min_radius) and min_radius > 0):
        raise ValueError(f"min_radius must be finite and > 0, got {min_radius}")
    if not bool(torch.isfinite(vec).all()):
        raise ValueError("vec has non-finite entries")
    if isinstance(quantile, bool) or not isinstance(quantile, int | float):
        raise TypeError(f"quantile must be a float, got {type(quantile).__name__}")
    require("quantile", why_interval(quantile, 0.5, 1, lo_open=True))
    v = vec.to(torch.float32)
    mins, maxs = [], []
    for off, size in zip(layout.offsets, layout.sizes, strict=True):
        layer = v[off : off + size]
        if quantile < 1.0:
            k_lo = max(1, math.floor((1.0 - quantile) * size) + 1)  # order statistics, 1-based
            k_hi = min(size, math.ceil(quantile * size))
            lo, hi = torch.kthvalue(layer, k_lo).values, torch.kthvalue(layer, k_hi).values
        else:
            lo, hi = torch.aminmax(layer)
        mins.append(lo)
        maxs.append(hi)
    lo_t, hi_t = torch.stack(mins), torch.stack(maxs)
    center = (hi_t + lo_t) / 2
    radius = ((hi_t - lo_t) / 2 * (1.0 + float(margin))).clamp_min(float(min_radius))
    return center, radius


@dataclass(frozen=True)
class RangeBlock:
    """A contiguous run ``[lo, hi)`` of the flat model that shares one center and radius.

    ``c`` and ``r`` are Python floats (one layer of a per-layer range) or tensors of length
    ``hi - lo`` (a per-element range). Every quantizer and baseline of ``mechanisms`` accepts
    both, so code that walks the blocks never builds a model-sized ``c`` or ``r``.
    """

    lo: int
    hi: int
    c: torch.Tensor | float
    r: torch.Tensor | float


def range_blocks(
    c: torch.Tensor, r: torch.Tensor, m: int, layout: ParamLayout | None = None
) -> list[RangeBlock]:
    """Split a center/radius pair into :class:`RangeBlock` s over a flat model of ``m`` entries.

    With ``layout``, ``c`` and ``r`` are per layer (shape ``(L,)``, paper Sec. V-2: one interval
    ``[c_l - r_l, c_l + r_l]`` per layer) and each layer is one block with scalar ``c_l``, ``r_l``:
    the memory of ``c`` and ``r`` stays ``O(L)`` instead of two model-sized vectors. Without it,
    ``c`` and ``r`` are per element (shape ``(m,)``) and form a single block.

    Raises
    ------
    ValueError
        If the shapes do not match.
    """
    if layout is None:
        if c.shape != (m,) or r.shape != (m,):
            got = f"{tuple(c.shape)}, {tuple(r.shape)}"
            raise ValueError(f"per-element c and r must have shape ({m},), got {got}")
        return [RangeBlock(0, m, c, r)]
    if layout.m != m:
        raise ValueError(f"layout has {layout.m} parameters, the model {m}")
    shape = (layout.num_layers,)
    if c.shape != shape or r.shape != shape:
        raise ValueError(
            f"per-layer c and r must have shape {shape}, got {tuple(c.shape)}, {tuple(r.shape)}"
        )
    cs, rs = c.tolist(), r.tolist()
    return [
        RangeBlock(off, off + size, float(cs[i]), float(rs[i]))
        for i, (off, size) in enumerate(zip(layout.offsets, layout.sizes, strict=True))
    ]


def expand_per_element(
    values_per_layer: torch.Tensor | Sequence[float], layout: ParamLayout
) -> torch.Tensor:
    """Repeat one value per layer over that layer's elements.

    Parameters
    ----------
    values_per_layer : torch.Tensor or sequence of float
        Shape ``(L,)``.
    layout : ParamLayout

    Returns
    -------
    torch.Tensor
        Shape ``(m,)``, ``out[j] = values_per_layer[layer_ids(layout)[j]]``, same dtype and
        device as the input tensor.
    """
    vals = values_per_layer
    if not isinstance(vals, torch.Tensor):
        vals = torch.as_tensor(vals, dtype=torch.float32)
    if vals.ndim != 1 or vals.numel() != layout.num_layers:
        raise ValueError(
            f"values_per_layer must have shape ({layout.num_layers},), got {tuple(vals.shape)}"
        )
    sizes = torch.tensor(layout.sizes, dtype=torch.int64, device=vals.device)
    return torch.repeat_interleave(vals, sizes, output_size=layout.m)

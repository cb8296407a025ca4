"""A model as a Flower ``ArrayRecord`` <-> one flat float32 vector, whatever framework made it.

The quantizers work on one vector ``w`` of ``m`` parameters with one range per layer (paper
Sec. V-2). An app's model travels as an ``ArrayRecord``: any number of arrays, any shapes, any
dtypes (numpy arrays, PyTorch state dicts, ...). Here a *layer* is one floating-point array of the
record, in record order; :func:`layout_of_arrays` gives their place in the flat vector
(:class:`corbin_fl.layout.ParamLayout`). Arrays of another kind (integer counters such as
BatchNorm's ``num_batches_tracked``, boolean masks) are not model weights to average: they are
never sent back by a client, and the server keeps the global model's values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from corbin_fl import wire
from corbin_fl.layout import ParamLayout


class ArrayLayoutError(ValueError):
    """An ArrayRecord that does not fit the model's layout (``str(err)`` is the reason)."""


def is_weight(arr: Array) -> bool:
    """Whether an ``Array`` is a floating-point array (one layer of the quantized vector)."""
    try:
        return np.dtype(arr.dtype).kind == "f"
    except TypeError:
        return False


def layout_of_arrays(record: ArrayRecord) -> ParamLayout:
    """The flat layout of the floating-point arrays of ``record`` (record order).

    Raises
    ------
    ArrayLayoutError
        If the record has no floating-point array with at least one element.
    """
    names, shapes, offsets, sizes = [], [], [], []
    offset = 0
    for name, arr in record.items():
        if not is_weight(arr):
            continue
        shape = tuple(int(s) for s in arr.shape)
        size = _size(arr)
        if size < 1:
            continue
        names.append(name)
        shapes.append(shape)
        offsets.append(offset)
        sizes.append(size)
        offset += size
    if not names:
        raise ArrayLayoutError("the model has no floating-point array to quantize")
    return ParamLayout(tuple(names), tuple(shapes), tuple(offsets), tuple(sizes), offset)


def flatten_arrays(record: ArrayRecord, layout: ParamLayout) -> np.ndarray:
    """The floating-point arrays of ``record`` named by ``layout``, as one float32 vector.

    Raises
    ------
    ArrayLayoutError
        If an array of the layout is missing, has another shape, is not floating-point, or is
        not finite.
    """
    out = np.empty(layout.m, dtype=np.float32)
    for name, shape, lo, size in zip(
        layout.names, layout.shapes, layout.offsets, layout.sizes, strict=True
    ):
        if name not in record:
            raise ArrayLayoutError(f"array {name!r} of the model is missing")
        arr = record[name]
        if not isinstance(arr, Array) or not is_weight(arr):
            raise ArrayLayoutError(f"array {name!r} is not a floating-point array")
        if tuple(int(s) for s in arr.shape) != shape:
            raise ArrayLayoutError(
                f"array {name!r} has shape {list(arr.shape)}, expected {list(shape)}"
            )
        out[lo : lo + size] = _decode(arr, name, shape)
    if not np.isfinite(out).all():
        raise ArrayLayoutError("the model has NaN or inf values")
    return out


def check_same_weights(reply: ArrayRecord, layout: ParamLayout) -> None:
    """Require that ``reply`` holds exactly the floating-point arrays of ``layout``."""
    weights = [name for name, arr in reply.items() if is_weight(arr) and _size(arr) > 0]
    extra = sorted(set(weights) - set(layout.names))
    if extra:
        raise ArrayLayoutError(f"the trained model has arrays the global model lacks: {extra[:5]}")


def unflatten_arrays(flat: Any, layout: ParamLayout, template: ArrayRecord) -> ArrayRecord:
    """``template`` with its floating-point arrays replaced by the values of ``flat``.

    Each array keeps its shape and its dtype (float16 / float64 arrays are cast back); the
    other arrays of ``template`` are kept as they are.
    """
    values = np.asarray(flat, dtype=np.float32).reshape(-1)
    if values.size != layout.m:
        raise ArrayLayoutError(f"{values.size} values for a model of {layout.m}")
    out: dict[str, Array] = {}
    where = {
        name: (lo, size, shape)
        for name, lo, size, shape in zip(
            layout.names, layout.offsets, layout.sizes, layout.shapes, strict=True
        )
    }
    for name, arr in template.items():
        if name in where:
            lo, size, shape = where[name]
            part = values[lo : lo + size].reshape(shape).astype(np.dtype(arr.dtype), copy=True)
            out[name] = Array(np.array(part, order="C", copy=True))  # keeps 0-d shapes
        else:
            out[name] = arr
    return ArrayRecord(out)


def _size(arr: Array) -> int:
    shape = tuple(int(s) for s in arr.shape)
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _decode(arr: Array, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The values of a (possibly hostile) ``Array`` as float32, checked before decoding.

    As :func:`corbin_fl.wire.read_array`: the ``.npy`` header inside the bytes must declare the
    Array's own dtype and shape and the payload must be exactly ``itemsize * size`` bytes, so a
    forged header can make the node allocate nothing beyond the declared size.
    """
    try:
        values = wire.decode_npy(arr.data, name, np.dtype(arr.dtype), shape)
    except wire.WireError as exc:
        raise ArrayLayoutError(str(exc)) from exc
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float32)

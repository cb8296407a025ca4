"""File formats of the datasets, read into ``uint8`` arrays: MNIST IDX, the CIFAR-10 python
batches (with a restricted unpickler), and Hugging Face datasets (images or text rows).

No splitting, partitioning or normalisation here: :mod:`corbin_fl.app.data` does that.
"""

from __future__ import annotations

import codecs
import gzip
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "CIFAR_CLASSES",
    "FASHION_MNIST_CLASS_NAMES",
    "IDX_FILES",
    "MNIST_CLASS_NAMES",
    "hf_to_arrays",
    "missing_idx_files",
    "read_cifar10_batch",
    "read_cifar10_dir",
    "read_idx",
    "read_mnist_idx_dir",
]


# IDX type codes (LeCun's format description): code -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"

IDX_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
"""The four files of an MNIST-format data set (MNIST, Fashion-MNIST): training images and labels,
then test ("t10k") images and labels; each may also be named ``*.idx3-ubyte`` and be gzipped."""
MNIST_CLASS_NAMES: tuple[str, ...] = tuple(str(d) for d in range(10))
"""MNIST's labels 0..9 are the digits themselves."""
FASHION_MNIST_CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""Fashion-MNIST's labels 0..9 (Xiao, Rasul and Vollgraf, arXiv 1708.07747, Table 1)."""

_CIFAR_TRAIN_BATCHES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_BATCH = "test_batch"
_CIFAR_ROW = 3 * 32 * 32
CIFAR_CLASSES = 10


# --------------------------------------------------------------------------- IDX (MNIST)
def _read_maybe_gzip(path: Path) -> bytes:
    """Return the bytes of ``path``, decompressed when it starts with the gzip magic."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise ValueError(f"{path}: corrupt gzip stream: {exc}") from exc
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (LeCun's MNIST format), plain or gzipped.

    Layout: a 4-byte magic ``0x00 0x00 T D`` (``T`` the element type code, ``D`` the number of
    dimensions), then ``D`` big-endian uint32 sizes, then ``prod(sizes)`` big-endian elements.
    Type codes: ``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32,
    ``0x0E`` float64.

    Parameters
    ----------
    path : str or pathlib.Path
        The file. Gzip is detected from the content (``1f 8b``), not the name.

    Returns
    -------
    numpy.ndarray
        Native-endian array of shape ``sizes``.

    Raises
    ------
    ValueError
        Bad magic, unknown type code, zero dimensions, a truncated header or body, or trailing
        bytes after the body.
    """
    path = Path(path)
    raw = _read_maybe_gzip(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes, no magic number)")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{raw[:4].hex()} (the first two bytes must be zero)"
        )
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        raise ValueError(f"{path}: bad IDX magic number 0x{raw[:4].hex()} (type 0x{type_code:02x})")
    if ndim == 0:
        raise ValueError(f"{path}: IDX file declares zero dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} < {header} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    body = len(raw) - header
    if body < expected:
        raise ValueError(
            f"{path}: truncated IDX body: dims {dims} need {expected} bytes, found {body}"
        )
    if body > expected:
        raise ValueError(
            f"{path}: {body - expected} trailing bytes after the IDX body (dims {dims})"
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _idx_candidates(data_dir: Path, base: str) -> list[Path]:
    """Where ``base`` may lie: ``data_dir`` or its ``MNIST/raw`` (torchvision's layout), named
    ``base`` or with ``.idx`` for ``-idx``, plain or ``.gz``, in that order of preference."""
    names = [base, base.replace("-idx", ".idx")]
    return [
        folder / f"{name}{suffix}"
        for folder in (data_dir, data_dir / "MNIST" / "raw")
        for name in names
        for suffix in ("", ".gz")
    ]


def missing_idx_files(data_dir: str | Path) -> list[str]:
    """The names of :data:`IDX_FILES` that ``data_dir`` lacks (in any accepted variant).

    Parameters
    ----------
    data_dir : str or pathlib.Path
        The folder; a folder that does not exist lacks every file.

    Returns
    -------
    list of str
        Empty when all four are there.
    """
    folder = Path(data_dir)
    return [b for b in IDX_FILES if not any(c.is_file() for c in _idx_candidates(folder, b))]


def _find_idx(data_dir: Path, base: str) -> Path:
    """Locate ``base`` (or its ``.idx`` / ``.gz`` variants) in ``data_dir`` or ``MNIST/raw``."""
    for candidate in _idx_candidates(data_dir, base):
        if candidate.is_file():
            return candidate
    raise ValueError(f"MNIST IDX file {base!r} (or {base}.gz) not found in {data_dir}")


def _read_idx_pair(data_dir: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Read and cross-check one images/labels pair (``prefix`` is ``train`` or ``t10k``)."""
    img_path = _find_idx(data_dir, f"{prefix}-images-idx3-ubyte")
    lab_path = _find_idx(data_dir, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(img_path)
    labels = read_idx(lab_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(
            f"{img_path}: expected uint8 images N x H x W, got {images.dtype} {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{lab_path}: expected uint8 labels N, got {labels.dtype} {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{img_path} has {images.shape[0]} images but {lab_path} has {labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= 10:
        raise ValueError(f"{lab_path}: label {int(labels.max())} outside [0, 10)")
    return images[:, None, :, :], labels.astype(np.int64)


# --------------------------------------------------------------------------- CIFAR-10
# The only globals a CIFAR-10 batch (a dict of bytes keys, a numpy uint8 array and lists) may
# reference: numpy's array reconstruction helpers, under their numpy 1.x and 2.x module names, and
# the codec protocol-2 pickles use for bytes. They are resolved from numpy itself (not imported by
# name), so the same files load under every numpy version. Anything else is refused: a crafted
# file cannot make the unpickler call arbitrary code.
_RECONSTRUCT = np.ndarray((0,)).__reduce__()[0]
_FROMBUFFER = np.zeros(1, dtype=np.uint8).__reduce_ex__(5)[0]
_PICKLE_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals in ``_PICKLE_ALLOWED``."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _PICKLE_ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global {module}.{name} is not allowed in a data batch"
            ) from None


def read_cifar10_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch.

    The file is a pickled dict with ``b"data"``, a ``(N, 3072)`` uint8 array whose rows are the
    1024 red, then green, then blue values of a 32 x 32 image in row-major order, and
    ``b"labels"``, ``N`` integers in ``[0, 10)``. It is unpickled with ``encoding="bytes"`` (the
    batches were written by Python 2) through an unpickler that admits only numpy's array
    reconstruction.

    Parameters
    ----------
    path : str or pathlib.Path
        The batch file.

    Returns
    -------
    images : numpy.ndarray
        uint8 ``(N, 3, 32, 32)``.
    labels : numpy.ndarray
        int64 ``(N,)``.

    Raises
    ------
    ValueError
        Unreadable, not a pickle of the expected dict, wrong shapes, dtypes or label values.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            obj = _RestrictedUnpickler(fh, encoding="bytes").load()
    except OSError as exc:
        raise ValueError(f"cannot read CIFAR-10 batch {path}: {exc}") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a valid CIFAR-10 python batch: {exc}") from exc
    if not isinstance(obj, dict) or b"data" not in obj or b"labels" not in obj:
        raise ValueError(f"{path}: expected a dict with b'data' and b'labels'")
    data, labels = obj[b"data"], obj[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{path}: b'data' must be a 2-D uint8 array")
    if data.shape[1] != _CIFAR_ROW:
        raise ValueError(f"{path}: b'data' rows have {data.shape[1]} values, expected {_CIFAR_ROW}")
    try:
        lab = np.asarray(labels)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: b'labels' is not a list of integers") from exc
    if lab.ndim != 1 or lab.shape[0] != data.shape[0] or not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(
            f"{path}: b'labels' must be {data.shape[0]} integers, got {lab.dtype} {lab.shape}"
        )
    if lab.size and (int(lab.min()) < 0 or int(lab.max()) >= CIFAR_CLASSES):
        raise ValueError(f"{path}: labels outside [0, {CIFAR_CLASSES})")
    return data.reshape(-1, 3, 32, 32).copy(), lab.astype(np.int64)


def _cifar_dir(data_dir: Path) -> Path:
    for folder in (data_dir, data_dir / "cifar-10-batches-py"):
        if (folder / _CIFAR_TEST_BATCH).is_file():
            return folder
    raise ValueError(
        f"CIFAR-10 python batches not found in {data_dir} (nor in its cifar-10-batches-py/)"
    )


def read_cifar10_dir(data_dir: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """All CIFAR-10 python batches of ``data_dir`` (or its ``cifar-10-batches-py/``): images
    ``N x 3 x 32 x 32`` (training batches first, then ``test_batch``), labels, training rows."""
    folder = _cifar_dir(data_dir)
    missing = [b for b in _CIFAR_TRAIN_BATCHES if not (folder / b).is_file()]
    if missing:
        raise ValueError(f"{folder}: missing CIFAR-10 batches {missing}")
    parts = [read_cifar10_batch(folder / b) for b in _CIFAR_TRAIN_BATCHES]
    test = read_cifar10_batch(folder / _CIFAR_TEST_BATCH)
    n_train = sum(p[0].shape[0] for p in parts)
    images = np.concatenate([p[0] for p in parts] + [test[0]])
    labels = np.concatenate([p[1] for p in parts] + [test[1]])
    return images, labels, n_train


def read_mnist_idx_dir(data_dir: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """The four MNIST IDX files of ``data_dir``: images ``N x 1 x 28 x 28`` (training rows
    first, then t10k), labels, training rows. ``ValueError`` naming every missing file."""
    if missing := missing_idx_files(data_dir):
        raise ValueError(
            f"{data_dir} lacks {len(missing)} of the 4 IDX files: {', '.join(missing)} "
            "(each may be gzipped, .gz)"
        )
    tr_x, tr_y = _read_idx_pair(data_dir, "train")
    te_x, te_y = _read_idx_pair(data_dir, "t10k")
    if tr_x.shape[1:] != te_x.shape[1:]:
        raise ValueError(f"{data_dir}: train and t10k images differ in shape")
    return np.concatenate([tr_x, te_x]), np.concatenate([tr_y, te_y]), tr_x.shape[0]


# --------------------------------------------------------------------------- Hugging Face
def hf_to_arrays(
    ds: Any, *, image_column: str | None = None, label_column: str | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Convert a Hugging Face ``datasets.Dataset`` of images and labels to arrays.

    Parameters
    ----------
    ds : datasets.Dataset
        One split. Images may be an ``Image`` feature (PIL) or nested integer sequences, all of
        one shape: ``H x W`` (grey), ``H x W x C`` (channels last) or ``C x H x W``, ``C`` in
        ``{1, 3}``, values in ``[0, 255]``.
    image_column : str, optional
        Default: the first of ``"image"``, ``"img"`` present.
    label_column : str, optional
        Default: the first of ``"label"``, ``"labels"`` present.

    Returns
    -------
    images : numpy.ndarray
        uint8 ``N x C x H x W``.
    labels : numpy.ndarray
        int64 ``N``.
    num_classes : int
        From a ``ClassLabel`` feature when there is one, else ``max(label) + 1``.

    Raises
    ------
    TypeError
        ``ds`` is not a ``datasets.Dataset``, or images are not integers.
    ValueError
        Missing columns, empty split, ragged or out-of-range images, bad labels.
    """
    import datasets  # lazy: heavy import, only for hub sources and partitioning

    if not isinstance(ds, datasets.Dataset):
        raise TypeError(f"expected a datasets.Dataset, got {type(ds).__name__}")
    cols = ds.column_names
    img_col = image_column or next((c for c in ("image", "img") if c in cols), None)
    lab_col = label_column or next((c for c in ("label", "labels") if c in cols), None)
    if img_col is None or img_col not in cols:
        raise ValueError(f"no image column ({image_column or 'image/img'}) in columns {cols}")
    if lab_col is None or lab_col not in cols:
        raise ValueError(f"no label column ({label_column or 'label/labels'}) in columns {cols}")
    if ds.num_rows == 0:
        raise ValueError("the dataset split is empty")

    np_ds = ds.with_format("numpy", columns=[img_col, lab_col])
    try:
        images = np.asarray(np_ds[img_col])
    except ValueError as exc:
        raise ValueError(f"images in column {img_col!r} do not all have the same shape") from exc
    if images.dtype == object:
        raise ValueError(f"images in column {img_col!r} do not all have the same shape")
    if not np.issubdtype(images.dtype, np.integer):
        raise TypeError(f"images must be integers in [0, 255], got dtype {images.dtype}")
    if images.size and (int(images.min()) < 0 or int(images.max()) > 255):
        raise ValueError("image values outside [0, 255]")
    if images.ndim == 3:
        images = images[:, None, :, :]
    elif images.ndim == 4:
        if images.shape[-1] in (1, 3):
            images = images.transpose(0, 3, 1, 2)
        elif images.shape[1] not in (1, 3):
            raise ValueError(f"cannot find a channel axis of size 1 or 3 in {images.shape[1:]}")
    else:
        raise ValueError(f"images must be H x W or 3-D per example, got {images.shape[1:]}")
    images = np.ascontiguousarray(images, dtype=np.uint8)

    labels = np.asarray(np_ds[lab_col])
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be one integer per example, got {labels.dtype} {labels.shape}"
        )
    if int(labels.min()) < 0:
        raise ValueError("labels must be non-negative")
    feature = ds.features[lab_col]
    if isinstance(feature, datasets.ClassLabel):
        num_classes = int(feature.num_classes)
        if int(labels.max()) >= num_classes:
            raise ValueError(f"label {int(labels.max())} outside the ClassLabel's {num_classes}")
    else:
        num_classes = int(labels.max()) + 1
    return images, labels.astype(np.int64), num_classes

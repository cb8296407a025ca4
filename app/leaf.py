"""The LEAF tasks beyond MNIST: FEMNIST and Shakespeare, as Flower Labs serves them on the hub.

Caldas et al., "LEAF: A Benchmark for Federated Settings" (arXiv:1812.01097). Both come through
Hugging Face ``datasets`` (what ``flwr-datasets`` loads under the hood) from the hub copies of
Flower Labs, or from a local copy of those files (``data-dir``):

``femnist`` (``flwrlabs/femnist``, parquet, one ``train`` split of 814k rows)
    Columns ``image`` (28 x 28 grey PNG), ``writer_id`` (str), ``hsf_id`` (int),
    ``character`` (``ClassLabel``, 62 classes: digits, upper and lower case). A client of the
    natural partition is one writer.
``shakespeare`` (``flwrlabs/shakespeare``, ``shakespeare.csv``, one ``train`` split)
    Columns ``character_id`` (a speaking role of a play), ``x`` (the 80 characters before) and
    ``y`` (the next character). A client of the natural partition is one role. Characters are
    indexed in LEAF's 80-letter alphabet (:data:`LEAF_LETTERS`), the classes of the next-character
    prediction.

Offline use: copy the hub repository once (``huggingface-cli download flwrlabs/femnist
--repo-type dataset --local-dir data/femnist``) and set ``data-dir`` to that folder; with
``data-dir`` empty the hub is asked (network, cached in Hugging Face's cache). Tests write tiny
files of the same format (``tests/unit/test_leaf.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from corbin_fl.app.readers import hf_to_arrays

logger = logging.getLogger(__name__)

__all__ = ["HUB_IDS", "LEAF_LETTERS", "LeafArrays", "encode_text", "load_leaf"]

HUB_IDS: Final[dict[str, str]] = {
    "femnist": "flwrlabs/femnist",
    "shakespeare": "flwrlabs/shakespeare",
}
"""Hub repositories of the LEAF tasks (``data-dir`` empty)."""
LEAF_LETTERS: Final[str] = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
"""LEAF's Shakespeare alphabet (``language_utils.ALL_LETTERS``): 80 letters, index = class."""
FEMNIST_CLASSES: Final[int] = 62
_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "femnist": ("image", "writer_id", "character"),
    "shakespeare": ("character_id", "x", "y"),
}


@dataclass(frozen=True, eq=False)
class LeafArrays:
    """One LEAF source in memory.

    Attributes
    ----------
    inputs : numpy.ndarray
        ``femnist``: uint8 ``N x 1 x 28 x 28`` images; ``shakespeare``: uint8 ``N x L`` letter
        indices into :data:`LEAF_LETTERS`.
    labels : numpy.ndarray
        int64 ``N``: the character class, or the next letter's index.
    groups : numpy.ndarray
        int64 ``N``: the writer or role of each row (codes of the sorted distinct ids).
    num_classes : int
        62 or 80.
    tokens : bool
        ``inputs`` are letter indices, not images.
    """

    inputs: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    num_classes: int
    tokens: bool


def encode_text(texts: Any, what: str) -> np.ndarray:
    """Letter indices (uint8 ``N x L``) of equal-length strings; a letter outside LEAF's
    alphabet is a ValueError naming it."""
    rows = list(texts)
    if not rows:
        raise ValueError(f"{what}: no rows")
    if not all(isinstance(t, str) for t in rows):
        raise ValueError(f"{what}: every entry must be a string")
    length = len(rows[0])
    if length == 0 or any(len(t) != length for t in rows):
        raise ValueError(f"{what}: every entry must have the same length >= 1 (first: {length})")
    joined = "".join(rows)
    bad = sorted(set(joined) - set(LEAF_LETTERS))
    if bad:
        raise ValueError(f"{what}: letters outside LEAF's alphabet: {bad[:10]!r}")
    table = np.zeros(128, dtype=np.uint8)  # the alphabet is ASCII
    for i, letter in enumerate(LEAF_LETTERS):
        table[ord(letter)] = i
    out = table[np.frombuffer(joined.encode("ascii"), dtype=np.uint8)]
    return out.reshape(len(rows), length)


def _groups(ids: Any, what: str) -> np.ndarray:
    values = np.asarray(list(ids), dtype=object)
    if not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{what}: every id must be a non-empty string")
    _, codes = np.unique(values.astype(str), return_inverse=True)
    return codes.astype(np.int64)


def _load_split(name: str, data_dir: Path | None) -> Any:
    import datasets  # lazy: heavy import

    source = str(data_dir) if data_dir is not None else HUB_IDS[name]
    logger.info("loading %s from %s", name, source)
    dd = datasets.load_dataset(source)
    if not isinstance(dd, datasets.DatasetDict) or "train" not in dd:
        raise ValueError(f"{name} from {source}: expected a 'train' split, got {list(dd)}")
    ds = dd["train"]
    missing = [c for c in _COLUMNS[name] if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"{name} from {source}: missing columns {missing} (has {ds.column_names}); expected "
            f"the layout of {HUB_IDS[name]}"
        )
    if ds.num_rows == 0:
        raise ValueError(f"{name} from {source}: the train split is empty")
    return ds


def load_leaf(name: str, data_dir: str | Path | None) -> LeafArrays:
    """Load ``femnist`` or ``shakespeare`` (module docstring) from ``data_dir`` or the hub.

    Raises
    ------
    ValueError
        Unknown name, missing columns, ragged or malformed rows, labels out of range.
    """
    if name not in HUB_IDS:
        raise ValueError(f"unknown LEAF task {name!r}; expected one of {sorted(HUB_IDS)}")
    folder = Path(data_dir) if data_dir else None
    if folder is not None and not folder.is_dir():
        raise ValueError(f"data-dir {str(folder)!r} for {name} is not a directory")
    ds = _load_split(name, folder)
    if name == "femnist":
        images, labels, k = hf_to_arrays(ds, image_column="image", label_column="character")
        if images.shape[1:] != (1, 28, 28):
            raise ValueError(f"femnist images must be 28 x 28 grey, got {images.shape[1:]}")
        if k != FEMNIST_CLASSES:
            raise ValueError(f"femnist has {FEMNIST_CLASSES} classes, the labels say {k}")
        return LeafArrays(images, labels, _groups(ds["writer_id"], "writer_id"), k, False)
    x = encode_text(ds["x"], "shakespeare x")
    y = encode_text(ds["y"], "shakespeare y")
    if y.shape[1] != 1:
        raise ValueError(f"shakespeare y must be one letter, got {y.shape[1]}")
    groups = _groups(ds["character_id"], "character_id")
    return LeafArrays(x, y[:, 0].astype(np.int64), groups, len(LEAF_LETTERS), True)

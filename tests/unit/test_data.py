"""Tests of corbin_fl.app.data: IDX / CIFAR / HF loaders, the paper's split, client partitions."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from corbin_fl.app import data, readers

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


# --------------------------------------------------------------------------- helpers
def idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    """Encode ``arr`` in the IDX format, independently of the reader under test."""
    fmt = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[type_code]
    header = bytes([0, 0, type_code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + np.ascontiguousarray(arr, dtype=fmt).tobytes()


def write_idx(path: Path, arr: np.ndarray, *, gz: bool = False, type_code: int = 0x08) -> Path:
    payload = idx_bytes(arr, type_code)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_mnist_dir(
    folder: Path, rng: np.random.Generator, n_train: int = 30, n_test: int = 10, gz: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    trx = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    try_ = rng.integers(0, 10, size=n_train, dtype=np.uint8)
    tex = rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8)
    tey = rng.integers(0, 10, size=n_test, dtype=np.uint8)
    write_idx(folder / "train-images-idx3-ubyte", trx, gz=gz)
    write_idx(folder / "train-labels-idx1-ubyte", try_, gz=not gz)  # mix plain and gzip
    write_idx(folder / "t10k-images-idx3-ubyte", tex, gz=gz)
    write_idx(folder / "t10k-labels-idx1-ubyte", tey, gz=gz)
    return trx, try_, tex, tey


def cifar_batch(rng: np.random.Generator, n: int) -> dict[bytes, object]:
    return {
        b"batch_label": b"testing batch",
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        b"labels": [int(v) for v in rng.integers(0, 10, size=n)],
        b"filenames": [f"img{i}.png".encode() for i in range(n)],
    }


def write_cifar_dir(
    folder: Path, rng: np.random.Generator, n: int = 4, protocol: int = 2
) -> tuple[Path, list[dict[bytes, object]]]:
    sub = folder / "cifar-10-batches-py"
    sub.mkdir(parents=True)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = cifar_batch(rng, n)
        (sub / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        batches.append(batch)
    return sub, batches


# --------------------------------------------------------------------------- IDX
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    ("type_code", "dtype"),
    [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32), (0x0D, np.float32)],
)
def test_read_idx_round_trip(tmp_path: Path, gz: bool, type_code: int, dtype: type) -> None:
    rng = np.random.default_rng(1)
    arr = rng.integers(-100 if dtype != np.uint8 else 0, 127, size=(3, 4, 5)).astype(dtype)
    path = write_idx(tmp_path / "x-idx3", arr, gz=gz, type_code=type_code)
    out = readers.read_idx(path)
    assert out.dtype == np.dtype(dtype)
    assert out.dtype.byteorder in ("=", "|")
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x00\x00", "truncated IDX file"),
        (b"\x01\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x01", "bad IDX magic"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"\x00\x01", "bad IDX magic"),
        (b"\x00\x00\x08\x00", "zero dimensions"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "truncated IDX header"),
        (b"\x00\x00\x08\x02" + struct.pack(">II", 2, 3) + b"\x00" * 5, "truncated IDX body"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 2) + b"\x00" * 3, "trailing bytes"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
    ],
)
def test_read_idx_rejects_corrupt_files(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "bad-idx"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=message):
        readers.read_idx(path)


def test_read_idx_rejects_truncated_gzip_body(tmp_path: Path) -> None:
    payload = gzip.compress(idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5)))
    path = tmp_path / "cut.gz"
    path.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(ValueError, match="gzip"):
        readers.read_idx(path)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_source(tmp_path: Path, gz: bool) -> None:
    rng = np.random.default_rng(7)
    trx, try_, tex, tey = write_mnist_dir(tmp_path / "mnist", rng, gz=gz)
    src = data.load_source("mnist-idx", tmp_path / "mnist")
    assert src.images.shape == (40, 1, 28, 28)
    assert src.images.dtype == torch.float32
    assert src.labels.dtype == torch.int64
    assert (src.num_classes, src.in_channels, src.official_test_start) == (10, 1, 30)
    raw = np.concatenate([trx, tex]).astype(np.float32)[:, None]
    own = trx.astype(np.float64) / 255.0  # the files' own training statistics
    expected = (raw / 255.0 - own.mean()) / own.std()
    np.testing.assert_allclose(src.images.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(src.labels.numpy(), np.concatenate([try_, tey]))
    info = data.dataset_info("mnist-idx", tmp_path / "mnist")
    assert (info.num_examples, info.image_size, info.in_channels) == (40, (28, 28), 1)


def test_mnist_idx_source_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    with pytest.raises(ValueError, match="data-dir, which is empty"):
        data.load_source("mnist-idx")
    with pytest.raises(ValueError, match="does not exist"):
        data.load_source("mnist-idx", tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="lacks 4 of 4 files"):
        data.load_source("mnist-idx", tmp_path / "empty")
    # label count mismatch
    folder = tmp_path / "mismatch"
    write_mnist_dir(folder, rng)
    for f in folder.glob("train-labels-idx1-ubyte*"):
        f.unlink()
    write_idx(folder / "train-labels-idx1-ubyte", np.zeros(29, dtype=np.uint8))
    with pytest.raises(ValueError, match="30 images but"):
        data.load_source("mnist-idx", folder)
    # out-of-range label
    folder = tmp_path / "badlabel"
    write_mnist_dir(folder, rng)
    for f in folder.glob("t10k-labels-idx1-ubyte*"):
        f.unlink()
    write_idx(folder / "t10k-labels-idx1-ubyte", np.full(10, 10, dtype=np.uint8))
    with pytest.raises(ValueError, match="outside"):
        data.load_source("mnist-idx", folder)
    # images with the wrong element type
    folder = tmp_path / "int32"
    write_mnist_dir(folder, rng)
    for f in folder.glob("t10k-images-idx3-ubyte*"):
        f.unlink()
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((10, 28, 28), np.int32), type_code=0x0C)
    with pytest.raises(ValueError, match="expected uint8 images"):
        data.load_source("mnist-idx", folder)


def test_mnist_idx_is_normalised_with_its_own_training_statistics(tmp_path: Path) -> None:
    """Any IDX files are normalised with the mean and std of their own training images (not
    MNIST's constants), so a data set brighter than MNIST gets its own."""
    rng = np.random.default_rng(11)
    folder = tmp_path / "bright"
    folder.mkdir()
    trx = rng.integers(100, 256, size=(20, 28, 28), dtype=np.uint8)
    tex = rng.integers(0, 50, size=(5, 28, 28), dtype=np.uint8)  # the test rows must not count
    write_idx(folder / "train-images-idx3-ubyte", trx)
    write_idx(folder / "train-labels-idx1-ubyte", rng.integers(0, 10, 20, dtype=np.uint8))
    write_idx(folder / "t10k-images-idx3-ubyte", tex)
    write_idx(folder / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 5, dtype=np.uint8))
    info = data.dataset_info("mnist-idx", folder)
    pixels = trx.astype(np.float64) / 255.0
    assert info.mean == pytest.approx((pixels.mean(),), abs=1e-12)
    assert info.std == pytest.approx((pixels.std(),), abs=1e-12)
    src = data.load_source("mnist-idx", folder)
    train = src.images[:20].double()
    assert float(train.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(train.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    assert info.title == "IDX files (MNIST format)"


# --------------------------------------------------------------------------- Fashion-MNIST
FASHION_CLASSES = (
    *("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"),
    *("Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
)
FASHION_PACKAGE = Path("/usr/share/datasets/fashion-mnist")


def test_fashion_mnist_source(tmp_path: Path) -> None:
    """``fashion-mnist`` reads the four IDX files (gzipped, as the Debian package ships them)
    from data_dir, under its own name, class names and normalisation constants."""
    rng = np.random.default_rng(21)
    folder = tmp_path / "fashion"
    trx, try_, tex, tey = write_mnist_dir(folder, rng, n_train=40, n_test=10, gz=True)
    src = data.load_source("fashion-mnist", folder)
    assert src.name == "fashion-mnist"
    assert (src.num_classes, src.in_channels, src.official_test_start) == (10, 1, 40)
    raw = np.concatenate([trx, tex]).astype(np.float32)[:, None]
    expected = (raw / 255.0 - 0.2860) / 0.3530
    np.testing.assert_allclose(src.images.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(src.labels.numpy(), np.concatenate([try_, tey]))
    info = data.dataset_info("fashion-mnist", folder)
    assert info.title == "Fashion-MNIST"
    assert info.class_names == FASHION_CLASSES
    assert (info.mean, info.std) == ((0.2860,), (0.3530,))
    assert data.dataset_title("fashion-mnist") == "Fashion-MNIST"
    # its reported test part is the official t10k rows, validation drawn from the training rows
    split = data.split_indices(50, 0, official_test_start=40)
    val, test = data.server_datasets("fashion-mnist", data_dir=folder, use_official_test=True)
    assert len(test) == 10 and len(val) == split.val.size == 8
    np.testing.assert_array_equal(test.tensors[1].numpy(), tey)
    assert "official test set (10,000 images)" in data.test_split_text("fashion-mnist", True)
    assert "pooled" in data.test_split_text("mnist", False)


def test_fashion_mnist_missing_files_are_all_named(tmp_path: Path) -> None:
    """A missing folder or any missing file fails before reading, naming every missing file and
    the package that installs them."""
    rng = np.random.default_rng(22)
    folder = tmp_path / "half"
    write_mnist_dir(folder, rng)
    for f in [*folder.glob("t10k-images-*"), *folder.glob("train-labels-*")]:
        f.unlink()
    with pytest.raises(data.DatasetUnavailableError) as err:
        data.check_dataset_files("fashion-mnist", folder)
    text = str(err.value)
    assert "lacks 2 of 4 files" in text
    assert "train-labels-idx1-ubyte" in text and "t10k-images-idx3-ubyte" in text
    assert "train-images-idx3-ubyte" not in text.split("missing:")[1]
    assert "apt-get install dataset-fashion-mnist" in text
    with pytest.raises(data.DatasetUnavailableError, match="t10k-images-idx3-ubyte"):
        data.load_source("fashion-mnist", folder)
    with pytest.raises(data.DatasetUnavailableError, match="does not exist") as err:
        data.check_dataset_files("fashion-mnist", tmp_path / "absent")
    assert all(name in str(err.value) for name in readers.IDX_FILES)
    with pytest.raises(data.DatasetUnavailableError, match="data-dir, which is empty"):
        data.check_dataset_files("mnist-idx", None)
    data.check_dataset_files("mnist", None)  # embedded: nothing to check


def test_fashion_mnist_reads_the_package_folder_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without data_dir, ``fashion-mnist`` reads the Debian package's folder."""
    from corbin_fl.app import sources

    rng = np.random.default_rng(23)
    write_mnist_dir(tmp_path / "pkg", rng, gz=True)
    monkeypatch.setitem(
        sources.IDX_SOURCES,
        "fashion-mnist",
        sources.IDX_SOURCES["fashion-mnist"].__class__(
            **{**vars(sources.IDX_SOURCES["fashion-mnist"]), "default_dir": str(tmp_path / "pkg")}
        ),
    )
    assert data.dataset_info("fashion-mnist").num_examples == 40
    assert sources.FASHION_MNIST_DIR == "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(
    not (FASHION_PACKAGE / "train-images-idx3-ubyte.gz").is_file(),
    reason="Debian's package is absent (apt-get install dataset-fashion-mnist)",
)
def test_fashion_mnist_constants_match_the_package_files() -> None:
    """The normalisation constants are the mean and std of the 60,000 official training
    images to 4 decimals (|error| <= 5e-5, the rounding), and the files are the data set."""
    images, labels, n_train = readers.read_mnist_idx_dir(FASHION_PACKAGE)
    assert (images.shape, n_train) == ((70_000, 1, 28, 28), 60_000)
    pixels = images[:n_train].astype(np.float64) / 255.0
    (mean,), (std,) = data.FASHION_MNIST_STATS
    assert abs(pixels.mean() - mean) <= 5e-5
    assert abs(pixels.std() - std) <= 5e-5
    assert np.bincount(labels[:n_train]).tolist() == [6000] * 10
    assert np.bincount(labels[n_train:]).tolist() == [1000] * 10


# --------------------------------------------------------------------------- CIFAR-10
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_source(tmp_path: Path, protocol: int) -> None:
    rng = np.random.default_rng(3)
    _, batches = write_cifar_dir(tmp_path, rng, n=4, protocol=protocol)
    # the parent directory works too (the loader looks into cifar-10-batches-py/)
    src = data.load_source("cifar10", tmp_path)
    assert src.images.shape == (24, 3, 32, 32)
    assert (src.num_classes, src.in_channels, src.official_test_start) == (10, 3, 20)
    pixels = np.concatenate([b[b"data"] for b in batches]).astype(np.float32) / 255.0
    labels = np.concatenate([b[b"labels"] for b in batches])
    np.testing.assert_array_equal(src.labels.numpy(), labels)
    for ch in range(3):
        plane = pixels[:, ch * 1024 : (ch + 1) * 1024].reshape(-1, 32, 32)
        expected = (plane - CIFAR_MEAN[ch]) / CIFAR_STD[ch]
        np.testing.assert_allclose(src.images[:, ch].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_read_cifar10_batch_numpy1_pickle(tmp_path: Path) -> None:
    """Batches pickled under numpy 1.x name ``numpy.core.multiarray`` (as the official files)."""
    batch = cifar_batch(np.random.default_rng(9), 3)
    payload = pickle.dumps(batch, protocol=2)
    assert b"numpy._core.multiarray" in payload
    legacy = payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (tmp_path / "legacy").write_bytes(legacy)
    images, labels = readers.read_cifar10_batch(tmp_path / "legacy")
    np.testing.assert_array_equal(images.reshape(3, -1), batch[b"data"])
    np.testing.assert_array_equal(labels, batch[b"labels"])


def test_read_cifar10_batch_rejects(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:  # would call print() if resolved
            return (print, ("pwned",))

    cases: dict[str, tuple[bytes, str]] = {
        "evil": (pickle.dumps({b"data": Evil(), b"labels": []}), "not allowed"),
        "list": (pickle.dumps([1, 2, 3]), "expected a dict"),
        "rows": (
            pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}),
            "3072",
        ),
        "dtype": (
            pickle.dumps({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}),
            "uint8",
        ),
        "nlabels": (
            pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}),
            "must be 2 integers",
        ),
        "range": (
            pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}),
            "outside",
        ),
        "truncated": (pickle.dumps(cifar_batch(rng, 2))[:-40], "not a valid"),
        "garbage": (b"not a pickle at all", "not a valid"),
    }
    for name, (payload, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(payload)
        with pytest.raises(ValueError, match=message):
            readers.read_cifar10_batch(path)


def test_cifar10_missing_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    sub, _ = write_cifar_dir(tmp_path / "c", rng)
    (sub / "data_batch_3").unlink()
    with pytest.raises(ValueError, match="data_batch_3"):
        data.load_source("cifar10", tmp_path / "c")
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="not found"):
        data.load_source("cifar10", tmp_path / "none")


# --------------------------------------------------------------------------- Hugging Face
def test_hf_to_arrays_pil_grey_and_rgb() -> None:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(6)
    grey = rng.integers(0, 256, size=(5, 6, 7), dtype=np.uint8)
    ds = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(g) for g in grey], "label": [0, 1, 2, 1, 0]},
        features=datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=4)}
        ),
    )
    images, labels, k = readers.hf_to_arrays(ds)
    assert images.dtype == np.uint8 and images.shape == (5, 1, 6, 7)
    np.testing.assert_array_equal(images[:, 0], grey)
    np.testing.assert_array_equal(labels, [0, 1, 2, 1, 0])
    assert labels.dtype == np.int64 and k == 4  # from the ClassLabel, not max + 1

    rgb = rng.integers(0, 256, size=(3, 8, 9, 3), dtype=np.uint8)
    ds = datasets.Dataset.from_dict(
        {"img": [Image.fromarray(x) for x in rgb], "label": [2, 0, 5]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")}),
    )
    images, labels, k = readers.hf_to_arrays(ds)
    assert images.shape == (3, 3, 8, 9)
    np.testing.assert_array_equal(images, rgb.transpose(0, 3, 1, 2))
    assert k == 6


def test_hf_to_arrays_nested_arrays_and_errors() -> None:
    datasets = pytest.importorskip("datasets")
    arrays = np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4) % 256  # channels first
    ds = datasets.Dataset.from_dict({"image": arrays.tolist(), "labels": [1, 0]})
    images, labels, k = readers.hf_to_arrays(ds)
    np.testing.assert_array_equal(images, arrays)
    np.testing.assert_array_equal(labels, [1, 0])
    assert images.dtype == np.uint8 and k == 2

    with pytest.raises(TypeError, match=r"datasets\.Dataset"):
        readers.hf_to_arrays({"image": [], "label": []})
    with pytest.raises(ValueError, match="no image column"):
        readers.hf_to_arrays(datasets.Dataset.from_dict({"pixels": [[1]], "label": [0]}))
    with pytest.raises(ValueError, match="no label column"):
        readers.hf_to_arrays(datasets.Dataset.from_dict({"image": [[[1]]], "y": [0]}))
    ragged = datasets.Dataset.from_dict({"image": [[[1, 2]], [[1, 2, 3]]], "label": [0, 1]})
    with pytest.raises(ValueError, match="same shape"):
        readers.hf_to_arrays(ragged)
    floats = datasets.Dataset.from_dict({"image": [[[0.5]]], "label": [0]})
    with pytest.raises(TypeError, match="integers"):
        readers.hf_to_arrays(floats)
    big = datasets.Dataset.from_dict({"image": [[[300]]], "label": [0]})
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        readers.hf_to_arrays(big)
    neg = datasets.Dataset.from_dict({"image": [[[3]]], "label": [-1]})
    with pytest.raises(ValueError, match="non-negative"):
        readers.hf_to_arrays(neg)


def test_hf_source_through_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hf:<id>`` pools train + test, keeps the official split, normalises per dataset."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(12)
    tr = rng.integers(0, 256, size=(6, 5, 5), dtype=np.uint8)
    te = rng.integers(0, 256, size=(4, 5, 5), dtype=np.uint8)
    feats = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    from PIL import Image

    def split(x: np.ndarray) -> object:
        return datasets.Dataset.from_dict(
            {"image": [Image.fromarray(a) for a in x], "label": list(range(len(x)))},
            features=feats,
        )

    calls: list[tuple[str, object]] = []

    def fake_load_dataset(hub_id: str, cache_dir: object = None) -> object:
        calls.append((hub_id, cache_dir))
        return datasets.DatasetDict({"train": split(tr), "test": split(te)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    try:
        unknown = data.load_source("hf:someone/tiny-digits")
        known = data.load_source("hf:ylecun/mnist")
    finally:
        data._load_raw.cache_clear()  # do not leave the fake data in the process cache
    assert [c[0] for c in calls] == ["someone/tiny-digits", "ylecun/mnist"]
    assert unknown.images.shape == (10, 1, 5, 5) and unknown.official_test_start == 6
    assert unknown.num_classes == 10 and unknown.name == "hf:someone/tiny-digits"
    np.testing.assert_array_equal(unknown.labels.numpy(), [0, 1, 2, 3, 4, 5, 0, 1, 2, 3])
    # unknown hub id: statistics of the pooled data itself, so the result has mean 0, std 1
    assert float(unknown.images.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(unknown.images.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    pool = np.concatenate([tr, te]).astype(np.float32)[:, None] / 255.0
    np.testing.assert_allclose(
        known.images.numpy(), (pool - MNIST_MEAN) / MNIST_STD, rtol=1e-5, atol=1e-5
    )


def test_dataset_name_validation() -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        data.load_source("imagenet")
    with pytest.raises(ValueError, match="unknown dataset"):
        data.load_source("hf:")
    with pytest.raises(TypeError, match="must be a str"):
        data.load_source(3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- split
def test_split_sizes_disjoint_covering_deterministic() -> None:
    s1 = data.split_indices(5000, 0)
    s2 = data.split_indices(5000, 0)
    s3 = data.split_indices(5000, 1)
    assert (s1.train.size, s1.val.size, s1.test.size) == (3200, 800, 1000)
    for a, b in zip((s1.train, s1.val, s1.test), (s2.train, s2.val, s2.test), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(s1.test, s3.test)
    allidx = np.concatenate([s1.train, s1.val, s1.test])
    np.testing.assert_array_equal(np.sort(allidx), np.arange(5000))  # disjoint and covering
    assert np.all(np.diff(s1.val) > 0) and np.all(np.diff(s1.test) > 0)
    # the training part keeps a random order (IID shards of a label-sorted source stay random)
    assert not np.all(np.diff(s1.train) > 0)


def test_split_official_test() -> None:
    s = data.split_indices(100, 3, official_test_start=70)
    np.testing.assert_array_equal(s.test, np.arange(70, 100))
    assert s.val.size == 14 and s.train.size == 56
    np.testing.assert_array_equal(np.sort(np.concatenate([s.train, s.val])), np.arange(70))


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"n": 2, "data_seed": 0}, ValueError, "would be empty"),
        ({"n": 100, "data_seed": -1}, ValueError, "data_seed"),
        ({"n": 100, "data_seed": 0, "test_fraction": 0.0}, ValueError, r"\(0, 1\)"),
        ({"n": 100, "data_seed": 0, "val_fraction": 1.0}, ValueError, r"\(0, 1\)"),
        ({"n": 100, "data_seed": 0, "val_fraction": "0.2"}, TypeError, "float"),
        ({"n": 100.0, "data_seed": 0}, TypeError, "int"),
        ({"n": 100, "data_seed": 0, "official_test_start": 100}, ValueError, "< n"),
    ],
)
def test_split_validation(kwargs: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match=message):
        data.split_indices(**kwargs)


# --------------------------------------------------------------------------- partitions
def _label_tv(parts: list[np.ndarray], labels_of: dict[int, int], k: int) -> float:
    """Mean total-variation distance between each partition's label law and the global law."""
    allidx = np.concatenate(parts)
    glob = np.bincount([labels_of[i] for i in allidx], minlength=k) / allidx.size
    tvs = []
    for p in parts:
        local = np.bincount([labels_of[i] for i in p], minlength=k) / p.size
        tvs.append(0.5 * np.abs(local - glob).sum())
    return float(np.mean(tvs))


@pytest.fixture(scope="module")
def synthetic_train() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    idx = rng.permutation(10_000)[:5000].astype(np.int64)
    labels = rng.integers(0, 10, size=5000)
    return idx, labels


def test_iid_partitions(synthetic_train: tuple[np.ndarray, np.ndarray]) -> None:
    idx, labels = synthetic_train
    parts = data.partition_indices(idx, labels, 7)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 5000
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(idx))
    again = data.partition_indices(idx, labels, 7)
    for a, b in zip(parts, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_dirichlet_partitions_skewed_and_seeded(
    synthetic_train: tuple[np.ndarray, np.ndarray],
) -> None:
    idx, labels = synthetic_train
    labels_of = dict(zip(idx.tolist(), labels.tolist(), strict=True))
    iid = data.partition_indices(idx, labels, 10)
    dirs = data.partition_indices(
        idx, labels, 10, partitioner="dirichlet", dirichlet_alpha=0.1, seed=3
    )
    np.testing.assert_array_equal(np.sort(np.concatenate(dirs)), np.sort(idx))
    # IID: a partition of s = 500 samples has E[TV] ~ sum_y sqrt(p(1-p)/s) sqrt(2/pi) / 2
    # ~ 0.054 for 10 equiprobable labels, sd well under 0.02. Dir(0.1) puts most of each label
    # on one or two clients, so its TV is ~0.6. The thresholds sit far from both.
    tv_iid = _label_tv(iid, labels_of, 10)
    tv_dir = _label_tv(dirs, labels_of, 10)
    assert tv_iid < 0.12, tv_iid
    assert tv_dir > 0.35, tv_dir
    same = data.partition_indices(
        idx, labels, 10, partitioner="dirichlet", dirichlet_alpha=0.1, seed=3
    )
    other = data.partition_indices(
        idx, labels, 10, partitioner="dirichlet", dirichlet_alpha=0.1, seed=4
    )
    for a, b in zip(dirs, same, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        a.size != b.size or not np.array_equal(a, b) for a, b in zip(dirs, other, strict=True)
    )


def test_partition_validation(synthetic_train: tuple[np.ndarray, np.ndarray]) -> None:
    idx, labels = synthetic_train
    with pytest.raises(ValueError, match="partitioner must be"):
        data.partition_indices(idx, labels, 3, partitioner="shards")
    with pytest.raises(ValueError, match="dirichlet_alpha"):
        data.partition_indices(idx, labels, 3, partitioner="dirichlet", dirichlet_alpha=0.0)
    with pytest.raises(ValueError, match="equal length"):
        data.partition_indices(idx, labels[:-1], 3)
    with pytest.raises(ValueError, match="some partitions would be empty"):
        data.partition_indices(idx[:5], labels[:5], 6)
    with pytest.raises(ValueError, match="min_partition_size"):
        data.partition_indices(idx[:50], labels[:50], 10, min_partition_size=6)


# --------------------------------------------------------------------------- embedded MNIST
def test_embedded_mnist_source() -> None:
    src = data.load_source("mnist")
    assert src.images.shape == (5000, 1, 28, 28)
    assert src.images.dtype == torch.float32 and src.labels.dtype == torch.int64
    assert src.num_classes == 10 and src.in_channels == 1 and src.official_test_start is None
    np.testing.assert_array_equal(np.bincount(src.labels.numpy()), [500] * 10)
    # normalised with the MNIST constants: pixel 0 maps to -mean/std
    assert float(src.images.min()) == pytest.approx(-MNIST_MEAN / MNIST_STD, abs=1e-6)
    assert float(src.images.max()) == pytest.approx((1 - MNIST_MEAN) / MNIST_STD, abs=1e-6)


def test_client_and_server_datasets_agree() -> None:
    src = data.load_source("mnist")
    split = data.split_indices(5000, 5)
    val, test = data.server_datasets("mnist", data_seed=5)
    assert torch.equal(val.tensors[0], src.images[split.val])
    assert torch.equal(test.tensors[1], src.labels[split.test])
    parts = data.partition_indices(split.train, src.labels.numpy()[split.train], 4, seed=5)
    total = 0
    for pid in range(4):
        ds = data.client_dataset("mnist", pid, 4, data_seed=5)
        assert torch.equal(ds.tensors[0], src.images[parts[pid]])
        assert torch.equal(ds.tensors[1], src.labels[parts[pid]])
        total += len(ds)
    assert total == 3200
    fp = data.split_fingerprint("mnist", data_seed=5)
    assert fp == data.split_fingerprint("mnist", data_seed=5) != data.split_fingerprint("mnist")
    dir_ds = data.client_dataset(
        "mnist", 1, 4, partitioner="dirichlet", dirichlet_alpha=0.3, data_seed=5
    )
    assert len(dir_ds) > 0 and dir_ds.tensors[0].shape[1:] == (1, 28, 28)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "message"),
    [
        (("mnist", 4, 4), {}, ValueError, r"partition_id must be in \[0, 4\)"),
        (("mnist", -1, 4), {}, ValueError, "partition_id"),
        (("mnist", 0, 0), {}, ValueError, "num_partitions"),
        (("mnist", 0, 4000), {}, ValueError, "would be empty"),
        (("mnist", 0, 4), {"partitioner": "pathological"}, ValueError, "partitioner"),
        (("mnist", 0, 4), {"data_seed": 1.5}, TypeError, "data_seed"),
        (("mnist", 0, 4), {"use_official_test": True}, ValueError, "no official test"),
        (("cifar100", 0, 4), {}, ValueError, "unknown dataset"),
    ],
)
def test_client_dataset_validation(args: tuple, kwargs: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match=message):
        data.client_dataset(*args, **kwargs)

"""FEMNIST and Shakespeare offline: tiny files in the hub's own formats, loaded as a user would.

``flwrlabs/femnist`` serves parquet (``data/train-*.parquet``: ``image`` PNG, ``writer_id``,
``hsf_id``, ``character`` as a 62-class ``ClassLabel``); ``flwrlabs/shakespeare`` serves one
``shakespeare.csv`` (``character_id``, ``x``: 80 letters, ``y``: the next letter). The tests
write such files with ``datasets`` itself (its parquet keeps the feature types in the schema, as
the hub's files do) and read them through ``data-dir``.
"""

from __future__ import annotations

import csv
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from corbin_fl.app import data, leaf
from corbin_fl.app.config import AppConfig
from corbin_fl.app.models import build_model
from corbin_fl.app.training import evaluate, train_local
from corbin_fl.config import ConfigError
from corbin_fl.layout import layout_of

FEMNIST_NAMES = [*string.digits, *string.ascii_uppercase, *string.ascii_lowercase]
WRITERS = ("f0000_14", "f0001_41", "f0002_27", "f0003_09")
ROLES = ("THE_TEMPEST_PROSPERO", "HAMLET_OPHELIA", "MACBETH_MACBETH")


def write_femnist(folder: Path, per_writer: int = 30) -> Path:
    """A hub-format FEMNIST copy: writer ``w`` draws class ``(7 w + i) mod 62``."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    rows: dict[str, list] = {"image": [], "writer_id": [], "hsf_id": [], "character": []}
    for w, writer in enumerate(WRITERS):
        for i in range(per_writer):
            label = (7 * w + i) % 62
            pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
            pixels[label % 28, :] = 255  # something to learn
            rows["image"].append(Image.fromarray(pixels, mode="L"))
            rows["writer_id"].append(writer)
            rows["hsf_id"].append(w % 8)
            rows["character"].append(label)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "hsf_id": datasets.Value("int64"),
            "character": datasets.ClassLabel(names=FEMNIST_NAMES),
        }
    )
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(
        folder / "data" / "train-00000-of-00001.parquet"
    )
    return folder


def write_shakespeare(folder: Path, per_role: int = 25) -> Path:
    """A hub-format ``shakespeare.csv``: 80-letter windows of a text and the next letter."""
    text = (
        "O, wonder! How many goodly creatures are there here! How beauteous mankind is! "
        "O brave new world, That has such people in't. To be, or not to be: that is the "
        "question. Is this a dagger which I see before me, the handle toward my hand? "
    ) * 4
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "shakespeare.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["character_id", "x", "y"])
        for r, role in enumerate(ROLES):
            for i in range(per_role):
                start = 11 * r + 3 * i
                out.writerow([role, text[start : start + 80], text[start + 80]])
    return folder


@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_femnist(tmp_path_factory.mktemp("femnist"))


@pytest.fixture(scope="module")
def shakespeare_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shakespeare(tmp_path_factory.mktemp("shakespeare"))


def test_femnist_loads_images_labels_and_writers(femnist_dir: Path) -> None:
    arrays = leaf.load_leaf("femnist", femnist_dir)
    assert arrays.inputs.shape == (120, 1, 28, 28) and arrays.inputs.dtype == np.uint8
    assert arrays.num_classes == 62 and not arrays.tokens
    assert sorted(np.unique(arrays.groups).tolist()) == [0, 1, 2, 3]
    # Row order is the file's: writer w's i-th row has class (7 w + i) mod 62.
    want = [(7 * w + i) % 62 for w in range(4) for i in range(30)]
    assert arrays.labels.tolist() == want
    info = data.dataset_info("femnist", femnist_dir)
    assert (info.num_classes, info.in_channels, info.image_size) == (62, 1, (28, 28))


def test_shakespeare_loads_letters_and_roles(shakespeare_dir: Path) -> None:
    arrays = leaf.load_leaf("shakespeare", shakespeare_dir)
    assert arrays.inputs.shape == (75, 80) and arrays.tokens and arrays.num_classes == 80
    with (shakespeare_dir / "shakespeare.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    letters = leaf.LEAF_LETTERS
    for i, row in enumerate(rows):  # every row decodes back to the file's text
        assert "".join(letters[j] for j in arrays.inputs[i]) == row["x"]
        assert letters[int(arrays.labels[i])] == row["y"]
    assert len(np.unique(arrays.groups)) == len(ROLES)
    info = data.dataset_info("shakespeare", shakespeare_dir)
    assert info.tokens and info.image_size == (1, 80) and info.num_classes == 80


def test_natural_partition_gives_each_client_one_writer(femnist_dir: Path) -> None:
    raw = data._raw("femnist", femnist_dir)
    assert raw.groups is not None
    parts = [
        data.client_rows(
            "femnist", pid, 3, partitioner="natural", data_seed=1, data_dir=femnist_dir
        )
        for pid in range(3)
    ]
    writers = [set(raw.groups[p].tolist()) for p in parts]
    assert all(len(w) == 1 for w in writers)  # one writer per client
    assert len(set().union(*writers)) == 3  # three different writers
    split = data._split_cached("femnist", data._folder("femnist", femnist_dir), 1, False)
    train = set(split.train.tolist())
    for p, w in zip(parts, writers, strict=True):
        (only,) = w
        # The client holds every training row of its writer, and only training rows.
        assert set(p.tolist()) == {i for i in train if raw.groups[i] == only}
    with pytest.raises(ValueError, match="fewer than the 9 clients"):
        data.client_rows("femnist", 0, 9, partitioner="natural", data_dir=femnist_dir)
    with pytest.raises(ValueError, match="writers or roles"):
        data.partition_indices(np.arange(10), np.zeros(10), 2, partitioner="natural")


def test_iid_partition_of_femnist_and_config_rules(femnist_dir: Path) -> None:
    parts = [
        data.client_rows("femnist", pid, 4, data_dir=femnist_dir, partitioner="iid")
        for pid in range(4)
    ]
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ConfigError, match="natural") as err:
        AppConfig.from_flower({"partitioner": "natural"})  # mnist has no writers
    assert set(err.value.errors) == {"dataset"}
    with pytest.raises(ConfigError, match="char-lstm") as err:
        AppConfig.from_flower({"dataset": "shakespeare"})
    assert set(err.value.errors) == {"model"}
    with pytest.raises(ConfigError, match="char-lstm") as err:
        AppConfig.from_flower({"model": "char-lstm"})
    assert set(err.value.errors) == {"dataset"}
    AppConfig.from_flower(
        {"dataset": "shakespeare", "model": "char-lstm", "partitioner": "natural"}
    )


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_the_task_model_trains_and_evaluates(
    name: str, femnist_dir: Path, shakespeare_dir: Path
) -> None:
    """The paper's CNN with 62 classes on FEMNIST, LEAF's LSTM on Shakespeare: a few steps lower
    the training loss on a client's rows; evaluation runs on the server's rows."""
    folder = femnist_dir if name == "femnist" else shakespeare_dir
    info = data.dataset_info(name, folder)
    model = build_model(
        "cnn" if name == "femnist" else "char-lstm", info.in_channels, info.num_classes, seed=0
    )
    assert layout_of(model).m > 0
    rows = data.client_rows(name, 0, 2, data_dir=folder)
    train = data.dataset_rows(name, rows, data_dir=folder)
    x, y = train.tensors
    assert x.dtype == (torch.int64 if name == "shakespeare" else torch.float32)
    with torch.no_grad():
        before = torch.nn.functional.cross_entropy(model(x), y).item()
    train_local(
        model,
        train,
        epochs=20,
        batch_size=16,
        seed=0,
        lr=1e-2,
        weight_decay=0.0,
        device=torch.device("cpu"),
    )
    with torch.no_grad():
        after = torch.nn.functional.cross_entropy(model(x), y).item()
    assert after < before
    _val, test = data.server_datasets(name, data_dir=folder)
    result = evaluate(model, test, device=torch.device("cpu"))
    assert result.num_examples == len(test) and 0.0 <= result.accuracy <= 1.0


def test_bad_leaf_files_fail_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        leaf.load_leaf("femnist", tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "shakespeare.csv").write_text("character_id,x,y\nA,abc,d\nB,ab,c\n")
    with pytest.raises(ValueError, match="same length"):
        leaf.load_leaf("shakespeare", bad)
    (bad / "shakespeare.csv").write_text("character_id,x,y\nA,ab\u00e9,d\n")
    with pytest.raises(ValueError, match="alphabet"):
        leaf.load_leaf("shakespeare", bad)
    (bad / "shakespeare.csv").write_text("role,x,y\nA,abc,d\n")
    with pytest.raises(ValueError, match="missing columns"):
        leaf.load_leaf("shakespeare", bad)
    with pytest.raises(ValueError, match="unknown LEAF task"):
        leaf.load_leaf("sent140", bad)

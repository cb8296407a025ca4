"""This project's task settings: the data sets, partitions, models and optimizers that its
run-config keys name, and the checks of those keys.

The fields are :class:`corbin_fl.app.config.AppConfig`'s (``dataset``, ``model``,
``local-epochs``, ...), beside the protocol's that it extends (:class:`corbin_fl.config.RunConfig`
names no data set or model); everything that names a data set or a model is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from corbin_fl.mechanisms import validate

if TYPE_CHECKING:
    from corbin_fl.app.config import AppConfig

DATASETS: Final[tuple[str, ...]] = (
    *("mnist", "fashion-mnist", "mnist-idx", "cifar10", "femnist", "shakespeare"),
)
"""Dataset names of ``corbin_fl.app.data`` (``hf:<hub-id>`` is accepted too)."""
DATASETS_WITH_DEFAULT_DIR: Final[Mapping[str, str]] = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",
}
"""Datasets read from files in ``data-dir`` that have a default folder when it is empty
(Debian's ``dataset-fashion-mnist`` installs there). They are always tested on their official
test split, as their literature is: ``use-official-test`` reads true whatever was given (the
app's own default, false, reaches the ServerApp like a setting; ``corbin-fl local|simulate``
refuses an explicit false before anything starts)."""
DATASETS_NEEDING_DIR: Final[Mapping[str, str]] = {
    "mnist-idx": "the MNIST IDX files (train-images-idx3-ubyte[.gz], ...)",
    "cifar10": "the CIFAR-10 python batches (cifar-10-batches-py/)",
}
"""Datasets read from files in ``data-dir`` (-> what that folder holds); ``hf:<hub-id>`` uses
``data-dir`` as an optional download cache, and ``mnist`` is embedded and reads none."""
PARTITIONERS: Final[tuple[str, ...]] = ("iid", "dirichlet", "natural")
MODELS: Final[tuple[str, ...]] = ("cnn", "resnet18", "char-lstm")
LEAF_DATASETS: Final[tuple[str, ...]] = ("femnist", "shakespeare")
"""Datasets whose rows carry a writer / role (the ``natural`` partition); ``data-dir`` is a local
copy of the hub files, or empty for the hub (``app/leaf.py``)."""
OPTIMIZERS: Final[tuple[str, ...]] = ("adam", "sgd")


def config_errors(cfg: AppConfig) -> dict[str, str]:
    """The run-config errors of the task's keys (empty when fine): data set and its files,
    partition, model, local training, the update-radius rule (``R`` derived from the app's Adam
    steps), simulated dropout, server-side evaluation batch.

    Combinations are reported on the key that must change given the other (dataset,
    partitioner or model alone is always valid; experiment specs check keys one by one).
    """
    hub = cfg.dataset.startswith("hf:") and len(cfg.dataset) > 3
    errors = validate.reasons(
        ("dataset", None if hub else validate.why_one_of(cfg.dataset, DATASETS)),
        ("partitioner", validate.why_one_of(cfg.partitioner, PARTITIONERS)),
        ("model", validate.why_one_of(cfg.model, MODELS)),
        ("optimizer", validate.why_one_of(cfg.optimizer, OPTIMIZERS)),
        ("data-seed", validate.why_at_least(cfg.data_seed, 0)),
        ("dirichlet-alpha", validate.why_positive(cfg.dirichlet_alpha)),
        ("local-epochs", validate.why_at_least(cfg.local_epochs, 1)),
        ("batch-size", validate.why_at_least(cfg.batch_size, 1)),
        ("lr", validate.why_positive(cfg.lr)),
        ("weight-decay", validate.why_at_least(cfg.weight_decay, 0.0)),
        ("max-steps", validate.why_at_least(cfg.max_steps, 0)),
        ("dropout-prob", validate.why_probability(cfg.dropout_prob, lo_open=False)),
        ("eval-batch-size", validate.why_at_least(cfg.eval_batch_size, 1)),
    )
    if cfg.dataset in DATASETS_NEEDING_DIR and not cfg.data_dir:
        errors["data-dir"] = (
            f'dataset "{cfg.dataset}" reads {DATASETS_NEEDING_DIR[cfg.dataset]} from '
            'data-dir, which is empty: set data-dir to that folder ("mnist" is embedded '
            "and needs none)"
        )
    if cfg.partitioner == "natural" and cfg.dataset not in LEAF_DATASETS:
        errors.setdefault(
            "dataset",
            f'partitioner "natural" needs a dataset whose rows have a writer or role '
            f"({', '.join(LEAF_DATASETS)}), not {cfg.dataset!r}",
        )
    if cfg.model == "char-lstm" and cfg.dataset != "shakespeare":
        errors.setdefault(
            "dataset",
            f'model "char-lstm" predicts letters: dataset = "shakespeare", not {cfg.dataset!r}',
        )
    if cfg.dataset == "shakespeare" and cfg.model != "char-lstm":
        errors.setdefault(
            "model",
            f'shakespeare is next-letter prediction: model = "char-lstm", not {cfg.model!r}',
        )
    derived_radius = cfg.quantizes_update and cfg.update_radius == 0
    if derived_radius and cfg.optimizer == "sgd":
        errors["update-radius"] = (
            "0 derives R = steps x lr from Adam's per-step bound, but optimizer is "
            f'"{cfg.optimizer}": set update-radius > 0'
        )
    return errors

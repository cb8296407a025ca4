"""This app's run configuration: the protocol's (:class:`corbin_fl.config.RunConfig`) and the
task's settings (data, model, local training, simulated dropout, server-side evaluation), one
frozen, validated dataclass parsed once from Flower's ``run_config``.

:class:`AppConfig` extends the protocol's config with the task's fields and their checks
(:func:`corbin_fl.app.task.config_errors`), so the app's ``run_config`` is still one table
(``pyproject.toml`` ``[tool.flwr.app.config]``, its keys in the order :attr:`AppConfig.KEYS_AFTER`
keeps), one parse and one error list: an unknown key is refused with a did-you-mean and every bad
key is listed at once, before anything starts. The building block (``corbin_fl``, ``server``,
``client``, ``mechanisms``) sees it as a :class:`~corbin_fl.config.RunConfig`: the server records
its :meth:`~corbin_fl.config.RunConfig.to_flower` (every key, the task's too) in ``summary.json``
and addresses a run by its :meth:`~corbin_fl.config.RunConfig.result_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from corbin_fl.app import task
from corbin_fl.config import EXECUTION, PARAMS_AFTER, RunConfig

__all__ = ["AppConfig"]


@dataclass(frozen=True)
class AppConfig(RunConfig):
    """The protocol's settings (:class:`~corbin_fl.config.RunConfig`) and this app's task.

    Attributes
    ----------
    dataset, data_dir, use_official_test, data_seed, partitioner, dirichlet_alpha
        Data (``corbin_fl.app.data``; names in :mod:`corbin_fl.app.task`): ``mnist`` (embedded),
        ``fashion-mnist`` (IDX files, default folder ``DATASETS_WITH_DEFAULT_DIR``, official test
        split), ``mnist-idx`` (any IDX files in MNIST's format), ``cifar10``, the LEAF
        tasks ``femnist`` and ``shakespeare`` (``corbin_fl.app.leaf``) or ``hf:<hub-id>``; folder
        with the files; keep the source's own test split; seed of the split; partition scheme
        (``iid``, ``dirichlet``, or ``natural``: one LEAF writer / role per client) and its
        Dirichlet concentration.
    model : str
        ``cnn`` (small VGG-style, MNIST; FEMNIST with 62 classes), ``resnet18`` (CIFAR-10) or
        ``char-lstm`` (Shakespeare, LEAF's next-letter LSTM).
    local_epochs, batch_size, optimizer, lr, weight_decay, max_steps
        Local training; ``max_steps`` caps the optimizer steps per round (0 = no cap). With
        ``update-radius = 0`` the server derives ``R = S * lr`` from these public settings only
        (:func:`corbin_fl.app.training.step_bound`): Adam moves a weight by about ``lr`` per
        step, and ``S`` is ``max-steps`` or one client's share of the public training split,
        ``local-epochs * ceil(N_train / (N * batch-size))`` with ``N`` the nodes connected at the
        start of the run. That needs ``optimizer = "adam"`` (an SGD step has no such bound: give
        ``update-radius > 0``).
    dropout_prob : float
        Probability that a client fails a message on purpose (simulated dropout), in [0, 1).
    eval_batch_size : int
        Batch size of server-side evaluation.
    """

    KEYS_AFTER: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "update-radius": (
                *("dataset", "data-dir", "use-official-test", "data-seed", "partitioner"),
                *("dirichlet-alpha", "model", "local-epochs", "batch-size", "optimizer", "lr"),
                *("weight-decay", "max-steps"),
            ),
            PARAMS_AFTER: ("dropout-prob",),
            "device": ("eval-batch-size",),
        }
    )
    """The task's keys among the protocol's, where they have always been (``summary.json`` and
    the ``pyproject.toml`` table keep their order)."""

    dataset: str = "mnist"
    data_dir: str = field(default="", metadata=EXECUTION)
    use_official_test: bool = False
    data_seed: int = 0
    partitioner: str = "iid"
    dirichlet_alpha: float = 0.5
    model: str = "cnn"
    local_epochs: int = 1
    batch_size: int = 64
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 3e-3
    max_steps: int = 0
    dropout_prob: float = 0.0
    eval_batch_size: int = field(default=512, metadata=EXECUTION)

    @classmethod
    def _implied(cls, values: dict[str, Any]) -> None:
        """A data set of :data:`~corbin_fl.app.task.DATASETS_WITH_DEFAULT_DIR` is always tested on
        its official test split (its literature's test set, see the constant)."""
        if values.get("dataset") in task.DATASETS_WITH_DEFAULT_DIR:
            values["use_official_test"] = True

    def _app_errors(self) -> dict[str, str]:
        """The task's keys (data, model, local training, dropout, evaluation batch):
        :func:`corbin_fl.app.task.config_errors`."""
        return task.config_errors(self)

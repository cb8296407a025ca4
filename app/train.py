"""This project's own local training: the ``@app.train()`` handler of its ClientApp.

It is an ordinary Flower train handler, like any app's: it reads the global model from
``msg.content["arrays"]``, trains on the node's partition (Alg. 3 line 4) with the run config's
settings (model, data, optimizer) and replies with ``{"arrays": the trained model, "metrics":
{train-loss, num-examples, steps, startup-seconds, handler-seconds, import-seconds,
device-seconds, model-seconds, data-seconds, setup-seconds, train-seconds},
"train-info": {device}}`` (``device``: where it trained, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100
80GB HBM3)"``; the server records it per client in ``metrics.jsonl`` and ``summary.json``).
``startup-seconds`` is the age of the ClientApp process when the handler began (interpreter
start, Flower's ClientApp runtime, pulling the message and the app bundle, imports), and
``handler-seconds`` the handler's own time: the deployment benchmark reads them to split a round
trip into Flower's waiting and the app's work. The handler's time splits into ``import-seconds``
(loading torch and the training code), ``device-seconds`` (the device's start: on CUDA the context
and its libraries, paid once per process), ``model-seconds`` (building the model, loading the
global weights, moving it to the device), ``data-seconds`` (the node's partition),
``setup-seconds`` (the training call outside its loop: building the optimizer, whose first use
imports ``torch._dynamo``) and ``train-seconds`` (the training loop); the rest is the reply (the
trained weights back to the host).

It knows nothing of privacy: the :func:`client.mod.corbin_mod` in front of it turns the trained
model into the one-bit update and never lets these arrays leave the node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar, Literal, overload

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from corbin_fl import wire
from corbin_fl.app.config import AppConfig

STATE_PARTITION = "corbin.partition"
"""``context.state`` ConfigRecord ``{"key": ...}``: what the cached partition rows were computed for
(dataset, split, partitioner, partition); the rows are the ArrayRecord
:data:`STATE_PARTITION_ROWS` (a RecordDict has one namespace for all record types)."""
STATE_PARTITION_ROWS = "corbin.partition.rows"
ARRAYS: str = "arrays"
"""Record of the model in the train instruction and reply (Flower's ``FedAvg`` default)."""
TRAIN_INFO: str = "train-info"
"""ConfigRecord of the reply with the training device under ``device``
(:data:`server.metrics.DEVICE_KEY`)."""


@overload
def partition(context: Context, *, required: Literal[True] = ...) -> tuple[int, int]: ...
@overload
def partition(context: Context, *, required: bool) -> tuple[int, int] | None: ...
def partition(context: Context, *, required: bool = True) -> tuple[int, int] | None:
    """``(partition-id, num-partitions)`` from the node config (None if absent and not required)."""
    pid, num = context.node_config.get("partition-id"), context.node_config.get("num-partitions")
    if pid is None or num is None:
        if required:
            raise ValueError("node config lacks partition-id / num-partitions")
        return None
    if isinstance(pid, bool) or isinstance(num, bool):
        raise TypeError("partition-id and num-partitions must be integers")
    pid, num = int(pid), int(num)
    if not 0 <= pid < num:
        raise ValueError(f"partition-id {pid} not in [0, num-partitions={num})")
    return pid, num


class LocalTask:
    """Model skeleton, layout, device and dataset facts of this process (built once).

    In deployment every message starts a new ClientApp process, so the cache only helps within a
    message; in simulation it spares rebuilding the model every round.
    """

    _cache: ClassVar[dict[tuple[Any, ...], LocalTask]] = {}

    def __init__(self, cfg: AppConfig) -> None:
        # Imported here, not at the top: each imports torch, which a ClientApp process that
        # answers keygen or pair must not load (app/client_app.py imports this module;
        # tests/unit/test_lazy_imports.py). The same holds for every import below.
        from corbin_fl.app.data import dataset_info
        from corbin_fl.app.models import empty_model
        from corbin_fl.devices import device_label, pick_device
        from corbin_fl.layout import layout_of

        t0 = time.perf_counter()
        self.device = pick_device(cfg.device)
        self.device_name = device_label(self.device)
        start_device(self.device)
        self.device_seconds = time.perf_counter() - t0
        """Seconds the device took to start (CUDA context), paid by the first message only."""
        self.info = dataset_info(cfg.dataset, cfg.data_dir or None)
        # Uninitialised: the handler overwrites every entry with the global model (strict load).
        self.model = empty_model(cfg.model, self.info.in_channels, self.info.num_classes)
        self.layout = layout_of(self.model)

    @classmethod
    def get(cls, cfg: AppConfig) -> LocalTask:
        """The cached task for ``cfg``'s model, dataset and device."""
        key = (cfg.model, cfg.dataset, cfg.data_dir, cfg.device)
        task = cls._cache.get(key)
        if task is None:
            task = cls._cache[key] = LocalTask(cfg)
        return task

    def take_device_seconds(self) -> float:
        """The device's start-up seconds the first time asked, 0 afterwards (it starts once)."""
        seconds, self.device_seconds = self.device_seconds, 0.0
        return seconds


def start_device(device: Any) -> None:
    """Start ``device`` now: on CUDA, create the context (and load its libraries) with one tiny
    allocation, so that its cost is measured apart from the model's and the data's."""
    if device.type == "cuda":
        import torch  # lazy: see LocalTask.__init__

        torch.empty(1, device=device)
        torch.cuda.synchronize(device)


def _train_seed(cfg: AppConfig, partition: int, rnd: int) -> int:
    """Public, reproducible batch-order seed per (run seed, partition, round)."""
    return int(
        np.random.SeedSequence([cfg.seed, partition, rnd]).generate_state(1, np.uint64)[0] >> 1
    )


def local_dataset(cfg: AppConfig, context: Context, pid: int, num: int) -> Any:
    """The node's training partition, with its row indices kept in ``context.state``.

    In deployment every message runs in a fresh ClientApp process; computing the partition
    needs the ``flwr_datasets`` partitioners (Hugging Face ``datasets``, pandas, pyarrow: several
    seconds of imports), so only the first round does it and later rounds reuse the rows.
    """
    from corbin_fl.app.data import client_rows, dataset_rows  # lazy (torch): LocalTask.__init__

    key = "|".join(
        str(v)
        for v in (
            cfg.dataset,
            cfg.data_dir,
            cfg.data_seed,
            cfg.use_official_test,
            cfg.partitioner,
            cfg.dirichlet_alpha,
            pid,
            num,
        )
    )
    tag = context.state.config_records.get(STATE_PARTITION)
    cached = context.state.array_records.get(STATE_PARTITION_ROWS)
    if tag is not None and cached is not None and tag.get("key") == key and "rows" in cached:
        return dataset_rows(cfg.dataset, cached["rows"].numpy(), data_dir=cfg.data_dir or None)
    rows = client_rows(
        cfg.dataset,
        pid,
        num,
        partitioner=cfg.partitioner,
        dirichlet_alpha=cfg.dirichlet_alpha,
        data_seed=cfg.data_seed,
        data_dir=cfg.data_dir or None,
        use_official_test=cfg.use_official_test,
    )
    context.state.array_records[STATE_PARTITION_ROWS] = ArrayRecord(
        {"rows": wire.to_array(np.ascontiguousarray(rows, dtype=np.int64))}
    )
    context.state.config_records[STATE_PARTITION] = ConfigRecord({"key": key})
    return dataset_rows(cfg.dataset, rows, data_dir=cfg.data_dir or None)


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None where that is unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def train(msg: Message, context: Context) -> Message:
    """Train the global model on this node's partition and reply with the trained model.

    Raises
    ------
    ValueError, TypeError
        A bad run config or node config, or an instruction without the model.
    """
    startup = process_age()
    t0 = time.perf_counter()
    from corbin_fl.app.training import train_local  # lazy (torch), measured: import-seconds

    t_import = time.perf_counter()
    cfg = AppConfig.from_flower(context.run_config)
    if ARRAYS not in msg.content.array_records:
        raise ValueError(f"train instruction without the model record {ARRAYS!r}")
    task = LocalTask.get(cfg)
    device_seconds = task.take_device_seconds()
    model = task.model
    state = msg.content.array_records[ARRAYS].to_torch_state_dict()
    model.load_state_dict(state, strict=True)
    model.to(task.device)
    t_model = time.perf_counter()
    rnd = 0
    if "config" in msg.content.config_records:
        value = msg.content.config_records["config"].get("server-round", 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"server-round must be an int, got {type(value).__name__}")
        rnd = value
    pid, num = partition(context)
    data = local_dataset(cfg, context, pid, num)
    t_data = time.perf_counter()
    trained = train_local(
        model,
        data,
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        seed=_train_seed(cfg, pid, rnd),
        device=task.device,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        max_steps=cfg.max_steps or None,
    )
    t_fit = time.perf_counter()
    metrics = MetricRecord(
        {
            wire.M_TRAIN_LOSS: float(trained.loss),
            wire.M_NUM_EXAMPLES: int(trained.num_examples),
            "steps": int(trained.steps),
            "train-seconds": float(trained.seconds),
            "import-seconds": t_import - t0,
            "device-seconds": device_seconds,
            "model-seconds": t_model - t_import - device_seconds,
            "data-seconds": t_data - t_model,
            "setup-seconds": max(0.0, t_fit - t_data - float(trained.seconds)),
        }
    )
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    metrics["handler-seconds"] = time.perf_counter() - t0
    if startup is not None:
        metrics["startup-seconds"] = startup
    info = ConfigRecord({"device": task.device_name})
    return Message(RecordDict({ARRAYS: arrays, "metrics": metrics, TRAIN_INFO: info}), reply_to=msg)

"""quickstart: the ClientApp in pure numpy (softmax regression on float64 arrays).

The same shape as the PyTorch ClientApp, and the same one-line privacy change: ``corbin_mod``.
The handler sees the global model as numpy arrays and replies with numpy arrays; the mod does not
care which framework produced them or which float dtype they have.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from corbin_fl import corbin_mod
from quickstart.data import load_partition
from quickstart.task_numpy import train as train_fn

app = ClientApp(mods=[corbin_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the global ``[W, b]`` on this node's data and reply with the trained arrays."""
    model = msg.content["arrays"].to_numpy_ndarrays()
    x, y = load_partition(
        int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )
    trained, train_loss = train_fn(
        model,
        x,
        y,
        epochs=int(context.run_config["local-epochs"]),
        lr=float(msg.content["config"]["lr"]),
        batch_size=int(context.run_config["batch-size"]),
    )
    metrics = {"train_loss": train_loss, "num-examples": len(y)}
    content = RecordDict({"arrays": ArrayRecord(trained), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)

"""quickstart: the ClientApp (PyTorch).

The train handler is Flower's PyTorch quickstart handler, unchanged: load the global model, train
on this node's share, reply with the trained weights and ``num-examples``. ``corbin_mod`` wraps it:
it answers CorBin-FL's key and pairing messages itself, checks every instruction against this
node's privacy policy (node config ``corbin-max-epsilon``, ``corbin-mechanisms``), and replaces
the trained weights in the reply by one bit per parameter.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from corbin_fl import corbin_mod
from quickstart.task import Net, load_data
from quickstart.task import train as train_fn

app = ClientApp(mods=[corbin_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the global model on this node's data and reply with the trained weights."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = "cuda" if torch.cuda.is_available() else "cpu"

    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    batch_size = int(context.run_config["batch-size"])
    trainloader = load_data(partition_id, num_partitions, batch_size)

    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(msg.content["config"]["lr"]),
        device,
    )

    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    model_record = ArrayRecord(model.state_dict())
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)

"""quickstart: the ServerApp (PyTorch).

Flower's quickstart ServerApp with one change: the ``FedAvg`` strategy is wrapped in ``CorBin``,
which runs CorBin-FL's rounds (key exchange, pairing, one-bit correlated updates) and hands the
decoded mean of the updates to ``FedAvg``. The server evaluates the global model on held-out
digits after every round.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from corbin_fl import CorBin
from quickstart.task import Net, load_test_data, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` private FedAvg rounds over every connected SuperNode."""
    num_rounds = int(context.run_config["num-server-rounds"])
    lr = float(context.run_config["lr"])
    out_dir = str(context.run_config["out-dir"])

    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    strategy = CorBin(
        FedAvg(fraction_train=float(context.run_config["fraction-train"]), fraction_evaluate=0.0),
        epsilon=float(context.run_config["epsilon"]),
        # how long a stage waits for its replies: the defaults suit a laptop; a slow or busy
        # machine (or a test that measured its own) sets them in the run config
        stage_timeout=float(context.run_config["stage-timeout"]),
        first_stage_timeout=float(context.run_config["first-stage-timeout"]),
        out_dir=out_dir,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    if out_dir:
        path = Path(out_dir) / "final_model.pt"
        torch.save(result.arrays.to_torch_state_dict(), path)
        log(INFO, "final model saved to %s", path)


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Test accuracy and loss of the global model on the server's held-out digits."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loss, accuracy = test(model, load_test_data(), device)
    log(INFO, "round %d: test accuracy %.4f, loss %.4f", server_round, accuracy, loss)
    return MetricRecord({"accuracy": accuracy, "loss": loss})

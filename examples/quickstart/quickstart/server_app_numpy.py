"""quickstart: the ServerApp for the numpy ClientApp (softmax regression, float64 arrays).

The same private FedAvg as the PyTorch ServerApp: ``CorBin`` around ``FedAvg``, server-side
evaluation on the held-out digits after every round.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from corbin_fl import CorBin
from quickstart.data import load_test
from quickstart.task_numpy import init_model, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` private FedAvg rounds of softmax regression."""
    strategy = CorBin(
        FedAvg(fraction_train=float(context.run_config["fraction-train"]), fraction_evaluate=0.0),
        epsilon=float(context.run_config["epsilon"]),
        # how long a stage waits for its replies: the defaults suit a laptop; a slow or busy
        # machine (or a test that measured its own) sets them in the run config
        stage_timeout=float(context.run_config["stage-timeout"]),
        first_stage_timeout=float(context.run_config["first-stage-timeout"]),
        out_dir=str(context.run_config["out-dir"]),
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(init_model()),
        train_config=ConfigRecord({"lr": float(context.run_config["lr"])}),
        num_rounds=int(context.run_config["num-server-rounds"]),
        evaluate_fn=global_evaluate,
    )


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Test accuracy and loss of the global ``[W, b]`` on the server's held-out digits."""
    x, y = load_test()
    loss, accuracy = test(arrays.to_numpy_ndarrays(), x, y)
    log(INFO, "round %d: test accuracy %.4f, loss %.4f", server_round, accuracy, loss)
    return MetricRecord({"accuracy": accuracy, "loss": loss})

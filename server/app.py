"""The CorBin-FL ServerApp (Flower 1.41 Message API).

``flwr run`` starts it with the run's ``run_config``; it is parsed once into a validated
:class:`corbin_fl.config.RunConfig` (a bad config fails here, listing every bad key), then
:func:`server.round.run_training` runs the rounds.
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from corbin_fl.config import RunConfig, configure_app_logging

logger = logging.getLogger(__name__)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of the ServerApp: validate the run config, then train."""
    from server.round import run_training

    configure_app_logging()
    cfg = RunConfig.from_flower(context.run_config)
    run_training(grid, cfg)

"""Run Flower's SuperNode, and end its process when the SuperNode stops serving the SuperLink.

The supernode image starts ``flower-supernode`` through this file::

    python3 /opt/corbin-fl/supernode.py [flower-supernode's arguments ...]

It passes its arguments to Flower's own entry point (``flwr.supernode.cli.flower_supernode``,
the console script ``flower-supernode``) unchanged. What it adds is one exit.

Flower 1.42's SuperNode gives up its connection when a call fails with an error that names
TLS (``"SSL/TLS handshake error detected"``: a SuperLink that dies mid-handshake cuts it short)
or when its ``--max-retries`` / ``--max-wait-time`` are spent. Once the node had connected, the
connection's context manager logs the error, deactivates the node and returns, so
``flower_supernode()`` returns; but the Runtime API's server thread
(``supernode-runtime-http-api``, not a daemon thread) keeps the process alive, in
``threading._shutdown``, without a connection, for ever. The node never comes back, and a
container's restart policy does not act because nothing exited.

Here, when ``flower_supernode()`` returns, or raises anything but ``SystemExit`` /
``KeyboardInterrupt``, the process ends with status :data:`EXIT_CONNECTION_LOST` (``os._exit``:
the stuck thread cannot hold it). The compose files' ``restart: unless-stopped`` then starts a
fresh SuperNode, which connects again with the same key (the same node, with SuperNode
authentication). ``SystemExit`` is Flower's own exit (``flwr_exit``, its signal handlers:
``docker stop``), which stops the Runtime API first: it propagates as it is.

The ``flower-superexec`` that the SuperNode started (``--parent-pid``) ends by itself when its
parent is gone. Only the standard library and ``flwr`` are needed, as in the image.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

logger = logging.getLogger("corbin-fl.supernode")

#: Exit status when the SuperNode stopped serving the SuperLink without being asked to.
EXIT_CONNECTION_LOST = 1

PROGRAM = "flower-supernode"


def run(main: Callable[[], None]) -> NoReturn:
    """Call ``main`` (Flower's SuperNode) and end the process once it stops serving.

    Parameters
    ----------
    main : Callable[[], None]
        The SuperNode's entry point; it reads ``sys.argv`` itself.

    Raises
    ------
    SystemExit, KeyboardInterrupt
        Those of ``main``, unchanged (Flower's own, orderly exits).
    """
    try:
        main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception:
        logger.exception(
            "The SuperNode failed; exiting with status %d so that its restart policy starts "
            "it again",
            EXIT_CONNECTION_LOST,
        )
    else:
        logger.error(
            "The SuperNode gave up its connection to the SuperLink (its log above says why); "
            "exiting with status %d so that its restart policy starts it again",
            EXIT_CONNECTION_LOST,
        )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CONNECTION_LOST)


def main() -> NoReturn:
    """Run ``flower-supernode`` with this process's arguments (see the module doc)."""
    from flwr.supernode.cli import flower_supernode

    # Its own handler: Flower's logger ("flwr") has its own, and the root stays as Flower left it.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    sys.argv[0] = PROGRAM
    run(flower_supernode)


if __name__ == "__main__":
    main()

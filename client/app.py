"""The CorBin-FL ClientApp (Flower 1.41 Message API): one handler per message type.

``query.keygen`` -> :func:`client.handlers.keygen`, ``query.pair`` -> :func:`client.handlers.pair`,
``train.update`` -> :func:`client.handlers.update`. Each goes through
:func:`client.handlers.handle`, which answers a bad instruction with an error reply instead of
raising into Flower's executor. torch is only imported by the update handler.
"""

from __future__ import annotations

from collections.abc import Iterator

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client import handlers
from corbin_fl.config import configure_app_logging

app = ClientApp()


@app.lifespan()
def lifespan(context: Context) -> Iterator[None]:
    """Route this app's log lines (fall-backs, rejections) to the ClientApp's output."""
    configure_app_logging()
    yield


@app.query("keygen")
def keygen(msg: Message, context: Context) -> Message:
    """``query.keygen``: a fresh X25519 public key for this round."""
    return handlers.handle(msg, context, handlers.keygen)


@app.query("pair")
def pair(msg: Message, context: Context) -> Message:
    """``query.pair``: the encrypted ``Y || seed`` blob for the partner."""
    return handlers.handle(msg, context, handlers.pair)


@app.train("update")
def update(msg: Message, context: Context) -> Message:
    """``train.update``: train locally, encode with the mechanism, reply with the update."""
    return handlers.handle(msg, context, handlers.update)

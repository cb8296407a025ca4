"""Deploying CorBin-FL with Flower: the tooling around the app, never shipped in its bundle.

Starting, health-checking, following and stopping a local Flower deployment (SuperLink,
SuperNodes, the ``flwr`` CLI, run status, TLS and node authentication), and the ``corbin-fl``
command (``local``, ``simulate``, ``experiment``). Needs the ``tools`` extra
(``pip install -e ".[tools]"``).
"""

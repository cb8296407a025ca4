"""Container health check for the Flower processes of the CorBin-FL images.

Every long-running process of the deployment (``flower-superlink``, ``flower-supernode``,
``flower-superexec``) is started with ``--health-server-address 127.0.0.1:8081``: Flower then
serves the standard gRPC health protocol (``grpc.health.v1.Health/Check``, no TLS) on the
container's loopback interface. The compose files call this script as the ``healthcheck``::

    python /opt/corbin-fl/healthcheck.py [HOST:PORT] [--timeout SECONDS]

It exits 0 when the server answers ``SERVING`` within the timeout and 1 otherwise (connection
refused, deadline exceeded, any other status), which is the contract of a Docker ``HEALTHCHECK``.
It needs only ``grpcio`` and ``grpcio-health-checking``, both dependencies of ``flwr``, so it runs
unchanged in every image that has Flower installed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

logger = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:8081"
DEFAULT_TIMEOUT_S = 3.0


def check(address: str, timeout: float = DEFAULT_TIMEOUT_S, service: str = "") -> bool:
    """Ask a gRPC health server whether ``service`` is serving.

    Parameters
    ----------
    address : str
        ``host:port`` of the health server (plain text, no TLS), e.g. ``"127.0.0.1:8081"``.
    timeout : float
        Seconds to wait for the channel and the answer together; must be positive and finite.
    service : str
        Service name to ask about; ``""`` (the default) asks about the server as a whole, which is
        what Flower's health server reports on.

    Returns
    -------
    bool
        ``True`` iff the server answered ``HealthCheckResponse.SERVING`` in time.

    Raises
    ------
    TypeError
        If ``address`` or ``service`` is not a ``str`` or ``timeout`` is not a real number.
    ValueError
        If ``address`` is not of the form ``host:port`` with a port in ``[1, 65535]``, or
        ``timeout`` is not positive and finite.
    """
    if not isinstance(address, str):
        raise TypeError(f"address must be a str, got {type(address).__name__}")
    if not isinstance(service, str):
        raise TypeError(f"service must be a str, got {type(service).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a real number, got {type(timeout).__name__}")
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be positive and finite, got {timeout!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"address must be 'host:port' with a port in [1, 65535], got {address!r}")

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            logger.error("health check of %s failed: %s", address, err.code())
            return False
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        logger.error("health check of %s: status %s", address, status)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the health check from the command line.

    Parameters
    ----------
    argv : Sequence[str] or None
        Arguments without the program name; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 if serving, 1 if not, 2 for bad arguments (from ``argparse``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", nargs="?", default=DEFAULT_ADDRESS, help="health server")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="healthcheck: %(message)s")
    try:
        healthy = check(args.address, timeout=args.timeout)
    except ValueError as err:
        parser.error(str(err))
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())

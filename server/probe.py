"""A ``grpc.health.v1`` probe for container health checks.

Run it as::

    python -m remote_partitioner.server.probe [--address HOST:PORT] [--service NAME]
        [--timeout S] [--tls [--ca-file PEM] [--server-name NAME]
        [--client-cert PEM --client-key PEM]]

It asks the server at ``--address`` (default ``127.0.0.1:50051``) for the health of
``--service`` (default ``""``, the server as a whole) and exits 0 when the answer is SERVING,
1 for any other answer or when the server cannot be reached within ``--timeout`` seconds
(2 for a usage error). It prints one line saying why.

This module imports gRPC, the health-checking stubs and the plain-Python
:mod:`remote_partitioner.proto.transport` only, never torch or ExecuTorch, so
that it starts in a fraction of a second: a Docker ``HEALTHCHECK`` or a Kubernetes ``exec``
probe runs it every few seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from remote_partitioner.proto.transport import DEFAULT_ADDRESS, read_file_bytes

DEFAULT_TIMEOUT = 5.0

EXIT_SERVING = 0
EXIT_UNHEALTHY = 1


def tls_credentials(
    ca_file: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files.

    ``ca_file`` holds the CAs trusted to sign the server's certificate (None: the system's
    roots); ``client_cert`` and ``client_key`` are the probe's own certificate and key, for a
    server that requires client certificates (give both or neither).

    Raises:
        ValueError: only one of ``client_cert`` and ``client_key`` is given, or a file cannot
            be read.
    """
    if (client_cert is None) != (client_key is None):
        raise ValueError("--client-cert and --client-key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=read_file_bytes(ca_file, "CA file") if ca_file else None,
        private_key=read_file_bytes(client_key, "client key") if client_key else None,
        certificate_chain=(
            read_file_bytes(client_cert, "client certificate") if client_cert else None
        ),
    )


def check(
    address: str = DEFAULT_ADDRESS,
    service: str = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
) -> str:
    """Ask the server at ``address`` for the health of ``service``; return the status name
    (``"SERVING"``, ``"NOT_SERVING"``, ``"SERVICE_UNKNOWN"`` or ``"UNKNOWN"``).

    The call fails fast when nothing listens (it does not wait for the server to come up) and
    lasts at most ``timeout`` seconds. With ``credentials`` the channel uses TLS, and
    ``server_name`` overrides the name the server's certificate is checked against (the
    probe usually dials 127.0.0.1, which the certificate rarely names).

    Raises:
        grpc.RpcError: the call failed (server unreachable, deadline passed, TLS handshake
            failed, the server does not implement ``grpc.health.v1``...).
    """
    options: list[tuple[str, str]] = []
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    channel = (
        grpc.secure_channel(address, credentials, options=options)
        if credentials is not None
        else grpc.insecure_channel(address, options=options)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout, wait_for_ready=False
        )
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m remote_partitioner.server.probe",
        description="Exit 0 if the server's grpc.health.v1 reports SERVING, 1 otherwise.",
    )
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help=f"HOST:PORT of the server (default {DEFAULT_ADDRESS})")
    parser.add_argument("--service", default="",
                        help="service whose health to ask for (default '': the whole server)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds the check may take (default {DEFAULT_TIMEOUT:g})")
    tls = parser.add_argument_group("TLS")
    tls.add_argument("--tls", action="store_true", help="connect with TLS")
    tls.add_argument("--ca-file", help="PEM CAs that sign the server's certificate "
                     "(default: the system's roots); implies --tls")
    tls.add_argument("--server-name", help="name to check the server's certificate against "
                     "(default: the host of --address); implies --tls")
    tls.add_argument("--client-cert", help="PEM client certificate, for mutual TLS "
                     "(with --client-key); implies --tls")
    tls.add_argument("--client-key", help="PEM private key of --client-cert")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe with command-line arguments ``argv``; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    use_tls = bool(args.tls or args.ca_file or args.server_name or args.client_cert
                   or args.client_key)
    try:
        credentials = (
            tls_credentials(args.ca_file, args.client_cert, args.client_key) if use_tls else None
        )
    except ValueError as e:
        parser.error(str(e))
    try:
        status = check(args.address, args.service, timeout=args.timeout,
                       credentials=credentials, server_name=args.server_name)
    except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        name = code.name if code is not None else "ERROR"
        if code == grpc.StatusCode.NOT_FOUND:
            details = f"the server does not know service {args.service!r}"
        print(f"unhealthy: {args.address}: {name}: {details}", file=sys.stderr)
        return EXIT_UNHEALTHY
    if status != "SERVING":
        print(f"unhealthy: {args.address} service {args.service!r}: {status}", file=sys.stderr)
        return EXIT_UNHEALTHY
    print(f"healthy: {args.address} service {args.service!r}: {status}")
    return EXIT_SERVING


if __name__ == "__main__":
    sys.exit(main())

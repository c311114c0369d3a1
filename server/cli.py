"""The ``serve`` command of the ``remote-partitioner`` command line.

The console script (:mod:`remote_partitioner.cli`) joins this command with the client's
(:mod:`remote_partitioner.client.cli`); this module knows nothing of the client. It provides:

* :func:`add_serve_command`: the ``serve`` subcommand and its flags, added to a parser;
* :func:`run_serve`: run a parsed ``serve`` (one process, or ``--workers N`` of them);
* :func:`build_parser` and :func:`main`: a command line with ``serve`` only. ``python -m
  remote_partitioner.server.cli serve ...`` is how ``serve --workers N`` starts each worker
  process (:mod:`remote_partitioner.server.workers`), so that a worker loads no client code.

Importing this module loads gRPC but neither torch nor ExecuTorch: they are imported when a
server is built.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from remote_partitioner.server.settings import DEFAULT_ADDRESS, Limits

logger = logging.getLogger("remote_partitioner.server")

#: ``serve``'s exit codes: stopped by SIGTERM/SIGINT (after its calls finished), a usage error
#: or an unsafe security setup (argparse), the address cannot be bound (in use by another
#: server, or not this machine's).
EXIT_OK, EXIT_USAGE, EXIT_CANNOT_LISTEN = 0, 2, 4


def _security(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[grpc.ServerCredentials | None, list[grpc.aio.ServerInterceptor]]:
    """TLS credentials and the token interceptor the flags ask for; refuse what is unsafe."""
    from remote_partitioner.server.auth import (
        BearerTokenInterceptor,
        is_loopback,
        load_tokens,
        read_server_credentials,
    )

    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.client_ca and not args.tls_cert:
        parser.error("--client-ca needs --tls-cert and --tls-key")
    loopback = is_loopback(args.address)
    if not loopback and not args.tls_cert and not args.token_file and not args.insecure:
        parser.error(
            f"refusing to listen on {args.address}, which is not a loopback address, with "
            "neither TLS (--tls-cert/--tls-key) nor a token (--token-file); pass --insecure to "
            "do it anyway"
        )
    try:
        credentials = (
            read_server_credentials(args.tls_cert, args.tls_key, args.client_ca)
            if args.tls_cert
            else None
        )
        interceptors: list[grpc.aio.ServerInterceptor] = (
            [BearerTokenInterceptor(load_tokens(args.token_file))] if args.token_file else []
        )
    except ValueError as e:
        parser.error(str(e))
    if not loopback and not args.token_file and not args.client_ca:
        logger.warning("anyone who can reach %s can use this server", args.address)
    if not loopback and not args.tls_cert:
        logger.warning("serving plaintext on %s", args.address)
    return credentials, interceptors


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from remote_partitioner.server.observability import configure_logging

    # First: torch and the backends log (and warn) while they are imported.
    configure_logging(args.log_level)
    from remote_partitioner.server.app import BindError, create_server
    from remote_partitioner.server.backend_registry import default_backend_registry
    from remote_partitioner.server.blobstore import open_blob_store
    from remote_partitioner.server.observability import Metrics, ObservabilityInterceptor
    from remote_partitioner.server.quantizers import default_quantizers
    from remote_partitioner.server.registry import default_registry
    from remote_partitioner.server.results import ResultCache, results_directory
    from remote_partitioner.server.versions import versions_key

    credentials, interceptors = _security(args, parser)
    store = open_blob_store(args.cache_bytes, args.blob_dir)
    metrics = Metrics(store) if args.metrics_port is not None else None
    limits = Limits(
        max_blob_bytes=args.max_blob_bytes,
        max_program_bytes=args.max_program_bytes,
        max_nodes=args.max_nodes,
        max_concurrent_hooks=args.max_concurrent,
        max_inflight_bytes=args.max_inflight_bytes,
        stream_idle_seconds=args.stream_idle_seconds,
    )
    if not args.no_pattern_memo:
        from remote_partitioner.server.pattern_memo import install_all

        # This process is the server's own: patching ExecuTorch's modules here is safe.
        memoized = install_all()
        if memoized:
            logger.info("pattern graphs built once per process: %s", ", ".join(memoized))
    families = _families(args.backends)
    if isinstance(families, int):
        return families
    environment = _environment(args, parser)
    registry = default_registry(plugins=not args.no_plugins, only=families)
    # Observability outermost, so that it also counts calls the token check refuses.
    interceptors = [
        ObservabilityInterceptor(metrics, known_partitioners=registry.names()), *interceptors
    ]
    try:
        server, port = create_server(
            args.address, registry=registry,
            backends=default_backend_registry(plugins=not args.no_plugins, only=families),
            quantizers=default_quantizers(plugins=not args.no_plugins, only=families),
            blob_store=store,
            limits=limits,
            result_cache=ResultCache(
                args.result_cache_bytes, versions=versions_key(),
                directory=results_directory(args.blob_dir) if args.blob_dir else None,
            ),
            io_threads=args.threads, interceptors=interceptors, credentials=credentials,
            share_port=args.share_port, environment=environment,
        )
    except BindError as e:
        return _cannot_listen(args.address, str(e))
    if metrics is not None:
        assert server.servicer is not None
        metrics.bind_server(server.servicer.streams)
        metrics.bind_result_cache(server.servicer.instance.results)
        metrics_port = metrics.serve(args.metrics_port, args.metrics_address)
        logger.warning("metrics on http://%s:%d/metrics", args.metrics_address, metrics_port)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    server.start()
    host = args.address.rsplit(":", 1)[0]
    print(
        f"remote-partitioner serving {', '.join(registry.names()) or 'no partitioners'} "
        f"on {host}:{port}",
        flush=True,
    )
    stop.wait()
    # Probes see NOT_SERVING at once; calls in flight get --grace seconds to finish.
    server.enter_graceful_shutdown()
    logger.warning("shutting down: in-flight calls have %.0f s to finish", args.grace)
    server.stop(args.grace).wait()
    if metrics is not None:
        metrics.stop()
    return 0


#: The families hosted by servers in environments of their own (``make venv-FAMILY``).
ENVIRONMENT_FAMILIES = ("arm", "openvino")


def _families(value: str | None) -> list[str] | int | None:
    """``--backends``' families (None: every family that imports), each checked to be hosted
    here; or the exit status 2 after saying which one cannot be (and why)."""
    from remote_partitioner.server.registry import check_family

    if value is None:
        return None
    families = [f.strip() for f in value.split(",") if f.strip()]
    for family in families:
        try:
            check_family(family)
        except Exception as e:
            print(
                f"remote-partitioner serve: --backends {family}: cannot be hosted here: "
                f"{type(e).__name__}: {e}"
                + (f" (`make venv-{family}` builds its environment)"
                   if family in ENVIRONMENT_FAMILIES and isinstance(e, ImportError) else ""),
                file=sys.stderr, flush=True,
            )
            return 2
    return families


def _environment(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The server's ``Environment`` (``--environment``, ``--peer``); usage errors exit 2."""
    from remote_partitioner.server.environments import Environment, parse_peer

    try:
        peers = dict(parse_peer(p) for p in args.peer)
        if len(peers) != len(args.peer):
            raise ValueError("an environment is named by two --peer flags")
        return Environment(args.environment, peers)
    except ValueError as e:
        parser.error(str(e))


def _cannot_listen(address: str, cause: str = "") -> int:
    """Say that ``address`` cannot be bound (and why, when gRPC said: ``cause``); return
    :data:`EXIT_CANNOT_LISTEN`."""
    print(
        f"remote-partitioner serve: cannot listen on {address}: the address is in use (is "
        "another server running there? stop it, or choose another --address; port 0 picks a "
        "free one) or is not an address of this machine"
        + (f"\n  ({cause})" if cause else ""),
        file=sys.stderr, flush=True,
    )
    return EXIT_CANNOT_LISTEN


#: ``serve --log-level`` choices (given in any case).
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def add_serve_command(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand and its flags to an argparse subparsers object (from
    ``add_subparsers(dest="command")``); return its parser (:func:`run_serve` reports usage
    errors through it). Imports nothing heavy."""
    serve: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the server",
        epilog="exit codes: 0 stopped by SIGTERM/SIGINT once its calls finished; 2 usage "
        "error or unsafe security setup; 4 the address cannot be bound (another server holds "
        "the port, or the host is not this machine's)",
    )
    serve.add_argument("--address", default=DEFAULT_ADDRESS,
                       help=f"HOST:PORT to listen on (default {DEFAULT_ADDRESS}; port 0 = any)")
    serve.add_argument("--threads", type=_positive, default=4,
                       help="threads that hash, store and read blobs; RPC I/O itself runs on "
                       "one event loop, hooks on --max-concurrent threads (default 4)")
    serve.add_argument("--workers", type=_positive, default=1,
                       help="server processes sharing the port (SO_REUSEPORT), one core each; "
                       "with more than 1 they share the blob store in --blob-dir, or in a "
                       "temporary directory (default 1)")
    serve.add_argument("--blob-dir", default=None,
                       help="keep blobs as files in this directory, shared safely by several "
                       "processes and replicas (a ReadWriteMany volume); default: in memory")
    serve.add_argument("--cache-bytes", type=int, default=8 << 30,
                       help="blob store bound in bytes, least recently used evicted "
                       "(default 8 GiB)")
    serve.add_argument("--result-cache-bytes", type=int, default=256 << 20,
                       help="bound of the cache of results (hook, Preprocess and Lower answers) "
                       "by request content, least recently used evicted, in memory and, with "
                       "--blob-dir, on disk there, shared by every process using the directory "
                       "(default 256 MiB each; 0 = off)")
    serve.add_argument("--grace", type=float, default=30.0,
                       help="seconds in-flight calls get to finish on SIGTERM/SIGINT "
                       "(default 30)")
    # The port is this process's alone unless its supervisor (--workers) shares it among its
    # workers: each worker runs with this flag (SO_REUSEPORT); a second `serve` is refused.
    serve.add_argument("--share-port", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--backends", metavar="FAMILY,...",
                       help="host only these built-in backend families (xnnpack, coreml, "
                       "vulkan, arm), each of which must import here, or the server does not "
                       "start; default: every family whose toolchain is installed (others are "
                       "left out, logged at INFO)")
    serve.add_argument("--no-plugins", action="store_true",
                       help="host only the built-in partitioners, backends and quantizers, "
                       "not entry-point plugins")
    serve.add_argument("--no-pattern-memo", action="store_true",
                       help="build the backends' and quantizers' pattern graphs on every "
                       "call, as ExecuTorch does, instead of once per process (same graphs and "
                       "random numbers either way; the memo makes a Vulkan call or a Core ML or "
                       "XNNPACK Quantize several times faster)")
    envs = serve.add_argument_group(
        "environments", "backends whose toolchains conflict run in servers of their own behind "
        "one front door that routes by the x-remote-partitioner-environment header "
        "(docs/environments.md)")
    envs.add_argument("--environment", default="", metavar="NAME",
                      help="this server's environment (e.g. arm); calls whose header names "
                      "another are refused (default: the default environment, which calls "
                      "without the header reach)")
    envs.add_argument("--peer", action="append", default=[], metavar="NAME=TARGET",
                      help="another environment's server (plaintext gRPC target), whose "
                      "partitioners, backends and quantizers this server's ListPartitioners "
                      "lists too, under NAME; repeatable")
    security = serve.add_argument_group("security")
    security.add_argument("--token-file",
                          help="require 'authorization: Bearer <token>' with a token from this "
                          "file (one per line, # comments); health and reflection stay open")
    security.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    security.add_argument("--tls-key", help="PEM private key of --tls-cert")
    security.add_argument("--client-ca",
                          help="PEM CA: require client certificates signed by it (mutual TLS)")
    security.add_argument("--insecure", action="store_true",
                          help="allow a non-loopback address with neither TLS nor a token")
    limits = serve.add_argument_group("limits")
    defaults = Limits()
    limits.add_argument("--max-blob-bytes", type=int, default=defaults.max_blob_bytes,
                        help=f"largest blob accepted (default {defaults.max_blob_bytes})")
    limits.add_argument("--max-program-bytes", type=int, default=defaults.max_program_bytes,
                        help="largest program, all its blobs "
                        f"(default {defaults.max_program_bytes})")
    limits.add_argument("--max-nodes", type=int, default=defaults.max_nodes,
                        help=f"most nodes in one program (default {defaults.max_nodes})")
    limits.add_argument("--max-concurrent", type=_positive,
                        default=defaults.max_concurrent_hooks,
                        help="hook calls admitted at once; beyond, RESOURCE_EXHAUSTED with "
                        f"RetryInfo (default {defaults.max_concurrent_hooks})")
    limits.add_argument("--max-inflight-bytes", type=_positive,
                        default=defaults.max_inflight_bytes,
                        help="upload bytes in flight at once (declared blob sizes); a new blob "
                        "beyond, unless alone, gets RESOURCE_EXHAUSTED with RetryInfo "
                        f"(default {defaults.max_inflight_bytes})")
    limits.add_argument("--stream-idle-seconds", type=float,
                        default=defaults.stream_idle_seconds,
                        help="cancel a stream with no message either way for this long, "
                        "with DEADLINE_EXCEEDED "
                        f"(default {defaults.stream_idle_seconds:g})")
    ops = serve.add_argument_group("observability")
    ops.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics on this port (0 = any; default: off)")
    ops.add_argument("--metrics-address", default="127.0.0.1",
                     help="address of the metrics endpoint (default 127.0.0.1)")
    ops.add_argument("--log-level", default="WARNING", type=str.upper, choices=_LOG_LEVELS,
                     help="what the server writes to stderr, any case: WARNING warnings and "
                     "errors only; INFO also one line per call and the backends' progress; "
                     "DEBUG everything (default WARNING)")
    return serve


def run_serve(args: argparse.Namespace, argv: Sequence[str],
              serve: argparse.ArgumentParser, *, own_process: bool = False) -> int:
    """Run the parsed ``serve`` command ``args``; return the process exit status once a
    signal stopped the server.

    ``argv`` is the whole command line ``args`` was parsed from (``serve`` and its flags):
    with ``--workers`` above 1 each worker process runs it again, through :func:`main`.
    ``serve`` is the subcommand's parser; an unsafe or inconsistent security setup exits
    through its ``error`` (status 2) before anything starts.

    ``own_process``: this process runs this command line and nothing else (the console
    script's, not a caller's ``main([...])``), so it may restart itself with a fixed string
    hash seed when ``PYTHONHASHSEED`` is not set (:mod:`remote_partitioner.server.hash_seed`:
    Arm's partitioner orders its partitions by it). Its workers inherit the seed.
    """
    if own_process:
        from remote_partitioner.server.hash_seed import restart_with_fixed_seed

        restart_with_fixed_seed()
    if args.workers > 1:
        from remote_partitioner.server import workers

        _security(args, serve)  # refuse what one worker would refuse, before starting any
        _environment(args, serve)
        if not workers.port_is_free(args.address):
            return _cannot_listen(args.address)
        return workers.supervise(list(argv), args.address, args.workers, args.blob_dir,
                                 args.grace, args.metrics_port)
    return _serve(args, serve)


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """A ``remote-partitioner`` parser with the ``serve`` command only, and that command's
    parser (importing nothing heavy). ``parse_args(["serve", *flags])`` parses ``serve``'s
    flags exactly as the full command line does."""
    parser = argparse.ArgumentParser(
        prog="remote-partitioner", description="Host ExecuTorch partitioners over gRPC."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    return parser, add_serve_command(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``serve`` with the command-line arguments ``argv`` (default ``sys.argv[1:]``,
    ``serve`` first); return the exit status. The console script is
    :func:`remote_partitioner.cli.main`; this serve-only entry is what worker processes run."""
    parser, serve = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    return run_serve(args, raw, serve, own_process=argv is None)


if __name__ == "__main__":
    sys.exit(main())

"""The ``remote-partitioner`` command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from remote_partitioner.server.app import DEFAULT_ADDRESS, create_server
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.registry import default_registry


def _serve(args: argparse.Namespace) -> int:
    registry = default_registry(plugins=not args.no_plugins)
    server, port = create_server(
        args.address, registry=registry, blob_store=BlobStore(args.cache_bytes),
        max_workers=args.threads,
    )
    server.start()
    host = args.address.rsplit(":", 1)[0]
    print(
        f"remote-partitioner serving {', '.join(registry.names()) or 'no partitioners'} "
        f"on {host}:{port}",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(args.grace).wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="remote-partitioner", description="Host ExecuTorch partitioners over gRPC."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--address", default=DEFAULT_ADDRESS,
                       help=f"HOST:PORT to listen on (default {DEFAULT_ADDRESS}; port 0 = any)")
    serve.add_argument("--threads", type=int, default=8, help="RPC threads (default 8)")
    serve.add_argument("--cache-bytes", type=int, default=8 << 30,
                       help="blob store bound in bytes, least recently used evicted "
                       "(default 8 GiB)")
    serve.add_argument("--grace", type=float, default=10.0,
                       help="seconds in-flight calls get to finish on SIGTERM/SIGINT")
    serve.add_argument("--no-plugins", action="store_true",
                       help="host only the built-in partitioners, not entry-point plugins")
    serve.add_argument("--log-level", default="WARNING", help="Python logging level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        return _serve(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

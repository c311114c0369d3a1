"""The ``remote-partitioner`` command line (the console script): ``serve``, and the client
commands ``list``, ``partition`` and ``lower``.

This package is the one place that joins the two halves: the ``serve`` command comes from
:mod:`remote_partitioner.server.cli`, the client commands from
:mod:`remote_partitioner.client.cli`, and neither of those imports the other (``make lint``
checks it, see ``scripts/check_layers.py``). Run it as ``remote-partitioner ...`` or
``python -m remote_partitioner.cli ...``.

Importing it loads gRPC and the generated messages but neither torch nor ExecuTorch: the server
imports them when it is built, the client commands never.

Exit codes: those of the command run (``serve``: 0 after a signal stopped it; client
commands: see :mod:`remote_partitioner.client.cli`); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from remote_partitioner.client import cli as client_cli
from remote_partitioner.server import cli as server_cli

__all__ = ["build_parser", "main"]


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The whole command line's parser and its ``serve`` subparser (importing nothing
    heavy): ``serve`` as :func:`remote_partitioner.server.cli.add_serve_command` declares it,
    then the client commands as :func:`remote_partitioner.client.cli.add_commands` does."""
    parser = argparse.ArgumentParser(
        prog="remote-partitioner",
        description="Host ExecuTorch partitioners over gRPC (serve), and use them "
        "(list, partition, lower).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = server_cli.add_serve_command(sub)
    client_cli.add_commands(sub)
    return parser, serve


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command it names; return the
    process exit status (argparse exits with 2 on a usage error)."""
    parser, serve = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    if args.command == "serve":
        return server_cli.run_serve(args, raw, serve)
    if args.command in client_cli.COMMANDS:
        return client_cli.run(args)
    parser.error(f"unknown command {args.command}")  # exits; argparse rejects it first
    return 2

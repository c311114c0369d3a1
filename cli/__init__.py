"""The ``remote-partitioner`` command line (the console script): ``serve``, and the client
commands ``list``, ``partition`` and ``lower``.

This package is the one place that joins the two halves: the ``serve`` command comes from
:mod:`remote_partitioner.server.cli`, the client commands from
:mod:`remote_partitioner.client.cli`, and neither of those imports the other (``make lint``
checks it, see ``scripts/check_layers.py``). Run it as ``remote-partitioner ...`` or
``python -m remote_partitioner.cli ...``.

Importing it loads gRPC and the generated messages but neither torch nor ExecuTorch: the server
imports them when it is built, the client commands never.

Exit codes: those of the command run (``serve``: 0 after a signal stopped it, 4 when its
address cannot be bound, e.g. another server holds the port; client
commands: see :mod:`remote_partitioner.client.cli`); 2 for a usage error. ``--version``
prints the versions of this package, torch and ExecuTorch installed here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from remote_partitioner.client import cli as client_cli
from remote_partitioner.server import cli as server_cli

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors in a client command run with ``--json`` are
    printed as that command line's JSON error object (on stderr, exit 2)."""

    #: Set by :func:`main`: the client command the command line runs with ``--json``, if
    #: any (the top-level parser reports some of its errors, e.g. unknown options).
    json_errors_of: str | None = None

    def error(self, message: str) -> NoReturn:
        if self.json_errors_of is not None:
            client_cli.usage_error(self.json_errors_of, message, as_json=True)
        super().error(message)


class _Version(argparse.Action):
    """``--version``: the versions installed here, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print this package's, torch's and ExecuTorch's versions, exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(client_cli.versions())
        parser.exit()


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The whole command line's parser and its ``serve`` subparser (importing nothing
    heavy): ``serve`` as :func:`remote_partitioner.server.cli.add_serve_command` declares it,
    then the client commands as :func:`remote_partitioner.client.cli.add_commands` does."""
    parser = _Parser(
        prog="remote-partitioner",
        description="Host ExecuTorch partitioners over gRPC (serve), and use them "
        "(list, partition, lower; report turns a saved report into its page). "
        "The command line's reference: docs/cli.md.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = server_cli.add_serve_command(sub)
    client_cli.add_commands(sub)
    return parser, serve


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command it names; return the
    process exit status (argparse exits with 2 on a usage error)."""
    parser, serve = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    json_command = raw[0] if raw and raw[0] in client_cli.COMMANDS and "--json" in raw else None
    _Parser.json_errors_of = json_command
    args = parser.parse_args(raw)
    if args.command == "serve":
        return server_cli.run_serve(args, raw, serve, own_process=argv is None)
    if args.command in client_cli.COMMANDS:
        return client_cli.run(args)
    parser.error(f"unknown command {args.command}")  # exits; argparse rejects it first
    return 2

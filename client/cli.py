"""Client commands of the ``remote-partitioner`` command line: ``list``, ``partition``, ``lower``,
and ``report`` (a delegation report's JSON -> its HTML page, offline).

Exit codes: 0 success, 1 the server answered with an error, 2 usage error (bad arguments,
unreadable files), 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from remote_partitioner.client import report
from remote_partitioner.client.credentials import read_channel_credentials, read_token
from remote_partitioner.client.errors import RemotePartitionerError
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.client.report_page import write_report
from remote_partitioner.proto.transport import DEFAULT_ADDRESS
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

EXIT_OK, EXIT_SERVER, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
COMMANDS = ("list", "partition", "lower", "report")
#: The server the commands talk to unless ``--target`` says otherwise: where ``serve``
#: listens by default.
DEFAULT_TARGET = DEFAULT_ADDRESS


class UsageError(Exception):
    """Bad arguments or unreadable input files (exit code 2)."""


def parse_spec(items: Sequence[str]) -> dict[str, bool | int | float | str]:
    """``KEY=VALUE`` items -> a spec: ``true``/``false`` are bools, integers ints, decimal
    numbers floats, anything else a string (quote nothing: the shell already did)."""
    spec: dict[str, bool | int | float | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--spec {item!r}: expected KEY=VALUE")
        value: bool | int | float | str
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        spec[key] = value
    return spec


def add_commands(sub: Any) -> None:
    """Add the client commands to an argparse subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=DEFAULT_TARGET,
                        help=f"the server, any gRPC target (default {DEFAULT_TARGET})")
    common.add_argument("--token-file", help="file holding the bearer token to send")
    common.add_argument("--tls-ca", help="PEM root certificates: connect with TLS")
    common.add_argument("--tls-cert", help="PEM client certificate chain (mutual TLS)")
    common.add_argument("--tls-key", help="PEM client private key (mutual TLS)")
    common.add_argument("--timeout", type=float, default=None, help="deadline per call (s)")
    common.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("list", parents=[common], help="list the hosted partitioners")
    for name, helptext in (
        ("partition", "report what a partitioner would delegate in a .pt2 archive"),
        ("lower", "lower a .pt2 archive into a .pte on the server"),
    ):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("model", help="a PT2 archive written by torch.export.save")
        p.add_argument("--partitioner", action="append", required=True,
                       help="hosted partitioner name; repeat for several, in order")
        p.add_argument("--spec", action="append", default=[], metavar="KEY=VALUE",
                       help="spec of the (last given) partitioner; repeatable")
        p.add_argument("--skip-ir-validity-check", action="store_true")
        if name == "lower":
            p.add_argument("-o", "--output", required=True, help="where to write the .pte")
        p.add_argument("--report", metavar="REPORT.html",
                       help="also write the delegation report as one self-contained HTML page")
    p = sub.add_parser("report", help="turn a delegation report's JSON (partition/lower --json) "
                       "into its HTML page, offline")
    p.add_argument("report_json", metavar="REPORT.json",
                   help="the JSON that `partition --json` or `lower --json` printed")
    p.add_argument("-o", "--output", required=True, metavar="REPORT.html",
                   help="where to write the page")
    p.add_argument("--title", help="the page's title (default: the JSON file's name)")


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
        yield bar.update


def _client(args: argparse.Namespace) -> LowerClient:
    try:
        credentials = (
            read_channel_credentials(args.tls_ca, args.tls_key, args.tls_cert)
            if args.tls_ca or args.tls_cert or args.tls_key
            else None
        )
        token = read_token(args.token_file) if args.token_file else None
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from e
    return LowerClient(args.target, credentials=credentials, token=token, timeout=args.timeout)


#: How many node names the text report shows per operator and reason.
_NAMES_SHOWN = 3


def _print_report(delegation: pb.DelegationReport) -> None:
    for m in delegation.methods:
        delegated = sum(d.nodes for d in m.delegated)
        print(f"method {m.method}: {m.total_nodes} nodes, {delegated} delegated")
        for d in m.delegated:
            print(f"  {d.backend_id}: {d.nodes} nodes in {d.partitions} partitions")
        if m.cpu_ops:
            print("  left on the CPU:")
            for op in m.cpu_ops:
                print(f"    {op.count:5d}  {op.op}")
        groups = report.cpu_nodes_by_op(m)
        if groups:
            print("  why:")
        for op_name, nodes in groups:
            by_reason: dict[str, list[str]] = {}
            for name, reason in nodes:
                by_reason.setdefault(reason, []).append(name)
            for reason, names in by_reason.items():
                shown = ", ".join(names[:_NAMES_SHOWN])
                more = f" +{len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
                print(f"    {op_name}: {reason} ({shown}{more})")


def _report_page(args: argparse.Namespace) -> int:
    """``report``: the HTML page of a report saved as JSON; no server involved."""
    try:
        saved = json.loads(Path(args.report_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {args.report_json}: {e}") from e
    if not isinstance(saved, dict) or not isinstance(saved.get("methods"), list):
        raise UsageError(f"{args.report_json} holds no delegation report (no 'methods' list)")
    title = args.title or f"Delegation report: {Path(args.report_json).name}"
    write_report(args.output, saved, title=title)
    print(f"wrote {args.output}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.command == "report":
        return _report_page(args)
    with _client(args) as client:
        if args.command == "list":
            response = client.list_partitioners()
            if args.json:
                print(json_format.MessageToJson(response, preserving_proto_field_name=True))
                return EXIT_OK
            v = response.versions
            print(f"server: torch {v.torch}, executorch {v.executorch}, api {v.api}")
            for p in response.partitioners:
                print(f"{p.name} ({p.backend_id})")
                for k in p.spec_keys:
                    type_name = pb.SpecType.Name(k.type).removeprefix("SPEC_TYPE_").lower()
                    print(f"  {k.name}: {type_name}  {k.doc}")
            return EXIT_OK
        try:
            archive = Path(args.model).read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read {args.model}: {e}") from e
        refs = [partitioner_ref(name) for name in args.partitioner]
        refs[-1].CopyFrom(partitioner_ref(args.partitioner[-1], parse_spec(args.spec)))
        with _progress(len(archive), "upload") as progress:
            result = client.lower(
                archive, refs, report_only=args.command == "partition",
                skip_ir_validity_check=args.skip_ir_validity_check, upload_progress=progress,
            )
        if args.command == "lower":
            assert result.pte is not None
            Path(args.output).write_bytes(result.pte)
        # The report as JSON: what --json prints and what the --report page shows.
        as_dict = report.with_cpu_nodes(
            result.report,
            json_format.MessageToDict(result.report, preserving_proto_field_name=True),
        )
        if args.report:
            title = f"Delegation report: {Path(args.model).name} ({', '.join(args.partitioner)})"
            write_report(args.report, as_dict, title=title)
        if args.json:
            out = dict(as_dict)
            if args.command == "lower":
                out["output"] = {"path": args.output, "bytes": len(result.pte or b"")}
            print(json.dumps(out, indent=2))
        else:
            _print_report(result.report)
            if args.command == "lower":
                print(f"wrote {args.output} ({len(result.pte or b'')} bytes)")
            if args.report:
                print(f"wrote {args.report} (open it in a browser)")
        return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Run one client command; return the process exit code."""
    try:
        return _run(args)
    except UsageError as e:
        print(f"remote-partitioner {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RemotePartitionerError as e:
        unreachable = e.code == grpc.StatusCode.UNAVAILABLE
        where = f"cannot reach {args.target}" if unreachable else "the server refused"
        reason = f" [{e.reason}]" if e.reason else ""
        print(f"remote-partitioner {args.command}: {where}: {e}{reason}", file=sys.stderr)
        return EXIT_UNREACHABLE if unreachable else EXIT_SERVER
    except Exception as e:  # an exception the hosted partitioner raised, rebuilt here
        print(f"remote-partitioner {args.command}: lowering failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return EXIT_SERVER

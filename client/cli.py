"""Client commands of the ``remote-partitioner`` command line: ``list``, ``partition``, ``lower``,
and ``report`` (a delegation report's JSON -> its HTML page, offline).

The Node.js client (``client/node``) implements the same command line, ``report`` and
``--report`` included (the same page bytes); ``docs/cli.md`` is its reference: options,
defaults, spec syntax, exit codes and the ``--json`` schema.

Exit codes: 0 success; 1 the server answered with an error, the partitioner raised, or no
answer came within ``--timeout``; 2 usage error (bad arguments, unreadable or invalid input
files, unwritable output paths: all found before anything is uploaded); 3 the server could not
be reached. A closed standard output (``list | head -2``) ends quietly with 1.

With ``--json`` the result is printed on stdout (numbers as JSON numbers) and an error, if any,
as one JSON object on stderr: ``{"error": {"exit_code", "kind", "code", "reason", "message",
"detail"}}``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import math
import mmap
import os
import re
import stat
import sys
import uuid
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, NoReturn

import grpc
from google.protobuf import descriptor, json_format
from google.protobuf.message import Message

from remote_partitioner.client import report
from remote_partitioner.client.credentials import read_channel_credentials, read_token
from remote_partitioner.client.digest_cache import DigestCache
from remote_partitioner.client.errors import RemotePartitionerError, RemoteTraceback
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.client.report_page import write_report
from remote_partitioner.proto import errors
from remote_partitioner.proto.spec import SpecScalar
from remote_partitioner.proto.transport import DEFAULT_ADDRESS
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

EXIT_OK, EXIT_SERVER, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
#: A target that is a plain ``HOST:PORT`` (``[V6]:PORT`` too), what ``serve --address`` takes.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s/:,\[\]]+):\d+")
COMMANDS = ("list", "partition", "lower", "report")
#: The server the commands talk to unless ``--target`` says otherwise: where ``serve``
#: listens by default.
DEFAULT_TARGET = DEFAULT_ADDRESS
#: What ``--request-id`` accepts (the server's rule for ``x-request-id``).
REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class UsageError(Exception):
    """Bad arguments, unreadable or invalid input files, unwritable outputs (exit code 2)."""


class CommandFailed(Exception):
    """A failure the command describes itself: ``kind`` and ``exit_code`` as in the ``--json``
    error object, ``code`` / ``reason`` the gRPC code name and ErrorInfo reason if any,
    ``detail`` what gRPC said (shown on a second line)."""

    def __init__(self, message: str, *, kind: str, exit_code: int, code: str | None = None,
                 reason: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.exit_code, self.code = kind, exit_code, code
        self.reason, self.detail = reason, detail


# ------------------------------------------------------------------------------ spec syntax

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][+-]?\d+)?")
_SPECIAL_FLOAT = re.compile(r"([+-]?)(inf|infinity|nan)", re.IGNORECASE)
_INT64 = (-(2**63), 2**63 - 1)


def parse_spec_value(raw: str) -> SpecScalar:
    """One ``--spec`` VALUE: ``str:TEXT`` is the string TEXT; ``true``/``false`` (any case)
    a bool; an integer (optional sign, digits) an int (int64 range); a number with a point or
    an exponent, or ``inf``/``infinity``/``nan``, a float; anything else the string itself.

    Raises:
        UsageError: an integer outside int64.
    """
    if raw.startswith("str:"):
        return raw[4:]
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if _INT.fullmatch(raw):
        value = int(raw)
        if not _INT64[0] <= value <= _INT64[1]:
            raise UsageError(f"--spec value {raw} is outside the int64 range")
        return value
    if _FLOAT.fullmatch(raw):
        return float(raw)
    special = _SPECIAL_FLOAT.fullmatch(raw)
    if special:
        x = math.nan if special.group(2).lower() == "nan" else math.inf
        return -x if special.group(1) == "-" else x
    return raw


def parse_spec(items: Sequence[str]) -> dict[str, SpecScalar]:
    """``KEY=VALUE`` items (of one partitioner) -> its spec, in order (values as
    :func:`parse_spec_value` reads them; the shell already did any quoting).

    Raises:
        UsageError: an item without ``=`` or key, a key given twice, an int out of range.
    """
    spec: dict[str, SpecScalar] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--spec wants KEY=VALUE, got {json.dumps(item, ensure_ascii=False)}")
        if key in spec:
            raise UsageError(f"--spec key {json.dumps(key, ensure_ascii=False)} given twice for "
                             "one --partitioner")
        spec[key] = parse_spec_value(raw)
    return spec


def partitioner_plan(plan: Sequence[tuple[str, str]]) -> list[tuple[str, dict[str, SpecScalar]]]:
    """The ``--partitioner`` / ``--spec`` options in command-line order -> ``[(name, spec)]``:
    each ``--spec`` belongs to the ``--partitioner`` before it.

    Raises:
        UsageError: no ``--partitioner``, a ``--spec`` before the first one, bad spec items.
    """
    grouped: list[tuple[str, list[str]]] = []
    for option, value in plan:
        if option == "partitioner":
            if not value:
                raise UsageError("--partitioner wants a name")
            grouped.append((value, []))
        elif not grouped:
            raise UsageError(f"--spec {value} comes before any --partitioner: put each --spec "
                             "after the --partitioner it belongs to")
        else:
            grouped[-1][1].append(value)
    if not grouped:
        raise UsageError("--partitioner NAME is required")
    return [(name, parse_spec(items)) for name, items in grouped]


# ---------------------------------------------------------------------------- command line

class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in every option's help (argparse's formatter) except where there is none to
    show (unset, off, empty: the help says what that means), wider columns."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []):
            return action.help
        return super()._get_help_string(action)


def _ordered(kind: str) -> Callable[[str], tuple[str, str]]:
    """An argparse ``type`` tagging a value with its option, so that ``--partitioner`` and
    ``--spec`` appended to one list keep their order."""
    def tag(value: str) -> tuple[str, str]:
        return (kind, value)
    tag.__name__ = kind  # argparse names the type in its messages
    return tag


def _seconds(text: str) -> str:
    try:
        ok = float(text) > 0 and math.isfinite(float(text))
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"wants a positive number of seconds, got {text!r}")
    return text


def add_commands(sub: Any) -> None:
    """Add the client commands to an argparse subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=DEFAULT_TARGET,
                        help="the server: any gRPC target (host:port, dns:///name:port, ...)")
    common.add_argument("--token-file", metavar="FILE",
                        help="send 'authorization: Bearer <token>', the file's first line that "
                        "is neither blank nor a # comment")
    common.add_argument("--tls", action="store_true",
                        help="connect with TLS, trusting the system's root certificates")
    common.add_argument("--tls-ca", metavar="PEM",
                        help="connect with TLS, trusting these root certificates")
    common.add_argument("--tls-cert", metavar="PEM",
                        help="client certificate chain (mutual TLS; with --tls-key)")
    common.add_argument("--tls-key", metavar="PEM", help="client private key (mutual TLS)")
    common.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                        help="deadline of each call, in seconds (none: wait as long as it takes)")
    common.add_argument("--request-id", metavar="ID",
                        help="x-request-id sent with every call, 1 to 64 of [A-Za-z0-9._-] "
                        "(none: a fresh one)")
    common.add_argument("--json", action="store_true",
                        help="print the result as JSON on stdout, an error as JSON on stderr")
    sub.add_parser("list", parents=[common], formatter_class=_Help,
                   help="list the hosted partitioners and quantizers and the server's versions",
                   description="List the partitioners and quantizers the server hosts, their "
                   "spec keys, and the server's torch / ExecuTorch versions.")
    for name, helptext in (
        ("partition", "report what the partitioners would delegate in a .pt2 archive"),
        ("lower", "lower a .pt2 archive into a .pte on the server"),
    ):
        p = sub.add_parser(name, parents=[common], help=helptext, formatter_class=_Help,
                           description=helptext[0].upper() + helptext[1:] + ".")
        p.add_argument("model", metavar="MODEL.pt2",
                       help="a PT2 archive written by torch.export.save")
        p.add_argument("--partitioner", dest="plan", action="append", default=[],
                       type=_ordered("partitioner"), metavar="NAME",
                       help="a hosted partitioner (see `list`); repeat for several, applied in "
                       "order (required)")
        p.add_argument("--spec", dest="plan", action="append", type=_ordered("spec"),
                       metavar="KEY=VALUE",
                       help="a spec entry of the --partitioner before it; repeatable. VALUE: "
                       "true/false a bool, 12 an int, 1.5 / 1e-3 / inf / nan a float, str:TEXT "
                       "the string TEXT, anything else a string")
        p.add_argument("--skip-ir-validity-check", action="store_true",
                       help="do not verify the edge program's IR after lowering (ExecuTorch's "
                       "EdgeCompileConfig(_check_ir_validity=False)); for programs the check "
                       "refuses wrongly")
        if name == "lower":
            p.add_argument("-o", "--output", metavar="OUT.pte",
                           help="where to write the .pte (required unless --report-only)")
            p.add_argument("--report-only", action="store_true",
                           help="only the delegation report, no .pte (the same as `partition`)")
        p.add_argument("--report", metavar="REPORT.html",
                       help="also write the delegation report as one self-contained HTML page")
        p.add_argument("--report-json", metavar="REPORT.json",
                       help="also write the delegation report as JSON (what `report` reads)")
    p = sub.add_parser("report", formatter_class=_Help,
                       help="turn a delegation report's JSON into its HTML page, offline",
                       description="Turn a delegation report's JSON (--report-json, or the "
                       "--json output of partition or lower, of either client) into its "
                       "self-contained HTML page. No server is involved.")
    p.add_argument("report_json", metavar="REPORT.json",
                   help="the JSON that --report-json wrote or --json printed")
    p.add_argument("-o", "--output", required=True, metavar="REPORT.html",
                   help="where to write the page")
    p.add_argument("--title", help="the page's title (default: 'Delegation report: MODEL "
                   "(PARTITIONERS)' from the report's own model and partitioners)")


def versions() -> str:
    """``--version``'s line: this package's, torch's and ExecuTorch's installed versions
    (read from the installed distributions: nothing is imported)."""
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    return (f"remote-partitioner {version('remote-partitioner')} (Python client and server; "
            f"torch {version('torch')}, executorch {version('executorch')})")


# ------------------------------------------------------------------------- local checks

def check_writable(path: str, option: str) -> None:
    """Refuse, before anything is sent, an output path that cannot be written: a directory,
    a path in a directory that does not exist or is not writable.

    Raises:
        UsageError: saying what to fix.
    """
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file path")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {parent} does not exist; create it "
                         "first or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        raise UsageError(f"{option} {path} cannot be written (no permission)")


def read_archive(path: str) -> memoryview:
    """The bytes of the PT2 archive at ``path``, refused early when it is not one: a zip
    file (its central directory read at the end) holding an ``archive_format`` entry, every
    entry inside the file's size and starting with a local header where the directory says.
    Cheap: nothing is decompressed. (``client/node/lib/archive.js`` checks the same.)

    A regular file is mapped, not read into memory (hashed and uploaded from the page cache,
    with no copy): one truncated while the command runs ends it (SIGBUS), one changed is
    refused by the server (its bytes no longer match their digest). Anything else (a pipe,
    ``/dev/stdin``) is read.

    Raises:
        UsageError: unreadable, not a zip file, truncated, or a zip file that is not a PT2
            archive.
    """
    hint = "write one with torch.export.save(exported_program, 'model.pt2')"
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            source: IO[bytes] = f
            if stat.S_ISREG(st.st_mode) and st.st_size:
                data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            else:
                raw = f.read()
                data, source = memoryview(raw), io.BytesIO(raw)  # (BytesIO shares bytes)
            try:
                infos = zipfile.ZipFile(source).infolist()  # (its directory only)
            except (zipfile.BadZipFile, ValueError, EOFError) as e:
                raise UsageError(f"{path} is not a PT2 archive (not a zip file, or truncated: "
                                 f"no zip directory at its end); {hint}") from e
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from e
    if not any(i.filename.rsplit("/", 1)[-1] == "archive_format" for i in infos):
        raise UsageError(f"{path} is a zip file but not a PT2 archive (no archive_format "
                         f"entry); {hint}")
    if any(i.header_offset + 30 + i.compress_size > len(data) for i in infos):
        raise UsageError(f"{path} is truncated: its entries reach past its {len(data)} bytes")
    if any(data[i.header_offset:i.header_offset + 4] != b"PK\x03\x04" for i in infos):
        raise UsageError(f"{path} is damaged: its zip directory points where no entry begins; "
                         f"{hint}")
    return data


# -------------------------------------------------------------------------------- output

class _PteOutput:
    """Where :func:`_pte_file` writes the ``.pte``: ``file`` (None: keep it in memory), and
    whether to leave the path as it is (``keep_existing``: it already holds the ``.pte``)."""

    def __init__(self, file: IO[bytes] | None) -> None:
        self.file = file
        self.keep_existing = False


@contextmanager
def _pte_file(path: str | None) -> Iterator[_PteOutput]:
    """The file the ``.pte`` is written to as it arrives: a temporary file beside ``path``
    (beside the file a symbolic link names), renamed to it once the block ends without an
    error (the ``.pte`` whole and verified) unless the block set ``keep_existing``, removed
    otherwise; ``path`` is never left half written. No file (the ``.pte`` is kept in memory
    and written after) without a path, or when it names something other than a regular file
    (``/dev/null``, a pipe)."""
    if path is None:
        yield _PteOutput(None)
        return
    target = os.path.realpath(path)
    existing = os.stat(target) if os.path.exists(target) else None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        yield _PteOutput(None)
        return
    tmp = f"{target}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    done = False
    try:
        with os.fdopen(fd, "wb") as f:
            output = _PteOutput(f)
            yield output
        if not output.keep_existing:
            if existing is not None:
                os.chmod(tmp, stat.S_IMODE(existing.st_mode))  # as writing over it would keep
            os.replace(tmp, target)
            done = True
    finally:
        if not done:
            with suppress(OSError):
                os.unlink(tmp)


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
        yield bar.update


_INT64_TYPES = {
    descriptor.FieldDescriptor.CPPTYPE_INT64, descriptor.FieldDescriptor.CPPTYPE_UINT64,
}


def _int64_as_numbers(desc: Any, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` (``MessageToDict`` of a ``desc`` message) with its 64-bit integers, which
    protobuf's JSON writes as strings, turned back into numbers, and its fields in the
    .proto's order (MessageToDict appends the default-valued ones); in place."""
    ordered = {f.name: value[f.name] for f in desc.fields if f.name in value}
    value.clear()
    value.update(ordered)
    for field in desc.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        repeated = field.is_repeated
        if field.message_type is not None:
            for sub in item if repeated else [item]:
                _int64_as_numbers(field.message_type, sub)
        elif field.cpp_type in _INT64_TYPES:
            value[field.name] = [int(x) for x in item] if repeated else int(item)
    return value


def message_json(message: Message, *, defaults: bool) -> dict[str, Any]:
    """``message`` as a JSON object: proto field names, enums by name, bytes as base64, 64-bit
    integers as numbers; fields at their default value printed only if ``defaults``."""
    as_dict = json_format.MessageToDict(
        message, preserving_proto_field_name=True,
        always_print_fields_with_no_presence=defaults,
    )
    return _int64_as_numbers(message.DESCRIPTOR, as_dict)


def list_json(response: pb.ListPartitionersResponse) -> dict[str, Any]:
    """``list --json``: the response with every field, each spec key's ``default`` as a plain
    value (null when it has none)."""
    out = message_json(response, defaults=True)
    hosted: list[tuple[pb.PartitionerInfo | pb.QuantizerInfo, dict[str, Any]]] = [
        *zip(response.partitioners, out.get("partitioners", []), strict=True),
        *zip(response.quantizers, out.get("quantizers", []), strict=True),
    ]
    for p_msg, p in hosted:
        keys = p.get("spec_keys", [])
        for i, (k_msg, k) in enumerate(zip(p_msg.spec_keys, keys, strict=True)):
            which = k_msg.default.WhichOneof("value") if k_msg.HasField("default") else None
            default = message_json(k_msg.default, defaults=False).get(which) if which else None
            keys[i] = {"name": k["name"], "type": k["type"], "default": default, "doc": k["doc"]}
    return out


def report_json(delegation: pb.DelegationReport, model: str,
                partitioners: Sequence[str]) -> dict[str, Any]:
    """The report as ``--report-json`` writes it (and ``--json`` prints it): ``model`` (the
    archive's file name), ``partitioners`` (their names, in order), then ``methods`` as the
    wire message has them (defaults left out) with ``cpu_nodes`` added to each."""
    wire = message_json(delegation, defaults=False)
    methods = report.with_cpu_nodes(delegation, {"methods": wire.get("methods", [])})["methods"]
    return {"model": Path(model).name, "partitioners": list(partitioners), "methods": methods}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


#: How many node names the text report shows per operator and reason.
_NAMES_SHOWN = 3


def report_lines(delegation: pb.DelegationReport) -> list[str]:
    """The text report: per method its nodes, what each backend took, the operators left on
    the CPU and why."""
    lines: list[str] = []
    for m in delegation.methods:
        delegated = sum(d.nodes for d in m.delegated)
        lines.append(f"method {m.method}: {_plural(m.total_nodes, 'node')}, "
                     f"{delegated} delegated")
        for d in m.delegated:
            lines.append(f"  {d.backend_id}: {_plural(d.nodes, 'node')} in "
                         f"{_plural(d.partitions, 'partition')}")
        if m.cpu_ops:
            lines.append("  left on the CPU:")
            lines.extend(f"    {op.count:5d}  {op.op}" for op in m.cpu_ops)
        groups = report.cpu_nodes_by_op(m)
        if groups:
            lines.append("  why:")
        for op_name, nodes in groups:
            by_reason: dict[str, list[str]] = {}
            for name, reason in nodes:
                by_reason.setdefault(reason, []).append(name)
            for reason, names in by_reason.items():
                shown = ", ".join(names[:_NAMES_SHOWN])
                more = f" +{len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
                lines.append(f"    {op_name}: {reason} ({shown}{more})")
    return lines


def _format_default(k: pb.SpecKeyInfo) -> str:
    which = k.default.WhichOneof("value") if k.HasField("default") else None
    if which is None:
        return ""
    value = message_json(k.default, defaults=False)[which]
    if which == "double_value" and isinstance(value, float) and value.is_integer():
        text = f"{value:.1f}"
    else:
        text = json.dumps(value, ensure_ascii=False)
    return f" = {text}"


_TYPE_NAMES = {
    pb.SPEC_TYPE_BOOL: "bool", pb.SPEC_TYPE_INT: "int", pb.SPEC_TYPE_DOUBLE: "float",
    pb.SPEC_TYPE_STRING: "str", pb.SPEC_TYPE_BYTES: "bytes",
}


def list_lines(response: pb.ListPartitionersResponse) -> list[str]:
    """``list``'s text: the server's versions and every other environment's, then per
    partitioner its backend, class, environment (unless the default one), description,
    overridden hooks and spec keys (type, default, doc), then per quantizer
    (``RemoteQuantizer``) its backend, class, environment, description and spec keys."""
    def versions(v: pb.ServerVersions) -> str:
        return (f"server {v.server} (api {v.api}): torch {v.torch}, executorch {v.executorch}, "
                f"export schema {v.export_schema}, python hash seed {v.python_hash_seed or '?'}")

    def where(environment: str) -> str:
        return f"  [environment {environment}]" if environment else ""

    own = f"environment {response.environment}: " if response.environment else ""
    lines = [own + versions(response.versions)]
    for env in response.environments:
        lines.append(f"environment {env.name}: "
                     + (f"not available: {env.error}" if env.error else versions(env.versions)))
    for p in response.partitioners:
        lines += ["", f"{p.name}  {p.backend_id}  {p.class_name}{where(p.environment)}"]
        if p.description:
            lines.append(f"  {p.description}")
        hooks = [pb.Hook.Name(h).removeprefix("HOOK_").lower() for h in p.overridden_hooks]
        lines.append(f"  hooks: {', '.join(hooks) or '-'}")
        lines += _spec_key_lines(p.spec_keys)
    for q in response.quantizers:
        lines += ["", f"quantizer {q.name}  {q.backend_id}  {q.class_name}{where(q.environment)}"]
        if q.description:
            lines.append(f"  {q.description}")
        lines += _spec_key_lines(q.spec_keys)
    return lines


def _spec_key_lines(keys: Sequence[pb.SpecKeyInfo]) -> list[str]:
    if not keys:
        return ["  spec keys: none"]
    lines = ["  spec keys:"]
    for k in keys:
        type_name = _TYPE_NAMES.get(k.type, pb.SpecType.Name(k.type))
        doc = f"  -- {k.doc}" if k.doc else ""
        lines.append(f"    {k.name}: {type_name}{_format_default(k)}{doc}")
    return lines


def _print(lines: Sequence[str]) -> None:
    for line in lines:
        print(line)


def _write_json(path: str, value: Any) -> None:
    Path(path).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n",
                          encoding="utf-8")


# -------------------------------------------------------------------------------- commands

def _client(args: argparse.Namespace) -> LowerClient:
    if args.request_id is not None and not REQUEST_ID.fullmatch(args.request_id):
        raise UsageError("--request-id wants 1 to 64 characters of [A-Za-z0-9._-]")
    try:
        credentials = (
            read_channel_credentials(args.tls_ca, args.tls_key, args.tls_cert)
            if args.tls or args.tls_ca or args.tls_cert or args.tls_key
            else None
        )
        token = read_token(args.token_file) if args.token_file else None
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from e
    return LowerClient(
        args.target, credentials=credentials, token=token,
        timeout=float(args.timeout) if args.timeout else None,
        request_id=args.request_id or uuid.uuid4().hex,
    )


def _report_page(args: argparse.Namespace) -> int:
    """``report``: the HTML page of a report saved as JSON; no server involved."""
    check_writable(args.output, "-o")
    try:
        saved = json.loads(Path(args.report_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {args.report_json}: {e}") from e
    if not isinstance(saved, dict) or not isinstance(saved.get("methods"), list):
        raise UsageError(f"{args.report_json} holds no delegation report (no 'methods' list)")
    write_report(args.output, saved, title=args.title)  # None: the report's own title
    print(f"wrote {args.output}")
    return EXIT_OK


def _partition_or_lower(args: argparse.Namespace, client_of: Callable[[], LowerClient]) -> int:
    report_only = args.command == "partition" or args.report_only
    plan = partitioner_plan(args.plan)
    if not report_only:
        if not args.output:
            raise UsageError("-o OUT.pte is required (or --report-only)")
        check_writable(args.output, "-o")
    for option, path in (("--report", args.report), ("--report-json", args.report_json)):
        if path:
            check_writable(path, option)
    archive = read_archive(args.model)
    names = [name for name, _ in plan]
    # Neither hash again an archive hashed before, nor download a .pte the output holds.
    digests = DigestCache.default()
    archive_digest = held = None
    if digests is not None:
        archive_digest = digests.lookup(args.model)
        if archive_digest is None or archive_digest.size_bytes != len(archive):
            archive_digest = digests.hash_file(args.model, archive)
        if not report_only:
            held = digests.lookup(args.output)
    with client_of() as client, _progress(len(archive), "upload") as progress:
        while True:
            with _pte_file(None if report_only else args.output) as out:
                result = client.lower(
                    archive, [partitioner_ref(name, spec) for name, spec in plan],
                    report_only=report_only, skip_ir_validity_check=args.skip_ir_validity_check,
                    upload_progress=progress, into=out.file, archive_digest=archive_digest,
                    held_pte=held,
                )
                out.keep_existing = result.pte_held
            progress = None
            # Kept only if the output did not change while the call ran; else its bytes come.
            if not result.pte_held or (digests is not None and digests.lookup(args.output) == held):
                break
            held = None
    saved = report_json(result.report, args.model, names)
    output: dict[str, Any] | None = None
    if not report_only:
        if result.pte is not None:  # (not written as it arrived)
            Path(args.output).write_bytes(result.pte)
        # The digest the server sent, which the bytes received matched: not hashed again.
        digest = result.pte_digest
        assert digest is not None  # (set unless report-only)
        if digests is not None and not result.pte_held:
            digests.record_written(args.output, digest)
        output = {"path": args.output, "bytes": digest.size_bytes, "sha256": digest.hash}
    if args.report:
        write_report(args.report, saved)
    if args.report_json:
        _write_json(args.report_json, saved)
    if args.json:
        print(json.dumps({**saved, "output": output} if output else saved, indent=2,
                         ensure_ascii=False))
        return EXIT_OK
    _print(report_lines(result.report))
    if output and result.pte_held:
        print(f"kept {output['path']} ({_plural(output['bytes'], 'byte')}, "
              f"sha256 {output['sha256']}): it already held this .pte")
    elif output:
        print(f"wrote {output['path']} ({_plural(output['bytes'], 'byte')}, "
              f"sha256 {output['sha256']})")
    if args.report:
        print(f"wrote {args.report} (open it in a browser)")
    if args.report_json:
        print(f"wrote {args.report_json}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.command == "report":
        return _report_page(args)
    if args.command == "list":
        with _client(args) as client:
            response = client.list_partitioners()
        if args.json:
            print(json.dumps(list_json(response), indent=2, ensure_ascii=False))
        else:
            _print(list_lines(response))
        return EXIT_OK
    return _partition_or_lower(args, lambda: _client(args))


def _failure(e: BaseException, args: argparse.Namespace) -> CommandFailed:
    """What went wrong, in the command line's words (see :class:`CommandFailed`)."""
    if isinstance(e, UsageError):
        return CommandFailed(str(e), kind="usage", exit_code=EXIT_USAGE)
    if not isinstance(e, RemotePartitionerError):
        if not isinstance(e.__cause__, RemoteTraceback):  # this client's own failure
            return CommandFailed(f"{type(e).__name__}: {e}", kind="client",
                                 exit_code=EXIT_SERVER)
        # A built-in exception the hosted partitioner raised, rebuilt here.
        text = str(e.args[0]) if e.args else ""
        raised = f"{type(e).__name__}: {text}" if text else type(e).__name__
        return CommandFailed(f"the partitioner raised {raised}", kind="partitioner",
                             exit_code=EXIT_SERVER, reason=errors.Reason.PARTITIONER_RAISED.value)
    reason = e.reason or None
    if reason == errors.Reason.PARTITIONER_RAISED:
        return CommandFailed(f"the partitioner raised {str(e).removesuffix(': ')}",
                             kind="partitioner", exit_code=EXIT_SERVER, reason=reason)
    code = e.code.name
    details = str(e).removeprefix(f"{code}: ")
    if e.code == grpc.StatusCode.UNAVAILABLE and reason is None:
        # `serve --address` takes HOST:PORT only: suggest it for such a target alone.
        start = (f" Start one with: remote-partitioner serve --address {args.target}"
                 if _HOST_PORT.fullmatch(args.target) else "")
        return CommandFailed(
            f"cannot reach {args.target}: is a server running there?{start}",
            kind="unreachable", exit_code=EXIT_UNREACHABLE, code=code, detail=details,
        )
    if e.code == grpc.StatusCode.DEADLINE_EXCEEDED and reason is None and args.timeout:
        return CommandFailed(
            f"no answer within the --timeout of {args.timeout} s (each call's deadline); "
            "give more, or leave --timeout out to wait as long as it takes",
            kind="deadline", exit_code=EXIT_SERVER, code=code, detail=details,
        )
    if not str(e).startswith(f"{code}: "):
        # Raised by this client, not built from a status (e.g. a .pte that does not match
        # its digest).
        return CommandFailed(str(e), kind="client", exit_code=EXIT_SERVER)
    where = f" [{reason}]" if reason else ""
    return CommandFailed(f"the server refused: {code}: {details}{where}", kind="server",
                         exit_code=EXIT_UNREACHABLE if e.code == grpc.StatusCode.UNAVAILABLE
                         else EXIT_SERVER, code=code, reason=reason)


def print_error(command: str, failure: CommandFailed, as_json: bool) -> None:
    """An error on stderr: ``remote-partitioner COMMAND: error: MESSAGE`` (and gRPC's words on
    a second line), or with ``--json`` one JSON object."""
    if as_json:
        print(json.dumps({"error": {
            "exit_code": failure.exit_code, "kind": failure.kind, "code": failure.code,
            "reason": failure.reason, "message": str(failure), "detail": failure.detail,
        }}, ensure_ascii=False), file=sys.stderr)
        return
    print(f"remote-partitioner {command}: error: {failure}", file=sys.stderr)
    if failure.detail:
        print(f"  (gRPC: {failure.detail})", file=sys.stderr)


def usage_error(command: str, message: str, as_json: bool) -> NoReturn:
    """An argparse usage error in the command line's error shape; exits 2."""
    print_error(command, CommandFailed(message, kind="usage", exit_code=EXIT_USAGE), as_json)
    sys.exit(EXIT_USAGE)


def run(args: argparse.Namespace) -> int:
    """Run one client command; return the process exit code."""
    try:
        try:
            code = _run(args)
        except BrokenPipeError:
            raise
        except Exception as e:  # every failure is reported, in one shape
            failure = _failure(e, args)
            print_error(args.command, failure, getattr(args, "json", False))
            code = failure.exit_code
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`list | head -2`): end quietly, as Python's documentation
        # of SIGPIPE recommends: further output goes to /dev/null, exit 1.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SERVER

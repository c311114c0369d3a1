"""Transport and security facts that the client and the server share, written once.

* Where the service lives and what it is called: :data:`DEFAULT_ADDRESS`,
  :data:`ENVIRONMENT_METADATA_KEY` (the header that routes a call to an environment),
  :data:`SERVICE_NAME`, and the largest gRPC message either side accepts,
  :data:`MAX_MESSAGE_BYTES`.
* The partitioner hooks a client can call remotely: :data:`HOOKS` (the ``Partitioner``
  method names) and their ``remote_partitioner.v1.Hook`` values (:func:`hook_to_wire`,
  :func:`hook_from_wire`).
* Bearer tokens in files (:func:`tokens_in_file`) and PEM checks
  (:func:`is_pem_certificate`, :func:`is_pem_private_key`, :func:`read_file_bytes`).

This module is plain Python: importing it imports neither grpc, protobuf, torch nor
ExecuTorch (the health probe and the command line read it before anything heavy is loaded;
the registry stays free of gRPC code). Only :func:`hook_to_wire` and :func:`hook_from_wire`
import the generated messages, when called.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from os import PathLike

StrPath = str | PathLike[str]
"""A file path as the helpers here accept it."""

# ---------------------------------------------------------------------------------- service

#: Where the server listens, and the client connects, unless told otherwise: loopback only.
DEFAULT_ADDRESS = "127.0.0.1:50051"

#: The full name of the gRPC service (``package.Service`` of the .proto file); equal to
#: ``remote_partitioner_pb2.DESCRIPTOR.services_by_name["RemotePartitioner"].full_name``
#: (a test checks it), written out so that reading it needs no protobuf.
SERVICE_NAME = "remote_partitioner.v1.RemotePartitioner"

#: The largest message, in bytes, that the server and the Python client send and receive
#: (gRPC's default is 4 MiB). Blobs travel in 1 MiB chunks; the room is for large programs'
#: fingerprints and for error trailers carrying a remote traceback.
MAX_MESSAGE_BYTES = 64 << 20

#: The request header that names the environment a call is for (see
#: ``ListPartitionersResponse.environments``); the front door routes calls by it, and a call
#: without it goes to the default environment.
ENVIRONMENT_METADATA_KEY = "x-remote-partitioner-environment"

#: What an environment's name may be: it travels as a header value and names a Kubernetes
#: Service suffix, so lowercase letters, digits and ``-``, starting with a letter.
ENVIRONMENT_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")

# ---------------------------------------------------------------------------------- hooks

#: The ``Partitioner`` methods that EXIR calls and a hosted partitioner may override, in the
#: order of the ``remote_partitioner.v1.Hook`` enum.
HOOKS: tuple[str, ...] = ("partition", "ops_to_not_decompose", "transform_for_pre_decomposition")

#: Each hook's member name in the ``remote_partitioner.v1.Hook`` enum.
HOOK_WIRE_NAMES: Mapping[str, str] = {hook: f"HOOK_{hook.upper()}" for hook in HOOKS}


def hook_to_wire(hook: str) -> int:
    """The ``remote_partitioner.v1.Hook`` value of ``hook`` (a name in :data:`HOOKS`).

    Raises:
        KeyError: ``hook`` is not in :data:`HOOKS`.
    """
    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

    return pb.Hook.Value(HOOK_WIRE_NAMES[hook])


def hook_from_wire(value: int) -> str | None:
    """The name in :data:`HOOKS` of the ``remote_partitioner.v1.Hook`` ``value``; None for
    ``HOOK_UNSPECIFIED`` and for a value this version does not know (a newer server's)."""
    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

    by_wire = {wire: hook for hook, wire in HOOK_WIRE_NAMES.items()}
    try:
        return by_wire.get(pb.Hook.Name(value))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------- tokens

#: A bearer token: one or more visible ASCII characters (what gRPC metadata can carry, no
#: whitespace).
TOKEN_PATTERN = re.compile(r"[\x21-\x7e]+")


def tokens_in_file(path: StrPath) -> Iterator[str]:
    """The bearer tokens in the file at ``path``, one per line, in file order.

    Surrounding whitespace is stripped; blank lines and lines starting with ``#`` are skipped.
    The file is read when iteration starts; a line is checked when iteration reaches it, so
    a caller that wants only the first token does not fail on later lines.

    Raises:
        ValueError: the file cannot be read or decoded as UTF-8 (``cannot read token file``),
            a token contains whitespace or a character outside visible ASCII (the line number
            is named, never the token), or the file holds no token at all.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read token file {str(path)!r}: {e}") from e
    found = False
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not TOKEN_PATTERN.fullmatch(line):
            raise ValueError(
                f"token file {str(path)!r}, line {number}: a token must be visible ASCII "
                "characters without whitespace"
            )
        found = True
        yield line
    if not found:
        raise ValueError(f"token file {str(path)!r} holds no token")


# ---------------------------------------------------------------------------------- PEM

_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")


def is_pem_certificate(data: bytes) -> bool:
    """Whether ``data`` holds at least one PEM certificate (a cheap check of the armour, so
    that a wrong file is named before gRPC fails obscurely; gRPC parses the rest)."""
    return _PEM_CERTIFICATE in data


def is_pem_private_key(data: bytes) -> bool:
    """Whether ``data`` holds a PEM private key (``PRIVATE KEY``, ``RSA PRIVATE KEY``,
    ``EC PRIVATE KEY``, ...), by its armour."""
    return _PEM_PRIVATE_KEY.search(data) is not None


def read_file_bytes(path: StrPath, what: str) -> bytes:
    """The bytes of the file at ``path``.

    Raises:
        ValueError: the file cannot be read; the message is ``cannot read <what> '<path>':
            <reason>``.
    """
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {str(path)!r}: {e}") from e


__all__ = [
    "DEFAULT_ADDRESS",
    "HOOKS",
    "HOOK_WIRE_NAMES",
    "MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "TOKEN_PATTERN",
    "StrPath",
    "hook_from_wire",
    "hook_to_wire",
    "is_pem_certificate",
    "is_pem_private_key",
    "read_file_bytes",
    "tokens_in_file",
]

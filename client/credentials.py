"""Client-side security helpers: TLS channel credentials and bearer tokens from files.

Pass the results to :class:`~remote_partitioner.client.RemotePartitioner`::

    RemotePartitioner(
        "partitioner.example.com:443", "xnnpack",
        credentials=read_channel_credentials("ca.pem", "client.key", "client.pem"),
        token=read_token("token.txt"),
    )
"""

from __future__ import annotations

import re
from os import PathLike

import grpc

StrPath = str | PathLike[str]

# A token is one or more visible ASCII characters (what gRPC metadata can carry, no spaces).
_TOKEN = re.compile(r"[\x21-\x7e]+")


def channel_credentials(
    root_certificates: bytes | None = None,
    private_key: bytes | None = None,
    certificate_chain: bytes | None = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM bytes.

    ``root_certificates`` are the CAs trusted to sign the server's certificate (None: the
    system's default roots). ``private_key`` and ``certificate_chain`` are the client's own
    key and certificate, for a server that runs mutual TLS; give both or neither.

    Raises:
        ValueError: only one of ``private_key`` and ``certificate_chain`` is given, or an
            argument is not PEM of the expected kind.
    """
    if (private_key is None) != (certificate_chain is None):
        raise ValueError(
            "a client certificate needs its private key and the key its certificate: "
            "give both private_key and certificate_chain, or neither"
        )
    if root_certificates is not None and b"-----BEGIN CERTIFICATE-----" not in root_certificates:
        raise ValueError("the root certificates are not PEM certificates")
    if certificate_chain is not None and b"-----BEGIN CERTIFICATE-----" not in certificate_chain:
        raise ValueError("the client certificate chain is not a PEM certificate")
    if private_key is not None and not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----",
                                                 private_key):
        raise ValueError("the client private key is not a PEM private key")
    return grpc.ssl_channel_credentials(
        root_certificates=root_certificates,
        private_key=private_key,
        certificate_chain=certificate_chain,
    )


def _read_bytes(path: StrPath, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {str(path)!r}: {e}") from e


def read_channel_credentials(
    root_path: StrPath | None = None,
    key_path: StrPath | None = None,
    cert_path: StrPath | None = None,
) -> grpc.ChannelCredentials:
    """:func:`channel_credentials` from PEM files; a None path leaves that part out.

    Raises:
        ValueError: a file cannot be read, only one of ``key_path`` and ``cert_path`` is
            given, or a file is not PEM of the expected kind.
    """
    if (key_path is None) != (cert_path is None):
        raise ValueError("give both key_path and cert_path for a client certificate, or neither")
    return channel_credentials(
        _read_bytes(root_path, "root certificates") if root_path is not None else None,
        _read_bytes(key_path, "client private key") if key_path is not None else None,
        _read_bytes(cert_path, "client certificate") if cert_path is not None else None,
    )


def read_token(path: StrPath) -> str:
    """The bearer token in the file at ``path``: its first line that is neither blank nor a
    ``#`` comment, with surrounding whitespace stripped.

    Raises:
        ValueError: the file cannot be read or decoded as UTF-8, holds no token, or the token
            contains whitespace or a character outside visible ASCII (it could not be sent
            as gRPC metadata); the token itself is never put in the message.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read token file {str(path)!r}: {e}") from e
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not _TOKEN.fullmatch(line):
            raise ValueError(
                f"token file {str(path)!r}, line {number}: a token must be visible ASCII "
                "characters without whitespace"
            )
        return line
    raise ValueError(f"token file {str(path)!r} holds no token")

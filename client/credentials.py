"""Client-side security helpers: TLS channel credentials and bearer tokens from files.

Pass the results to :class:`~remote_partitioner.client.RemotePartitioner`::

    RemotePartitioner(
        "partitioner.example.com:443", "xnnpack",
        credentials=read_channel_credentials("ca.pem", "client.key", "client.pem"),
        token=read_token("token.txt"),
    )
"""

from __future__ import annotations

import grpc

from remote_partitioner.proto.transport import (
    StrPath,
    is_pem_certificate,
    is_pem_private_key,
    read_file_bytes,
    tokens_in_file,
)


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
    if root_certificates is not None and not is_pem_certificate(root_certificates):
        raise ValueError("the root certificates are not PEM certificates")
    if certificate_chain is not None and not is_pem_certificate(certificate_chain):
        raise ValueError("the client certificate chain is not a PEM certificate")
    if private_key is not None and not is_pem_private_key(private_key):
        raise ValueError("the client private key is not a PEM private key")
    return grpc.ssl_channel_credentials(
        root_certificates=root_certificates,
        private_key=private_key,
        certificate_chain=certificate_chain,
    )


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
        read_file_bytes(root_path, "root certificates") if root_path is not None else None,
        read_file_bytes(key_path, "client private key") if key_path is not None else None,
        read_file_bytes(cert_path, "client certificate") if cert_path is not None else None,
    )


def read_token(path: StrPath) -> str:
    """The bearer token in the file at ``path``: its first line that is neither blank nor a
    ``#`` comment, with surrounding whitespace stripped.

    Raises:
        ValueError: the file cannot be read or decoded as UTF-8, holds no token, or the token
            contains whitespace or a character outside visible ASCII (it could not be sent
            as gRPC metadata); the token itself is never put in the message.
    """
    return next(tokens_in_file(path))

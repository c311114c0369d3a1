"""Server-side security: bearer-token authentication, TLS credentials, loopback detection.

* :func:`load_tokens` reads the accepted bearer tokens from a file.
* :class:`BearerTokenInterceptor` admits a call only when its ``authorization`` metadata is
  ``Bearer <token>`` with a known token; health checking and reflection stay open.
* :func:`server_credentials` / :func:`read_server_credentials` build TLS (optionally mutual
  TLS) server credentials from PEM.
* :func:`is_loopback` tells whether a listen address only accepts connections from this host
  (the CLI refuses to listen elsewhere without TLS unless told ``--insecure``).

Tokens are secrets: nothing here logs them or puts them in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Iterable

import grpc

from remote_partitioner.proto.errors import Reason, ServiceError
from remote_partitioner.proto.transport import (
    TOKEN_PATTERN,
    StrPath,
    is_pem_certificate,
    is_pem_private_key,
    read_file_bytes,
    tokens_in_file,
)
from remote_partitioner.server.handlers import rejecting_handler
from remote_partitioner.server.status import make_status

logger = logging.getLogger(__name__)

#: Methods served without a token: health checking and server reflection (full method names).
OPEN_METHODS: frozenset[str] = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)


_TOKEN = TOKEN_PATTERN
# RFC 6750: the scheme is case-insensitive; one or more spaces before the token.
_BEARER = re.compile(r"(?i:bearer) +([\x21-\x7e]+)")


# ---------------------------------------------------------------------------------- tokens


def load_tokens(path: StrPath) -> frozenset[str]:
    """The bearer tokens in the file at ``path``: one per line.

    Surrounding whitespace is stripped; blank lines and lines starting with ``#`` are ignored.

    Raises:
        ValueError: the file cannot be read or decoded as UTF-8, a token contains whitespace
            or a character outside visible ASCII (the line number is named, the token is not),
            or the file holds no token.
    """
    return frozenset(tokens_in_file(path))


def _digest(token: str) -> bytes:
    # Comparing fixed-length digests keeps the comparison's time independent of the length
    # of the known tokens as well as of their contents.
    return hashlib.sha256(token.encode("utf-8")).digest()


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Admits a call only if it carries ``authorization: Bearer <token>`` with a known token.

    Calls to ``open_methods`` (by default :data:`OPEN_METHODS`: health checking and
    reflection) pass without a token. Any other call:

    * with no ``authorization`` metadata, more than one, or one not of the form
      ``Bearer <token>`` (scheme case-insensitive) ends with ``UNAUTHENTICATED``;
    * with a well-formed token that is not one of ``tokens`` ends with ``PERMISSION_DENIED``;

    each as a ``google.rpc.Status`` carrying an ``ErrorInfo`` (domain
    ``remote-partitioner``, reason ``"UNAUTHENTICATED"`` or
    ``"PERMISSION_DENIED"``). A rejected call's request is never deserialized and its
    handler never runs. The presented token is compared with every known token in constant
    time (:func:`hmac.compare_digest` on SHA-256 digests) and is never logged.

    Raises:
        ValueError: (constructor) ``tokens`` is empty or holds a token that could never be
            sent (empty, whitespace, or not visible ASCII).
    """

    def __init__(self, tokens: Iterable[str], open_methods: Iterable[str] = OPEN_METHODS) -> None:
        known = list(tokens)
        if not known:
            raise ValueError("BearerTokenInterceptor needs at least one token")
        for i, token in enumerate(known):
            if not isinstance(token, str) or not _TOKEN.fullmatch(token):
                raise ValueError(
                    f"token #{i}: a token must be a non-empty string of visible ASCII "
                    "characters without whitespace"
                )
        self._digests: tuple[bytes, ...] = tuple({_digest(t) for t in known})
        self.open_methods: frozenset[str] = frozenset(open_methods)

    def _known(self, token: str) -> bool:
        presented = _digest(token)
        found = False
        for digest in self._digests:  # no early exit: every known token is compared
            found |= hmac.compare_digest(presented, digest)
        return found

    def check(self, metadata: Iterable[tuple[str, str | bytes]]) -> grpc.Status | None:
        """None if ``metadata`` carries an accepted bearer token, else the rejection status."""
        values = [v for k, v in metadata if k.lower() == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            message = (
                "missing authorization metadata: send 'authorization: Bearer <token>'"
                if not values
                else "exactly one authorization metadata entry is allowed"
            )
            return make_status(ServiceError(Reason.UNAUTHENTICATED, message))
        match = _BEARER.fullmatch(values[0].strip())
        if match is None:
            return make_status(ServiceError(
                Reason.UNAUTHENTICATED,
                "malformed authorization metadata: expected 'Bearer <token>'",
            ))
        if not self._known(match.group(1)):
            return make_status(ServiceError(
                Reason.PERMISSION_DENIED, "the bearer token is not accepted by this server"
            ))
        return None

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if method in self.open_methods:
            return await continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        rejection = self.check(metadata)
        handler = await continuation(handler_call_details)
        if rejection is None:
            return handler
        return rejecting_handler(handler, method, rejection)


# ---------------------------------------------------------------------------------- TLS


def server_credentials(
    cert_chain: bytes, private_key: bytes, client_ca: bytes | None = None
) -> grpc.ServerCredentials:
    """TLS server credentials from PEM bytes.

    ``cert_chain`` is the server's certificate (then any intermediates), ``private_key`` its
    key. With ``client_ca`` the server runs mutual TLS: every client must present a
    certificate that chains to ``client_ca``, or the handshake fails. Without it, clients are
    not asked for a certificate.

    Raises:
        ValueError: an argument is empty or not PEM of the expected kind.
    """
    if not is_pem_certificate(cert_chain):
        raise ValueError("the server certificate chain is not a PEM certificate")
    if not is_pem_private_key(private_key):
        raise ValueError("the server private key is not a PEM private key")
    if client_ca is not None and not is_pem_certificate(client_ca):
        raise ValueError("the client CA is not a PEM certificate")
    return grpc.ssl_server_credentials(
        [(private_key, cert_chain)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def read_server_credentials(
    cert_path: StrPath, key_path: StrPath, client_ca_path: StrPath | None = None
) -> grpc.ServerCredentials:
    """:func:`server_credentials` from PEM files (``client_ca_path`` enables mutual TLS).

    Raises:
        ValueError: a file cannot be read or is not PEM of the expected kind.
    """
    return server_credentials(
        read_file_bytes(cert_path, "TLS certificate"),
        read_file_bytes(key_path, "TLS private key"),
        read_file_bytes(client_ca_path, "client CA") if client_ca_path is not None else None,
    )


# ---------------------------------------------------------------------------------- addresses


def _host(address: str) -> str:
    if address.startswith("["):  # [v6]:port or [v6]
        end = address.find("]")
        return address[1:end] if end != -1 else address
    if address.count(":") == 1:  # host:port
        return address.rsplit(":", 1)[0]
    return address  # host without port, or a bare IPv6 address


def is_loopback(address: str) -> bool:
    """Whether listening on ``address`` (``HOST:PORT``) only accepts connections from this host.

    True for ``localhost``, any ``127.0.0.0/8`` address, ``::1`` (``[::1]:PORT``) and IPv4
    addresses mapped into IPv6 that are loopback. False for wildcards (``0.0.0.0``, ``[::]``,
    an empty host), any other name or address, and anything that is not ``HOST:PORT`` (for
    example ``unix:`` paths): False is the safe answer.
    """
    host = _host(address.strip())
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback

"""Channels to the service: options, credentials, and how calls spread over several servers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

#: Room for large responses and for error trailers that carry a remote traceback.
DEFAULT_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_metadata_size", 1 << 20),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
]


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A channel to ``target``: TLS with ``credentials``, else plaintext."""
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=list(options))
    return grpc.insecure_channel(target, options=list(options))

"""Channels to the service: options, credentials, and how calls spread over several servers.

A target may name several replicas (``ipv4:10.0.0.1:50051,10.0.0.2:50051``, or a
``dns:///name:port`` that resolves to several addresses). The default service config
(:func:`service_config`, in :data:`DEFAULT_CHANNEL_OPTIONS`) then does, with gRPC's own
machinery only:

* **Affinity.** A lowering uploads blobs (``FindMissingBlobs``, ``UploadBlobs``) and then
  calls a hook that reads them: all three must reach the replica that holds the blobs, which
  plain ``round_robin`` does not ensure (it sends consecutive calls to different replicas, in a
  cycle that can make every retry miss). The channel uses gRPC's ``ring_hash`` policy keyed by
  the request header :data:`AFFINITY_METADATA_KEY` (gRFC A76, ``requestHashHeader``): calls
  carrying the same key (one ``RemotePartitioner`` sends one random key,
  :func:`new_affinity_key`) go to the same replica, different keys spread over the replicas,
  and calls without the key go to a random ready replica.
* **Failover.** When the key's replica is unreachable, ``ring_hash`` picks the next replica on
  the ring; the blobs missing there are uploaded again by the client (``FindMissingBlobs``
  reports them, a hook answers ``BLOB_MISSING``). Calls to the service that fail with
  ``UNAVAILABLE`` before the server answered are retried by gRPC (:data:`RETRY_POLICY`; every
  RPC of the service is idempotent). A call whose replica dies after it answered the headers
  fails with ``UNAVAILABLE`` and is retried by ``RemotePartitioner`` itself.

gRPC 1.85 (C-core) reads ``requestHashHeader`` only when the environment variable
:data:`RING_HASH_ENV` is true, and without it ``ring_hash`` fails every call ("hash attribute
not present"). Importing this module therefore sets that variable to ``true`` unless it is
already set (it changes nothing else: no other configuration names a request hash header).
When the variable is set to something else, or gRPC is older than :data:`_MIN_RING_HASH_GRPC`,
the default config falls back to ``pick_first`` with a shuffled address list (gRFC A62): each
channel, hence each ``RemotePartitioner``, sticks to one random replica and moves to the next
when it fails.

Replicas that share one blob directory (``remote-partitioner serve --blob-dir`` on a
ReadWriteMany volume) need no affinity: pass
``("grpc.service_config", service_config_json(affinity=False))`` in the options for per-call
``round_robin``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from typing import Any

import grpc

# SERVICE_NAME: the service whose RPCs the retry policy covers (re-exported).
from remote_partitioner.proto.transport import MAX_MESSAGE_BYTES, SERVICE_NAME

#: The request header whose value picks a replica (same value, same replica while it is up).
AFFINITY_METADATA_KEY = "x-remote-partitioner-affinity"

#: The gRPC C-core switch that enables ``requestHashHeader`` in the ``ring_hash`` config.
RING_HASH_ENV = "GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY"

#: The first grpcio release assumed to implement gRFC A76's request hash header (checked on
#: 1.85); older ones fall back to ``pick_first`` affinity.
_MIN_RING_HASH_GRPC = (1, 72)

#: gRPC's retry of calls that fail with UNAVAILABLE before the server answered (connection
#: refused or reset, replica gone): 5 attempts in all, backoff 0.1 s doubling up to 2 s
#: (randomized by gRPC).
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def _grpc_version() -> tuple[int, ...]:
    parts = []
    for p in grpc.__version__.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _enable_header_hashing() -> bool:
    """Turn on gRPC's ``ring_hash`` request hash header for this process unless the
    environment already decides; whether it is on (and this gRPC implements it)."""
    if _grpc_version() < _MIN_RING_HASH_GRPC:
        return False
    value = os.environ.setdefault(RING_HASH_ENV, "true")
    # A subset of what gRPC reads as true: where we say yes, gRPC does too.
    return value.strip().lower() in {"1", "true", "yes"}


#: Whether the default service config pins calls by :data:`AFFINITY_METADATA_KEY`
#: (``ring_hash``), rather than pinning each channel (``pick_first``, shuffled).
HEADER_AFFINITY: bool = _enable_header_hashing()


def new_affinity_key() -> str:
    """A fresh random value for :data:`AFFINITY_METADATA_KEY` (one per client object)."""
    return secrets.token_hex(16)


def service_config(affinity: bool = True) -> dict[str, Any]:
    """The service config for channels to the service.

    With ``affinity``: ``ring_hash`` keyed by :data:`AFFINITY_METADATA_KEY` when
    :data:`HEADER_AFFINITY`, else (or where gRPC lacks ``ring_hash``) ``pick_first`` over the
    shuffled addresses. Without: ``round_robin`` over all ready replicas, call by call (for
    replicas that share their blobs). Either way :data:`RETRY_POLICY` for every RPC of
    :data:`SERVICE_NAME`.
    """
    sticky_channel = {"pick_first": {"shuffleAddressList": True}}
    lb: list[dict[str, Any]]
    if not affinity:
        lb = [{"round_robin": {}}]
    elif HEADER_AFFINITY:
        # gRPC takes the first policy of the list that it implements.
        lb = [{"ring_hash_experimental": {"requestHashHeader": AFFINITY_METADATA_KEY}},
              sticky_channel]
    else:
        lb = [sticky_channel]
    return {
        "loadBalancingConfig": lb,
        "methodConfig": [{"name": [{"service": SERVICE_NAME}], "retryPolicy": RETRY_POLICY}],
    }


def service_config_json(affinity: bool = True) -> str:
    """:func:`service_config` as the JSON the ``grpc.service_config`` channel option takes."""
    return json.dumps(service_config(affinity), separators=(",", ":"))


#: Room for large responses and for error trailers that carry a remote traceback; the service
#: config above (affinity, failover, retries).
DEFAULT_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", 1 << 20),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", service_config_json()),
]


def merge_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` with one entry per name, the last one given winning (gRPC itself would
    take the first), in the order names first appear."""
    return list(dict(options).items())


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A channel to ``target``: TLS with ``credentials``, else plaintext.

    ``options`` are channel options; of several with one name the last wins, so that
    ``[*DEFAULT_CHANNEL_OPTIONS, *extra]`` lets ``extra`` override a default (e.g. its own
    ``grpc.service_config``).
    """
    merged = merge_options(options)
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=merged)
    return grpc.insecure_channel(target, options=merged)


__all__ = [
    "AFFINITY_METADATA_KEY",
    "DEFAULT_CHANNEL_OPTIONS",
    "HEADER_AFFINITY",
    "RETRY_POLICY",
    "RING_HASH_ENV",
    "SERVICE_NAME",
    "merge_options",
    "new_affinity_key",
    "open_channel",
    "service_config",
    "service_config_json",
]

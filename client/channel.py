"""Channels to the service: options, credentials, and how calls spread over several servers.

A target may name several replicas (``ipv4:10.0.0.1:50051,10.0.0.2:50051``, or a
``dns:///name:port`` that resolves to several addresses). The default service config
(:func:`service_config`, in :func:`default_channel_options`) then does, with gRPC's own
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
not present"). Importing this module changes nothing; :func:`enable_header_hashing` sets that
variable to ``true`` in this process's environment unless it is already set, and the default
service config calls it (through :func:`service_config`, :func:`default_channel_options` and
:func:`open_channel`) before the first channel using it is created, which is when gRPC reads
the variable. Setting it changes nothing else: no other configuration names a request hash
header. When the variable is set to something else, or gRPC is older than
:data:`_MIN_RING_HASH_GRPC`, the default config falls back to ``pick_first`` with a shuffled
address list (gRFC A62): each channel, hence each ``RemotePartitioner``, sticks to one random
replica and moves to the next when it fails.

Replicas that share one blob directory (``remote-partitioner serve --blob-dir`` on a
ReadWriteMany volume) need no affinity: pass
``("grpc.service_config", service_config_json(affinity=False))`` in the options for per-call
``round_robin``.
"""

from __future__ import annotations

import functools
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


@functools.cache
def enable_header_hashing() -> bool:
    """Turn on gRPC's ``ring_hash`` request hash header for this process unless the
    environment already decides; return whether it is on (and this gRPC implements it).

    Sets :data:`RING_HASH_ENV` to ``true`` in ``os.environ`` if it is unset and gRPC is at
    least :data:`_MIN_RING_HASH_GRPC`; never overrides a value the user set. Decided once per
    process (later calls return the first answer), so that every channel this module
    configures agrees. Call it before creating the first channel that should use
    ``ring_hash`` affinity: gRPC reads the variable when it parses the service config.
    """
    if _grpc_version() < _MIN_RING_HASH_GRPC:
        return False
    value = os.environ.setdefault(RING_HASH_ENV, "true")
    # A subset of what gRPC reads as true: where we say yes, gRPC does too.
    return value.strip().lower() in {"1", "true", "yes"}


def new_affinity_key() -> str:
    """A fresh random value for :data:`AFFINITY_METADATA_KEY` (one per client object)."""
    return secrets.token_hex(16)


def service_config(affinity: bool = True) -> dict[str, Any]:
    """The service config for channels to the service.

    With ``affinity``: ``ring_hash`` keyed by :data:`AFFINITY_METADATA_KEY` when
    :func:`enable_header_hashing` (called here, so that the environment is set before a
    channel with this config exists) says gRPC reads the header, else (or where gRPC lacks
    ``ring_hash``) ``pick_first`` over the shuffled addresses. Without: ``round_robin`` over
    all ready replicas, call by call (for replicas that share their blobs). Either way
    :data:`RETRY_POLICY` for every RPC of :data:`SERVICE_NAME`.
    """
    sticky_channel = {"pick_first": {"shuffleAddressList": True}}
    lb: list[dict[str, Any]]
    if not affinity:
        lb = [{"round_robin": {}}]
    elif enable_header_hashing():
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


def default_channel_options() -> list[tuple[str, Any]]:
    """The options of a channel to the service: room for large messages
    (:data:`MAX_MESSAGE_BYTES`) and for error trailers that carry a remote traceback,
    keepalive, and the service config above (affinity, failover, retries).

    Building them calls :func:`enable_header_hashing`, so the environment gRPC reads is set
    before a channel with these options is created. A new list each call.
    """
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_metadata_size", 1 << 20),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config_json()),
    ]


# Declared for type checkers; computed on first access by __getattr__ below, not at import.
#: Whether the default service config pins calls by :data:`AFFINITY_METADATA_KEY`
#: (``ring_hash``), rather than pinning each channel (``pick_first``, shuffled): the answer of
#: :func:`enable_header_hashing` (reading it sets the environment variable).
HEADER_AFFINITY: bool
#: :func:`default_channel_options`, computed on first access (which sets the environment
#: variable, see :func:`enable_header_hashing`).
DEFAULT_CHANNEL_OPTIONS: list[tuple[str, Any]]


def __getattr__(name: str) -> Any:
    # PEP 562: these two depend on the environment variable enable_header_hashing() sets, so
    # they are computed when first read (before a channel uses them), not when this module is
    # imported.
    if name == "HEADER_AFFINITY":
        return enable_header_hashing()
    if name == "DEFAULT_CHANNEL_OPTIONS":
        value = default_channel_options()
        globals()[name] = value  # one list, as when it was a constant
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def merge_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` with one entry per name, the last one given winning (gRPC itself would
    take the first), in the order names first appear."""
    return list(dict(options).items())


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] | None = None,
) -> grpc.Channel:
    """A channel to ``target``: TLS with ``credentials``, else plaintext.

    ``options`` are channel options, :func:`default_channel_options` when None; of several
    with one name the last wins, so that ``[*default_channel_options(), *extra]`` lets
    ``extra`` override a default (e.g. its own ``grpc.service_config``).
    """
    merged = merge_options(default_channel_options() if options is None else options)
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=merged)
    return grpc.insecure_channel(target, options=merged)


__all__ = [
    "AFFINITY_METADATA_KEY",
    "DEFAULT_CHANNEL_OPTIONS",
    "HEADER_AFFINITY",
    "MAX_MESSAGE_BYTES",
    "RETRY_POLICY",
    "RING_HASH_ENV",
    "SERVICE_NAME",
    "default_channel_options",
    "enable_header_hashing",
    "merge_options",
    "new_affinity_key",
    "open_channel",
    "service_config",
    "service_config_json",
]

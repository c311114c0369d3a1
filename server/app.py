"""Builds the gRPC server: the partitioning service, ``grpc.health.v1`` and server reflection
on one port."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.blobstore import Blobs, BlobStore
from remote_partitioner.server.registry import Registry, default_registry
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.servicer import RemotePartitionerServicer, server_versions
from remote_partitioner.server.settings import DEFAULT_ADDRESS, Limits

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RemotePartitioner"].full_name
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
MAX_MESSAGE_BYTES = 64 << 20

#: Explicit transport settings: message sizes (blobs travel in 1 MiB chunks, so 64 MiB leaves
#: room for large programs' fingerprints), and keepalive: the server pings an idle connection
#: every 60 s, drops it if the ping is not answered in 20 s, and accepts client pings no more
#: often than every 30 s (clients of this package ping every 60 s).
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 30_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def versions_key() -> str:
    """This server's versions, as the result cache keys on them."""
    return server_versions().SerializeToString(deterministic=True).hex()


def create_server(
    address: str = DEFAULT_ADDRESS,
    *,
    registry: Registry | None = None,
    blob_store: Blobs | None = None,
    limits: Limits | None = None,
    result_cache: ResultCache | None = None,
    max_workers: int = 8,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    health_servicer: health.HealthServicer | None = None,
) -> tuple[grpc.Server, int]:
    """Create (not start) a server for the service on ``address``; return it and its port.

    ``address`` is ``HOST:PORT``; port 0 picks a free port, which is returned. With
    ``credentials`` the port serves TLS; ``interceptors`` run on every call. The same port
    serves ``grpc.health.v1`` (SERVING for the overall server "" and for
    ``remote_partitioner.v1.RemotePartitioner``; pass ``health_servicer`` to change that later,
    e.g. NOT_SERVING on shutdown) and server reflection listing every service. Hook responses
    are cached in ``result_cache`` (default: a 256 MiB one; ``ResultCache(0)`` turns it off).

    Raises:
        RuntimeError: the address cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=SERVER_OPTIONS,
        interceptors=list(interceptors),
    )
    servicer = RemotePartitionerServicer(
        registry if registry is not None else default_registry(),
        blob_store if blob_store is not None else BlobStore(),
        limits,
        result_cache if result_cache is not None else ResultCache(versions=versions_key()),
    )
    pb_grpc.add_RemotePartitionerServicer_to_server(servicer, server)
    health_servicer = health_servicer or health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    if credentials is not None:
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot bind {address}")
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port

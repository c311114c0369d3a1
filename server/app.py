"""Builds the gRPC server: the partitioning service and ``grpc.health.v1`` on one port."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.registry import Registry, default_registry
from remote_partitioner.server.servicer import RemotePartitionerServicer

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RemotePartitioner"].full_name
DEFAULT_ADDRESS = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 << 20

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def create_server(
    address: str = DEFAULT_ADDRESS,
    *,
    registry: Registry | None = None,
    blob_store: BlobStore | None = None,
    max_workers: int = 8,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, int]:
    """Create (not start) a server for the service on ``address``; return it and its port.

    ``address`` is ``HOST:PORT``; port 0 picks a free port, which is returned. With
    ``credentials`` the port serves TLS; ``interceptors`` run on every call. Health
    (``grpc.health.v1``) is served on the same port and reports SERVING for the overall
    server ("") and for ``remote_partitioner.v1.RemotePartitioner`` once the server starts.

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
    )
    pb_grpc.add_RemotePartitionerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if credentials is not None:
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot bind {address}")
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port

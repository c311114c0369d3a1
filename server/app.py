"""Builds the gRPC server: the partitioning service, ``grpc.health.v1`` and server reflection
on one port, served by ``grpc.aio`` on an event loop of its own.

:func:`create_server` returns a :class:`Server`, whose blocking methods (``start``, ``stop``,
``wait_for_termination``) mirror ``grpc.Server``'s, so that a command line, a test or an
embedding program drives it from ordinary threads while every RPC's I/O runs on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from remote_partitioner.proto.transport import MAX_MESSAGE_BYTES, SERVICE_NAME
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.backend_registry import BackendRegistry
from remote_partitioner.server.blobstore import Blobs, BlobStore
from remote_partitioner.server.environments import Environment, EnvironmentInterceptor
from remote_partitioner.server.instance import PartitionerInstance
from remote_partitioner.server.quantizers import QuantizerRegistry, default_quantizers
from remote_partitioner.server.registry import Registry, default_registry
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.servicer import RemotePartitionerServicer
from remote_partitioner.server.settings import DEFAULT_ADDRESS, Limits
from remote_partitioner.server.unparsable import UnparsableRequestInterceptor
from remote_partitioner.server.versions import versions_key

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

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

_T = TypeVar("_T")


class BindError(RuntimeError):
    """The server's address cannot be bound: another socket holds the port, or the host is not
    an address of this machine."""


#: Seconds the blocking methods wait for the loop to do something quick (bind, start).
_LOOP_TIMEOUT = 60.0


class Server:
    """A ``grpc.aio`` server on an event loop running in a daemon thread of its own.

    Attributes:
        servicer: the RemotePartitioner servicer (its ``instance`` holds the logic).
        health: the ``grpc.health.v1`` servicer (asyncio; use :meth:`set_health`).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="grpc-aio", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        self._stopping = False
        self._server: grpc.aio.Server | None = None
        self.servicer: RemotePartitionerServicer | None = None
        self.health: health_aio.HealthServicer | None = None

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Awaitable[_T], timeout: float | None = _LOOP_TIMEOUT) -> _T:
        """Run ``coro`` on the server's loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def bind(self, build: Callable[[], Awaitable[tuple[grpc.aio.Server, int]]]) -> int:
        """Run ``build`` on the loop: it creates the ``grpc.aio`` server (which must be
        created on its loop) and binds its port; return the port.

        Raises:
            BindError: ``build`` raised it, or bound no port (the loop is stopped).
            RuntimeError: ``build`` failed otherwise (the loop is stopped).
        """
        async def adopt() -> int:
            self._server, port = await build()
            return port

        try:
            port = self.run(adopt())
        except BindError:
            self.stop(None).wait(_LOOP_TIMEOUT)
            raise
        except Exception as e:
            self.stop(None).wait(_LOOP_TIMEOUT)
            raise RuntimeError(f"cannot start the server: {e}") from e
        if port == 0:
            self.stop(None).wait(_LOOP_TIMEOUT)
            raise BindError("cannot bind the server's address")
        return port

    def start(self) -> None:
        """Start serving."""
        assert self._server is not None
        self.run(self._server.start())

    def set_health(
        self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus
    ) -> None:
        """Set the health status of ``service`` ("" for the whole server)."""
        assert self.health is not None
        self.run(self.health.set(service, status))

    def enter_graceful_shutdown(self) -> None:
        """Health turns NOT_SERVING for every service, for good (probes see it at once)."""
        assert self.health is not None
        self.run(self.health.enter_graceful_shutdown())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop accepting calls; calls in flight get ``grace`` seconds (None: none) to finish.
        Returns an event set once the server has stopped and its loop has ended."""
        if self._stopping:
            return self._stopped
        self._stopping = True

        async def stop() -> None:
            try:
                if self._server is not None:
                    await self._server.stop(grace)
            finally:
                if self.servicer is not None:
                    self.servicer.shutdown()
                self.loop.call_soon(self.loop.stop)

        def done(_: object) -> None:
            self._stopped.set()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).add_done_callback(done)
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (True) or ``timeout`` passed (False)."""
        return self._stopped.wait(timeout)


def create_server(
    address: str = DEFAULT_ADDRESS,
    *,
    registry: Registry | None = None,
    backends: BackendRegistry | None = None,
    quantizers: QuantizerRegistry | None = None,
    blob_store: Blobs | None = None,
    limits: Limits | None = None,
    result_cache: ResultCache | None = None,
    io_threads: int = 4,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    share_port: bool = False,
    environment: Environment | None = None,
) -> tuple[Server, int]:
    """Create (not start) a server for the service on ``address``; return it and its port.

    ``address`` is ``HOST:PORT``; port 0 picks a free port, which is returned. With
    ``credentials`` the port serves TLS; ``interceptors`` (``grpc.aio.ServerInterceptor``) run
    on every call. The same port serves ``grpc.health.v1`` (SERVING for the overall server ""
    and for ``remote_partitioner.v1.RemotePartitioner``; see :meth:`Server.set_health` and
    :meth:`Server.enter_graceful_shutdown`) and server reflection listing every service. Hook
    responses are cached in ``result_cache`` (default: a 256 MiB one; ``ResultCache(0)`` turns
    it off). ``io_threads`` threads hash, store and read blobs. ``backends`` are the backends
    ``Preprocess`` runs (default: the built-in ones and plugins), ``quantizers`` the quantizers
    ``Quantize`` runs (default: the built-in ones and plugins). ``environment`` names the
    server's environment and its peers (default: the default environment, alone): calls whose
    ``x-remote-partitioner-environment`` header names another environment are refused
    (``WRONG_ENVIRONMENT``), and ``ListPartitioners`` lists the peers' entries too (see
    :mod:`~remote_partitioner.server.environments`).

    The port is the server's alone: an address another socket holds is refused, whatever
    options that socket set (gRPC sets ``SO_REUSEPORT`` by default, which would let two
    servers split the connections and a forgotten one answer some calls). ``share_port=True``
    sets ``SO_REUSEPORT``, so that sibling processes that all set it serve one port (``serve
    --workers``).

    Raises:
        BindError: the address cannot be bound (a ``RuntimeError``).
        RuntimeError: the server could not be built otherwise.
    """
    instance = PartitionerInstance(
        registry if registry is not None else default_registry(),
        blob_store if blob_store is not None else BlobStore(),
        limits,
        result_cache if result_cache is not None else ResultCache(versions=versions_key()),
        backends,
        quantizers if quantizers is not None else default_quantizers(),
    )
    handle = Server()
    environment = environment if environment is not None else Environment()

    async def build() -> tuple[grpc.aio.Server, int]:
        # Innermost: request bytes that do not parse end INTERNAL after the other interceptors
        # (authentication first; observability records the call).
        server = grpc.aio.server(
            options=[*SERVER_OPTIONS, ("grpc.so_reuseport", int(share_port))],
            interceptors=[*interceptors, EnvironmentInterceptor(environment.name),
                          UnparsableRequestInterceptor()],
        )
        servicer = RemotePartitionerServicer(
            instance, io_threads=io_threads, environment=environment
        )
        pb_grpc.add_RemotePartitionerServicer_to_server(servicer, server)
        health_servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        try:
            if credentials is not None:
                port = server.add_secure_port(address, credentials)
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as e:  # grpcio's "Failed to bind to address ..."
            raise BindError(str(e)) from e
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        handle.servicer, handle.health = servicer, health_servicer
        return server, port

    try:
        return handle, handle.bind(build)
    except BindError as e:
        raise BindError(f"cannot bind {address}: {e}") from e


__all__ = [
    "MAX_MESSAGE_BYTES",
    "SERVER_OPTIONS",
    "SERVICE_NAME",
    "BindError",
    "Server",
    "create_server",
]

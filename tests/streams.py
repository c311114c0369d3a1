"""Streams held open and idle against a server, from an event loop in a thread of its own:
what the load tests and the load benchmark (bench/load.py) do to a server (tests/ is on
sys.path for both)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

MIB = 1 << 20
#: Streams per channel (HTTP/2 lets a client open many; a few channels spread them).
STREAMS_PER_CHANNEL = 64


class StalledStreams:
    """``count`` streams held open against ``target`` from an event loop in a thread of its own.

    ``kind`` "upload": each stream declares a blob of ``blob_bytes`` and sends its first KiB,
    then nothing. ``kind`` "read": each stream asks for ``digest`` and never reads a message.
    """

    def __init__(self, target: str, count: int, kind: str, *, blob_bytes: int = 8 * MIB,
                 digest: pb.Digest | None = None) -> None:
        self.target, self.count, self.kind = target, count, kind
        self.blob_bytes, self.digest = blob_bytes, digest
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._channels: list[grpc.aio.Channel] = []
        self._calls: list[Any] = []

    def _run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self) -> None:
        for i in range(self.count):
            if i % STREAMS_PER_CHANNEL == 0:
                self._channels.append(grpc.aio.insecure_channel(self.target))
            stub = pb_grpc.RemotePartitionerStub(self._channels[-1])
            if self.kind == "upload":
                call = stub.UploadBlobs()
                # A distinct blob per stream, so that each one reserves its own bytes.
                declared = pb.Digest(hash=f"{i:064x}", size_bytes=self.blob_bytes)
                first = pb.UploadBlobsRequest(digest=declared, offset=0, data=b"\0" * 1024)
                await call.write(first)
            else:
                call = stub.ReadBlobs(pb.ReadBlobsRequest(digests=[self.digest]))
                await call.initial_metadata()
            self._calls.append(call)

    async def _close(self) -> None:
        for call in self._calls:
            call.cancel()
        for channel in self._channels:
            await channel.close()

    def __enter__(self) -> StalledStreams:
        self._thread.start()
        self._run(self._open(), timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._run(self._close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def done(self) -> int:
        """How many of the streams the server has ended."""
        return sum(1 for call in self._calls if call.done())

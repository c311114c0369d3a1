"""The gRPC servicer (``grpc.aio``): translates between v1 messages and plain Python, maps
errors to statuses, and keeps the event loop free.

Each method hands its request to :class:`~remote_partitioner.server.instance.PartitionerInstance`
and turns a :class:`~remote_partitioner.proto.errors.ServiceError` into a ``google.rpc.Status``
(:func:`~remote_partitioner.server.status.abort`); the server keeps serving after each.

I/O model. RPC I/O runs on one asyncio event loop, so an open stream, idle or slow, costs
memory, not a thread. Work that can take long runs on executors, never on the loop:

* hook calls and lowerings on a pool of ``limits.max_concurrent_hooks`` threads, after
  admission (OVERLOADED beyond it); they then take the process's one hook turn in order;
* hashing, storing and looking up blobs on a small I/O pool.

Streams are bounded: an upload reserves each blob's declared size against
``limits.max_inflight_bytes`` (OVERLOADED with RetryInfo past it), and a stream with no
message in either direction for ``limits.stream_idle_seconds`` ends with DEADLINE_EXCEEDED
(``STREAM_IDLE``), its partial blob discarded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import grpc

from remote_partitioner.proto.errors import BLOB_DIGEST, Reason, ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server import lower_call
from remote_partitioner.server.blobstore import BlobView
from remote_partitioner.server.environments import Environment, merge_listings
from remote_partitioner.server.instance import PartitionerInstance, TimeRemaining, chunks
from remote_partitioner.server.status import abort

_T = TypeVar("_T")


class StreamStats:
    """Open streams and upload bytes in flight, for the metrics gauges (read from any
    thread)."""

    def __init__(self, instance: PartitionerInstance) -> None:
        self._instance = instance
        self.open_streams = 0

    @property
    def inflight_bytes(self) -> int:
        """Declared bytes of the blobs being uploaded now."""
        return self._instance.inflight.used


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a background future's outcome as seen (its error is raised where it is awaited,
    or dropped with a stream that ended for another reason)."""
    if not future.cancelled():
        future.exception()


def _time_remaining(context: grpc.aio.ServicerContext) -> TimeRemaining:
    """The call's remaining time as a function any thread may call (the context itself is
    read on the event loop only)."""
    remaining = context.time_remaining()
    if remaining is None:
        return lambda: None
    deadline = time.monotonic() + remaining
    return lambda: deadline - time.monotonic()


class RemotePartitionerServicer(pb_grpc.RemotePartitionerServicer):
    """Implements ``remote_partitioner.v1.RemotePartitioner`` over a
    :class:`PartitionerInstance` on a ``grpc.aio`` server.

    Args:
        instance: the service's logic.
        io_threads: threads of the pool that hashes, stores and looks up blobs.
    """

    def __init__(
        self, instance: PartitionerInstance, *, io_threads: int = 4,
        environment: Environment | None = None,
    ) -> None:
        self.instance = instance
        self.environment = environment if environment is not None else Environment()
        limits = instance.limits
        self.idle_seconds = limits.stream_idle_seconds
        self._hooks = concurrent.futures.ThreadPoolExecutor(
            limits.max_concurrent_hooks, thread_name_prefix="hook"
        )
        self._io = concurrent.futures.ThreadPoolExecutor(io_threads, thread_name_prefix="blob-io")
        self.streams = StreamStats(instance)

    def shutdown(self) -> None:
        """Stop the executors (work in progress finishes; nothing new starts)."""
        self._hooks.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ plumbing

    async def _off_loop(
        self, pool: concurrent.futures.Executor, fn: Callable[..., _T], *args: Any,
        release: Callable[[], None] | None = None,
    ) -> _T:
        """``fn(*args)`` on ``pool`` with this call's context variables (the request id).

        ``release`` runs once the work is over: when ``fn`` returns or raises, or when it is
        cancelled before it started, never while it still runs (a cancelled call's thread
        finishes its work before its admission ends).
        """
        ctx = contextvars.copy_context()
        future = pool.submit(ctx.run, fn, *args)
        if release is not None:
            future.add_done_callback(lambda _: release())
        return await asyncio.wrap_future(future)

    async def _run(
        self, context: grpc.aio.ServicerContext, pool: concurrent.futures.Executor,
        fn: Callable[..., _T], *args: Any,
    ) -> _T:
        try:
            return await self._off_loop(pool, fn, *args)
        except ServiceError as e:
            await abort(context, e)

    async def _admitted(
        self, context: grpc.aio.ServicerContext, fn: Callable[[Any, TimeRemaining], _T],
        request: Any,
    ) -> _T:
        """Admit a hook call or lowering, then run it on the hook pool."""
        try:
            release = self.instance.admit()
            return await self._off_loop(
                self._hooks, fn, request, _time_remaining(context), release=release
            )
        except ServiceError as e:
            await abort(context, e)

    async def _read(
        self, requests: AsyncIterator[_T], on_idle: Callable[[], ServiceError]
    ) -> AsyncIterator[_T]:
        """``requests``, each within ``idle_seconds`` of the previous one (else ``on_idle()``
        is raised)."""
        it = aiter(requests)
        while True:
            try:
                item = await asyncio.wait_for(anext(it), self.idle_seconds)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise on_idle() from None
            yield item

    async def _write_all(
        self, context: grpc.aio.ServicerContext, messages: Iterator[Any], what: str
    ) -> None:
        """Send ``messages``, each taken by the client within ``idle_seconds``."""
        for message in messages:
            try:
                await asyncio.wait_for(context.write(message), self.idle_seconds)
            except asyncio.TimeoutError:
                await abort(context, ServiceError(
                    Reason.STREAM_IDLE,
                    f"the client took no {what} message for {self.idle_seconds:g} s; the "
                    "stream was cancelled",
                ))

    # ------------------------------------------------------------------ discovery

    async def ListPartitioners(
        self, request: pb.ListPartitionersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPartitionersResponse:
        own = await self._run(context, self._io, self.instance.list_partitioners)
        return await merge_listings(own, self.environment, context.invocation_metadata() or ())

    # ------------------------------------------------------------------ blobs

    async def FindMissingBlobs(
        self, request: pb.FindMissingBlobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindMissingBlobsResponse:
        return await self._run(context, self._io, self.instance.find_missing_blobs, request)

    async def UploadBlobs(
        self, request_iterator: AsyncIterator[pb.UploadBlobsRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.UploadBlobsResponse:
        assembly = self.instance.upload()

        def idle() -> ServiceError:
            pending = assembly.pending
            where = (
                f"; {assembly.pending_bytes} of {pending.size_bytes} bytes of blob "
                f"{pending.hash} were discarded" if pending is not None else ""
            )
            return ServiceError(
                Reason.STREAM_IDLE,
                f"no upload chunk for {self.idle_seconds:g} s; the stream was cancelled{where}",
                {BLOB_DIGEST: pending.hash} if pending is not None else None,
            )

        # A completed blob is verified (hashed) off the loop while the next one arrives, one
        # at a time per stream: blobs are committed in stream order, and a stream holds at
        # most one completed blob beyond its in-flight reservation.
        verifying: asyncio.Future[None] | None = None
        self.streams.open_streams += 1
        try:
            async for chunk in self._read(request_iterator, idle):
                complete = assembly.feed(chunk)
                if complete is not None:
                    if verifying is not None:
                        try:
                            await verifying
                        except BaseException:
                            complete.data.close()  # (never to be committed)
                            raise
                    verifying = asyncio.ensure_future(
                        self._off_loop(self._io, assembly.commit, complete)
                    )
                    verifying.add_done_callback(_retrieve)
                elif verifying is not None and verifying.done():
                    await verifying  # a mismatch ends the stream as soon as it is known
                    verifying = None
            if verifying is not None:
                await verifying
            return assembly.finish()
        except ServiceError as e:
            await abort(context, e)
        finally:
            assembly.discard()
            self.streams.open_streams -= 1

    async def ReadBlobs(
        self, request: pb.ReadBlobsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        self.streams.open_streams += 1
        try:
            responses = self.instance.read_blobs(request)
            while True:
                # Each blob is looked up (and a file mapped) off the loop, chunk by chunk, so
                # that a slow reader holds one chunk, not its blob.
                chunk = await self._off_loop(self._io, next, responses, None)
                if chunk is None:
                    return
                await self._write_all(context, iter([chunk]), "ReadBlobs")
        except ServiceError as e:
            await abort(context, e)
        finally:
            self.streams.open_streams -= 1

    # ------------------------------------------------------------------ hooks

    async def Partition(
        self, request: pb.PartitionRequest, context: grpc.aio.ServicerContext
    ) -> pb.PartitionResponse:
        return await self._admitted(context, self.instance.partition, request)

    async def OpsToNotDecompose(
        self, request: pb.OpsToNotDecomposeRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpsToNotDecomposeResponse:
        return await self._admitted(context, self.instance.ops_to_not_decompose, request)

    async def TransformForPreDecomposition(
        self, request: pb.TransformForPreDecompositionRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransformForPreDecompositionResponse:
        return await self._admitted(
            context, self.instance.transform_for_pre_decomposition, request
        )

    async def Preprocess(
        self, request: pb.PreprocessRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreprocessResponse:
        return await self._admitted(context, self.instance.preprocess, request)

    async def Quantize(
        self, request: pb.QuantizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.QuantizeResponse:
        return await self._admitted(context, self.instance.quantize, request)

    # ------------------------------------------------------------------ whole lowering

    async def Lower(self, request: pb.LowerRequest, context: grpc.aio.ServicerContext) -> None:
        lowered = await self._admitted(context, self.instance.lower, request)
        # A repeat is answered from this one from now on; it is stored once the answer is
        # sent (or the client has gone), without keeping the call open meanwhile.
        lower_call.being_stored(self.instance, lowered)
        self.streams.open_streams += 1
        try:
            first = pb.LowerResponse(report=lowered.report)
            if lowered.pte_digest is not None:
                first.pte.CopyFrom(lowered.pte_digest)
            await self._write_all(context, iter([first]), "Lower")
            if lowered.pte is not None and lower_call.sends_pte(request, lowered):
                await self._write_all(context, _lower_chunks(lowered.pte), "Lower")
        finally:
            self.streams.open_streams -= 1
            lower_call.remember_in_background(self.instance, lowered, self._io.submit)


def _lower_chunks(pte: BlobView | bytes) -> Iterator[pb.LowerResponse]:
    offset = 0
    for piece in chunks(pte):
        yield pb.LowerResponse(offset=offset, data=piece)
        offset += len(piece)


__all__ = ["RemotePartitionerServicer", "StreamStats"]

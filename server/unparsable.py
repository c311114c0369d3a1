"""Request bytes that do not parse: ``INTERNAL`` naming the method and the message type.

grpc.aio answers a request whose bytes its deserializer cannot parse with ``UNKNOWN``
("Unexpected <class 'DecodeError'>"), which tells the client nothing. gRPC's convention, kept by
grpcio's synchronous server, grpc-go and grpc-java, is ``INTERNAL`` ("Error parsing request
proto"). :class:`UnparsableRequestInterceptor` restores it for every method of every service on
the server, unary or streaming, first message or later:

* the handler's ``request_deserializer`` is wrapped so that it never raises: bytes that do not
  parse become an :class:`Unparsable` standing in for the message;
* the handler is wrapped so that, on meeting an :class:`Unparsable` (the request of a unary-request
  call, or any message of a request stream, when the handler reads it), it aborts the call with
  ``INTERNAL`` and a ``google.rpc.Status`` whose ``ErrorInfo`` has reason
  ``UNPARSABLE_REQUEST`` and metadata ``method`` and ``message_type``.

The handler never sees an :class:`Unparsable`; what it did before (blobs completed earlier on an
upload stream) stands, and what was partial is discarded as for any aborted stream. Put this
interceptor innermost (last in the server's list): interceptors before it (authentication)
answer first, and the observability interceptor records the call with its ``INTERNAL``, its
bytes (``Unparsable.ByteSize``) and its access line.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from remote_partitioner.proto.errors import Reason, ServiceError
from remote_partitioner.server.handlers import rewrap
from remote_partitioner.server.status import abort

#: ``ErrorInfo.metadata`` keys of an ``UNPARSABLE_REQUEST`` status.
METHOD_KEY = "method"
MESSAGE_TYPE_KEY = "message_type"


class Unparsable:
    """Stands in for a request message whose bytes did not parse.

    Attributes:
        method: the full method name, e.g. ``/remote_partitioner.v1.RemotePartitioner/Partition``.
        message_type: the message type the bytes were parsed as, e.g.
            ``remote_partitioner.v1.PartitionRequest``.
        size: how many bytes were received.
        error: the parser's message.
    """

    __slots__ = ("error", "message_type", "method", "size")

    def __init__(self, method: str, message_type: str, size: int, error: str) -> None:
        self.method = method
        self.message_type = message_type
        self.size = size
        self.error = error

    def ByteSize(self) -> int:
        """The received size, as a message's serialized size (what metrics count)."""
        return self.size

    def service_error(self) -> ServiceError:
        """The error the call ends with."""
        return ServiceError(
            Reason.UNPARSABLE_REQUEST,
            f"{self.method}: the request ({self.size} bytes) does not parse as a "
            f"{self.message_type} message: {self.error}",
            {METHOD_KEY: self.method, MESSAGE_TYPE_KEY: self.message_type},
        )


def message_type_of(deserializer: Callable[[bytes], Any]) -> str:
    """The full protobuf name of the message ``deserializer`` (a message class's ``FromString``)
    parses; its qualified name when it is some other callable."""
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    full_name = getattr(descriptor, "full_name", None)
    if isinstance(full_name, str):
        return full_name
    return str(getattr(deserializer, "__qualname__", repr(deserializer)))


def _tolerant(
    deserializer: Callable[[bytes], Any], method: str
) -> Callable[[bytes], Any]:
    message_type = message_type_of(deserializer)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # DecodeError, or whatever a custom deserializer raises
            return Unparsable(method, message_type, len(data), str(e) or type(e).__name__)

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext, request: Unparsable) -> NoReturn:
    await abort(context, request.service_error())


async def _checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Unparsable):
            await _refuse(context, request)
        yield request


def _guarded(behavior: Callable[..., Any], streaming_in: bool) -> Callable[..., Any]:
    """``behavior``, of the same kind (async generator function or not), refusing an
    :class:`Unparsable` request before the handler sees it."""

    def request_of(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _checked(request, context) if streaming_in else request

    if inspect.isasyncgenfunction(behavior):

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Unparsable):
                await _refuse(context, request)
            async for response in behavior(request_of(request, context), context):
                yield response

        return streamed

    async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unparsable):
            await _refuse(context, request)
        response = behavior(request_of(request, context), context)
        if inspect.isawaitable(response):
            response = await response
        return response

    return awaited


class UnparsableRequestInterceptor(grpc.aio.ServerInterceptor):
    """Answers request bytes that do not parse with ``INTERNAL`` (see the module docstring)."""

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = str(handler_call_details.method)  # type: ignore[attr-defined]
        return rewrap(
            handler, _guarded,
            request_deserializer=_tolerant(handler.request_deserializer, method),
        )


__all__ = [
    "MESSAGE_TYPE_KEY",
    "METHOD_KEY",
    "Unparsable",
    "UnparsableRequestInterceptor",
    "message_type_of",
]

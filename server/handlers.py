"""Rebuilding a gRPC method handler around a new behavior, whatever its kind.

The server's interceptors (:mod:`~remote_partitioner.server.observability`,
:mod:`~remote_partitioner.server.unparsable`) wrap the behavior of the handler the next
interceptor returns; :func:`rewrap` is the one place that knows the four kinds of
``grpc.RpcMethodHandler`` and rebuilds one of the same kind; :func:`rejecting_handler` builds
one of a handler's kind that ends every call with a given status (the token check, the
environment check).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

logger = logging.getLogger(__name__)

#: ``wrap(behavior, streaming_in)`` -> the new behavior; ``streaming_in`` is True when the
#: request is a stream (the behavior's first argument is an async iterator of messages).
Wrap = Callable[[Callable[..., Any], bool], Callable[..., Any]]


def rewrap(
    handler: grpc.RpcMethodHandler, wrap: Wrap,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind whose behavior is ``wrap(behavior, streaming_in)``, with
    ``handler``'s response serializer and ``request_deserializer`` (default: ``handler``'s).
    A handler with no behavior is returned as it is."""
    kinds: list[tuple[Any, Callable[..., Any], bool]] = [
        (handler.unary_unary, grpc.unary_unary_rpc_method_handler, False),
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler, False),
        (handler.stream_unary, grpc.stream_unary_rpc_method_handler, True),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler, True),
    ]
    for behavior, make, streaming_in in kinds:
        if behavior is not None:
            return make(  # type: ignore[no-any-return]
                wrap(behavior, streaming_in),
                request_deserializer=(
                    request_deserializer if request_deserializer is not None
                    else handler.request_deserializer
                ),
                response_serializer=handler.response_serializer,
            )
    return handler


def rejecting_handler(
    handler: grpc.RpcMethodHandler | None, method: str, status: grpc.Status
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind (unary-unary if unknown) that ends the call with
    ``status``; it takes the request as raw bytes, so nothing is deserialized."""

    async def reject(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        logger.warning(
            "rejected %s from %s: %s", method, context.peer(), status.code.name  # type: ignore[attr-defined]
        )
        await context.abort(status.code, status.details, status.trailing_metadata)  # type: ignore[attr-defined]
        raise AssertionError("abort returned")  # pragma: no cover

    request_streaming = bool(handler is not None and handler.request_streaming)
    response_streaming = bool(handler is not None and handler.response_streaming)
    if request_streaming and response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject)
    if request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject)
    if response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject)
    return grpc.unary_unary_rpc_method_handler(reject)


__all__ = ["Wrap", "rejecting_handler", "rewrap"]

"""Error statuses: a ``google.rpc.Status`` with an ``ErrorInfo`` and optional further details.

Every error the server returns is a :class:`~remote_partitioner.proto.errors.ServiceError`
turned into a status by :func:`make_status`, so each carries ``ErrorInfo(domain=
"remote-partitioner", reason=...)`` and, where they help, a ``BadRequest`` field violation and
a ``RetryInfo``.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from remote_partitioner.proto.errors import DOMAIN, ServiceError

#: Longest status message sent (the message travels in a trailer, twice).
MAX_MESSAGE_CHARS = 2000


def bad_request(field: str, description: str) -> error_details_pb2.BadRequest:
    """A ``BadRequest`` with one field violation."""
    return error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
        ]
    )


def retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    """A ``RetryInfo`` asking the client to wait ``seconds`` before retrying."""
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(int(seconds * 1000))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def make_status(error: ServiceError) -> grpc.Status:
    """The status for ``error``: its code (:data:`STATUS_CODES`), its message, an ``ErrorInfo``
    (reason, info) and, where set, a ``BadRequest`` naming its field and a ``RetryInfo``.

    The message is made valid UTF-8 and cut to :data:`MAX_MESSAGE_CHARS`, so that the trailers
    fit gRPC's default metadata limits; ``info`` carries the full text where one is needed.
    """
    message = error.message.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "... (cut)"
    info = {
        k: v.encode("utf-8", "backslashreplace").decode("utf-8") for k, v in error.info.items()
    }
    details: list[Message] = [
        error_details_pb2.ErrorInfo(reason=error.reason.value, domain=DOMAIN, metadata=info)
    ]
    if error.field is not None:
        details.append(bad_request(error.field, message))
    if error.retry_after is not None:
        details.append(retry_info(error.retry_after))
    packed = []
    for detail in details:
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)
        packed.append(any_detail)
    return rpc_status.to_status(
        status_pb2.Status(code=getattr(code_pb2, error.code.name), message=message, details=packed)
    )


async def abort(context: grpc.aio.ServicerContext, error: ServiceError) -> NoReturn:
    """End the call of ``context`` with :func:`make_status` of ``error`` (grpc.aio sends the
    status inside ``abort``, which then raises)."""
    status = make_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)  # type: ignore[attr-defined]
    raise AssertionError("abort returned")  # pragma: no cover

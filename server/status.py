"""Error statuses: a ``google.rpc.Status`` with an ``ErrorInfo`` and optional further details.

Every error the server returns goes through :func:`make_status` (or :func:`abort`), so each
carries ``ErrorInfo(domain="remote-partitioner", reason=...)`` and, where they help,
``BadRequest`` field violations and ``RetryInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from remote_partitioner.proto.errors import DOMAIN, Reason

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


def make_status(
    code: grpc.StatusCode,
    reason: Reason | str,
    message: str,
    info: Mapping[str, str] | None = None,
    details: Sequence[Message] = (),
) -> grpc.Status:
    """The status for ``code`` with an ``ErrorInfo`` (``reason``, ``info``) and ``details``.

    The message is made valid UTF-8 and cut to :data:`MAX_MESSAGE_CHARS`, so that the trailers
    fit gRPC's default metadata limits; ``info`` carries the full text where one is needed.
    """
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "... (cut)"
    info = {
        k: v.encode("utf-8", "backslashreplace").decode("utf-8") for k, v in (info or {}).items()
    }
    packed = []
    for detail in (
        error_details_pb2.ErrorInfo(
            reason=reason.value if isinstance(reason, Reason) else reason,
            domain=DOMAIN,
            metadata=info,
        ),
        *details,
    ):
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)
        packed.append(any_detail)
    return rpc_status.to_status(
        status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=packed)
    )


def abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    reason: Reason | str,
    message: str,
    info: Mapping[str, str] | None = None,
    details: Sequence[Message] = (),
) -> NoReturn:
    """End the call with :func:`make_status`; never returns."""
    context.abort_with_status(make_status(code, reason, message, info, details))
    raise AssertionError("abort_with_status returned")  # pragma: no cover

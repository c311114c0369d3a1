"""Error vocabulary of the v1 contract: the ``google.rpc.ErrorInfo`` domain, the reasons, the
one table from reason to gRPC status code, and the typed error the server's plain-Python layer
raises.

Both sides import this module: the server to attach ``ErrorInfo`` to a ``google.rpc.Status``,
the client to read it back. Reasons are stable strings; clients may switch on them. Each reason
is sent with exactly one status code, :data:`STATUS_CODES`; the servicer, the interceptors and
the tests all read that table, so it is the one place the mapping is written.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

import grpc

DOMAIN = "remote-partitioner"


class Reason(str, enum.Enum):
    """The ``ErrorInfo.reason`` values the service sends (codes: :data:`STATUS_CODES`)."""

    INVALID_DIGEST = "INVALID_DIGEST"
    BAD_CHUNK = "BAD_CHUNK"
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    INCOMPLETE_BLOB = "INCOMPLETE_BLOB"
    BLOB_NOT_FOUND = "BLOB_NOT_FOUND"
    UNKNOWN_PARTITIONER = "UNKNOWN_PARTITIONER"
    INVALID_SPEC = "INVALID_SPEC"
    INVALID_PROGRAM = "INVALID_PROGRAM"
    PARTITIONER_RAISED = "PARTITIONER_RAISED"
    BLOB_MISSING = "BLOB_MISSING"
    FINGERPRINT_MISMATCH = "FINGERPRINT_MISMATCH"
    SIZE_MISMATCH = "SIZE_MISMATCH"
    UNREPRESENTABLE_RESULT = "UNREPRESENTABLE_RESULT"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    #: A configured bound on one request; retrying the same request fails again.
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    #: Too much work in progress now; a ``RetryInfo`` says when to try again.
    OVERLOADED = "OVERLOADED"
    #: The call's deadline passed before its work started.
    DEADLINE_PASSED = "DEADLINE_PASSED"
    #: A stream sent or took no message for longer than the server allows; it was cancelled
    #: and its partial blob discarded.
    STREAM_IDLE = "STREAM_IDLE"
    #: ``Preprocess`` named a backend id the server does not host; the message lists them.
    UNKNOWN_BACKEND = "UNKNOWN_BACKEND"
    #: A hook on a program with withheld tensors used one for more than its metadata: the
    #: client sends the program again with its tensors' data.
    TENSOR_DATA_REQUIRED = "TENSOR_DATA_REQUIRED"
    #: A request message's bytes do not parse as the method's request type (gRPC's
    #: convention: INTERNAL); metadata ``method`` and ``message_type`` name them.
    UNPARSABLE_REQUEST = "UNPARSABLE_REQUEST"
    #: ``Quantize`` named a quantizer the server does not host; the message lists them.
    UNKNOWN_QUANTIZER = "UNKNOWN_QUANTIZER"
    #: The call's ``x-remote-partitioner-environment`` header names another environment than
    #: the server's: the client reached a server directly, not the front door that routes by it.
    WRONG_ENVIRONMENT = "WRONG_ENVIRONMENT"


_C = grpc.StatusCode

#: The status code each reason is sent with; one code per reason.
STATUS_CODES: Mapping[Reason, grpc.StatusCode] = MappingProxyType(
    {
        Reason.INVALID_DIGEST: _C.INVALID_ARGUMENT,
        Reason.BAD_CHUNK: _C.INVALID_ARGUMENT,
        Reason.DIGEST_MISMATCH: _C.DATA_LOSS,
        Reason.INCOMPLETE_BLOB: _C.DATA_LOSS,
        Reason.BLOB_NOT_FOUND: _C.NOT_FOUND,
        Reason.UNKNOWN_PARTITIONER: _C.NOT_FOUND,
        Reason.INVALID_SPEC: _C.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM: _C.INVALID_ARGUMENT,
        Reason.PARTITIONER_RAISED: _C.INVALID_ARGUMENT,
        Reason.BLOB_MISSING: _C.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH: _C.FAILED_PRECONDITION,
        Reason.SIZE_MISMATCH: _C.DATA_LOSS,
        Reason.UNREPRESENTABLE_RESULT: _C.INTERNAL,
        Reason.UNAUTHENTICATED: _C.UNAUTHENTICATED,
        Reason.PERMISSION_DENIED: _C.PERMISSION_DENIED,
        Reason.LIMIT_EXCEEDED: _C.RESOURCE_EXHAUSTED,
        Reason.OVERLOADED: _C.RESOURCE_EXHAUSTED,
        Reason.DEADLINE_PASSED: _C.DEADLINE_EXCEEDED,
        Reason.STREAM_IDLE: _C.DEADLINE_EXCEEDED,
        Reason.UNKNOWN_BACKEND: _C.NOT_FOUND,
        Reason.UNPARSABLE_REQUEST: _C.INTERNAL,
        Reason.TENSOR_DATA_REQUIRED: _C.FAILED_PRECONDITION,
        Reason.UNKNOWN_QUANTIZER: _C.NOT_FOUND,
        Reason.WRONG_ENVIRONMENT: _C.FAILED_PRECONDITION,
    }
)


class ServiceError(Exception):
    """A request the service refuses, in plain Python: the server's logic raises it and the
    servicer turns it into a ``google.rpc.Status`` (code from :data:`STATUS_CODES`).

    Attributes:
        reason: the ``ErrorInfo.reason``.
        message: the status message (a person reads it; it names what was wrong).
        info: ``ErrorInfo.metadata`` (see the keys below).
        field: when set, a ``BadRequest`` field violation names this request field.
        retry_after: when set, a ``RetryInfo`` asks the client to wait this many seconds.
    """

    def __init__(
        self,
        reason: Reason,
        message: str,
        info: Mapping[str, str] | None = None,
        *,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.info: dict[str, str] = dict(info or {})
        self.field = field
        self.retry_after = retry_after

    @property
    def code(self) -> grpc.StatusCode:
        """The status code this error is sent with."""
        return STATUS_CODES[self.reason]


# ErrorInfo.metadata keys of PARTITIONER_RAISED.
EXCEPTION_TYPE = "exception_type"
EXCEPTION_MESSAGE = "exception_message"
EXCEPTION_TRACEBACK = "traceback"
#: Present, as "true", when the exception was raised without arguments (see
#: ``RemoteException.without_arguments``).
EXCEPTION_WITHOUT_ARGUMENTS = "exception_without_arguments"
# ErrorInfo.metadata key naming the offending spec key (INVALID_SPEC) or blob (BLOB_*).
SPEC_KEY = "spec_key"
EXPECTED_TYPE = "expected_type"
BLOB_DIGEST = "digest"
# ErrorInfo.metadata keys of TENSOR_DATA_REQUIRED: the first withheld tensor a hook used, how.
TENSOR_NAME = "tensor"
TENSOR_USE = "operation"

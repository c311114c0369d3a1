"""Typed client exceptions, built from the ``google.rpc.Status`` the server returns."""

from __future__ import annotations

import builtins
import time

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from remote_partitioner.proto import errors


class RemotePartitionerError(Exception):
    """A call to the service failed. ``code`` is the gRPC status code, ``reason`` the
    ``ErrorInfo`` reason (empty if the server sent none), ``metadata`` its metadata."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})
        #: Seconds the server asked the client to wait before retrying (``RetryInfo``).
        self.retry_delay = retry_delay

    def wait_as_told(self) -> None:
        """Sleep for :attr:`retry_delay`, at most :data:`MAX_RETRY_DELAY_S` (nothing without
        one)."""
        if self.retry_delay is not None:
            time.sleep(min(self.retry_delay, MAX_RETRY_DELAY_S))


#: The longest a client waits, as a server's ``RetryInfo`` asks, before calling again.
MAX_RETRY_DELAY_S = 30.0


class PartitionerNotFoundError(RemotePartitionerError, KeyError):
    """The server hosts no partitioner of that name (NOT_FOUND)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class QuantizerNotFoundError(RemotePartitionerError, KeyError):
    """The server hosts no quantizer of that name (NOT_FOUND)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class InvalidSpecError(RemotePartitionerError, ValueError):
    """A spec key is unknown or has the wrong type (INVALID_ARGUMENT)."""


class FingerprintMismatchError(RemotePartitionerError):
    """The server rebuilt a program that differs from the client's (FAILED_PRECONDITION)."""


class IncompatibleServerError(RemotePartitionerError):
    """The server's torch / ExecuTorch / schema versions cannot reproduce a local lowering."""


class RemoteTraceback(Exception):
    """The server-side traceback of a remote exception, chained as its ``__cause__``."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def remote_exception(
    type_name: str, message: str, tb: str, without_arguments: bool = False
) -> BaseException:
    """The exception a hosted partitioner raised, rebuilt on the client.

    A built-in exception class is rebuilt as itself with the same message (with no arguments
    at all when it was raised without, ``without_arguments``), so callers see what the local
    partitioner would raise; any other class becomes a :class:`RemotePartitionerError` whose
    message starts with the remote class name. The remote traceback is the ``__cause__``.
    """
    cls = getattr(builtins, type_name, None)
    exc: BaseException
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, OSError):
        try:
            exc = cls() if without_arguments and not message else cls(message)
        except Exception:
            exc = RemotePartitionerError(f"{type_name}: {message}")
    else:
        exc = RemotePartitionerError(
            f"{type_name}: {message}", reason=errors.Reason.PARTITIONER_RAISED.value
        )
    exc.__cause__ = RemoteTraceback(tb)
    return exc


def from_rpc_error(e: grpc.RpcError) -> BaseException:
    """Turn a failed call into the typed exception its status and ``ErrorInfo`` describe."""
    code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (e.details() if isinstance(e, grpc.Call) else None) or str(e)
    reason, metadata = "", dict[str, str]()
    retry_delay: float | None = None
    try:
        status = rpc_status.from_call(e) if isinstance(e, grpc.Call) else None
    except ValueError:  # a status detail that does not match the call's code
        status = None
    if status is not None:
        for any_detail in status.details:
            if any_detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_detail.Unpack(info)
                if info.domain == errors.DOMAIN:
                    reason, metadata = info.reason, dict(info.metadata)
            elif any_detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                any_detail.Unpack(retry)
                retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
    if reason == errors.Reason.PARTITIONER_RAISED:
        return remote_exception(
            metadata.get(errors.EXCEPTION_TYPE, "Exception"),
            metadata.get(errors.EXCEPTION_MESSAGE, details),
            metadata.get(errors.EXCEPTION_TRACEBACK, ""),
            metadata.get(errors.EXCEPTION_WITHOUT_ARGUMENTS) == "true",
        )
    cls: type[RemotePartitionerError] = RemotePartitionerError
    if reason == errors.Reason.UNKNOWN_PARTITIONER:
        cls = PartitionerNotFoundError
    elif reason == errors.Reason.UNKNOWN_QUANTIZER:
        cls = QuantizerNotFoundError
    elif reason == errors.Reason.INVALID_SPEC:
        cls = InvalidSpecError
    elif reason == errors.Reason.FINGERPRINT_MISMATCH:
        cls = FingerprintMismatchError
    return cls(f"{code.name}: {details}", code, reason, metadata, retry_delay)

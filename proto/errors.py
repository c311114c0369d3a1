"""Error vocabulary of the v1 contract: the ``google.rpc.ErrorInfo`` domain and reasons.

Both sides import this module: the server to attach ``ErrorInfo`` to a ``google.rpc.Status``,
the client to read it back. Reasons are stable strings; clients may switch on them.
"""

from __future__ import annotations

import enum

DOMAIN = "remote-partitioner"


class Reason(str, enum.Enum):
    """The ``ErrorInfo.reason`` values the service sends, with their gRPC codes in comments."""

    INVALID_DIGEST = "INVALID_DIGEST"  # INVALID_ARGUMENT
    BAD_CHUNK = "BAD_CHUNK"  # INVALID_ARGUMENT
    DIGEST_MISMATCH = "DIGEST_MISMATCH"  # DATA_LOSS
    INCOMPLETE_BLOB = "INCOMPLETE_BLOB"  # DATA_LOSS
    BLOB_NOT_FOUND = "BLOB_NOT_FOUND"  # NOT_FOUND
    UNKNOWN_PARTITIONER = "UNKNOWN_PARTITIONER"  # NOT_FOUND
    INVALID_SPEC = "INVALID_SPEC"  # INVALID_ARGUMENT
    INVALID_PROGRAM = "INVALID_PROGRAM"  # INVALID_ARGUMENT
    PARTITIONER_RAISED = "PARTITIONER_RAISED"  # INVALID_ARGUMENT
    BLOB_MISSING = "BLOB_MISSING"  # FAILED_PRECONDITION
    FINGERPRINT_MISMATCH = "FINGERPRINT_MISMATCH"  # FAILED_PRECONDITION
    SIZE_MISMATCH = "SIZE_MISMATCH"  # DATA_LOSS
    UNREPRESENTABLE_RESULT = "UNREPRESENTABLE_RESULT"  # INTERNAL
    UNAUTHENTICATED = "UNAUTHENTICATED"  # UNAUTHENTICATED
    PERMISSION_DENIED = "PERMISSION_DENIED"  # PERMISSION_DENIED
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"  # RESOURCE_EXHAUSTED (a configured bound; retrying fails)
    OVERLOADED = "OVERLOADED"  # RESOURCE_EXHAUSTED (too many calls now; RetryInfo says when)
    DEADLINE_PASSED = "DEADLINE_PASSED"  # DEADLINE_EXCEEDED (the work was not started)


# ErrorInfo.metadata keys of PARTITIONER_RAISED.
EXCEPTION_TYPE = "exception_type"
EXCEPTION_MESSAGE = "exception_message"
EXCEPTION_TRACEBACK = "traceback"
# ErrorInfo.metadata key naming the offending spec key (INVALID_SPEC) or blob (BLOB_*).
SPEC_KEY = "spec_key"
EXPECTED_TYPE = "expected_type"
BLOB_DIGEST = "digest"

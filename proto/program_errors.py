"""The exceptions raised when a program cannot cross the wire, in either direction.

Both the codec (:mod:`remote_partitioner.proto.codec`) and the graph checks
(:mod:`remote_partitioner.proto.graph_check`) raise them, so they live here, importing neither:
the codec imports the graph checks, never the other way round. (The ``google.rpc.ErrorInfo``
reasons these map to on the wire are :mod:`remote_partitioner.proto.errors`.)
"""

from __future__ import annotations

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = [
    "BlobMissing",
    "BlobSizeMismatch",
    "CodecError",
    "FingerprintMismatch",
    "ProgramDecodeError",
    "ProgramEncodeError",
    "UnrepresentableMeta",
]


class CodecError(Exception):
    """Base class of the codec's errors."""


class ProgramEncodeError(CodecError):
    """The program holds something that cannot cross the wire (e.g. a custom object)."""


class ProgramDecodeError(CodecError):
    """The program message cannot be decoded into an ExportedProgram."""


class BlobMissing(CodecError):
    """A blob the program refers to is not available."""

    def __init__(self, digest: pb.Digest) -> None:
        super().__init__(f"blob {digest.hash}/{digest.size_bytes} is missing")
        self.digest = digest


class BlobSizeMismatch(ProgramDecodeError):
    """A blob's size differs from the size the program declares for it."""


class FingerprintMismatch(CodecError):
    """The rebuilt program's structure differs from the client's fingerprint."""


class UnrepresentableMeta(CodecError):
    """A node metadata value cannot be represented on the wire."""

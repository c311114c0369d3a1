"""Content addresses: the SHA-256 digest and size that name every blob (no torch needed)."""

from __future__ import annotations

import hashlib

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb


def digest_of(data: bytes | bytearray | memoryview) -> pb.Digest:
    """The SHA-256 digest and size of ``data``."""
    view = memoryview(data)
    return pb.Digest(hash=hashlib.sha256(view).hexdigest(), size_bytes=view.nbytes)

"""The interface of the server's blob stores (:class:`Blobs`), the types of the bytes they take
and serve (:data:`Blob`, :data:`BlobView`), their errors, and the digest checks every store
makes before it stores anything.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, TypeAlias

from remote_partitioner.server.blobstore.buffer import BlobBuffer

_HASH = re.compile(r"[0-9a-f]{64}")


#: A blob's bytes as a store takes them.
Blob: TypeAlias = bytes | bytearray | memoryview | BlobBuffer
#: A blob's bytes as a store serves them (format ``"B"``): immutable (``bytes``, a read-only
#: ``memoryview``), or writable and private to the caller (a copy-on-write mapping, a
#: ``bytearray`` of its own), so that the codec can build tensors on it without a copy.
BlobView: TypeAlias = bytes | bytearray | memoryview


class BlobError(Exception):
    """Base class of blob store errors."""


class InvalidDigest(BlobError):
    """A digest that is not 64 lowercase hex characters with a non-negative size."""


class DigestMismatch(BlobError):
    """Bytes that do not hash to, or do not have the size of, their declared digest."""


def check_digest(hash_: str, size: int) -> None:
    """Raise :class:`InvalidDigest` unless ``hash_``/``size`` is a well-formed digest."""
    if not _HASH.fullmatch(hash_):
        raise InvalidDigest(f"digest {hash_!r} is not 64 lowercase hexadecimal characters")
    if size < 0:
        raise InvalidDigest(f"digest {hash_}: negative size {size}")


def _byte_view(data: Blob) -> bytes | bytearray | memoryview:
    """``data`` itself, or for a memoryview a flat view of its bytes (format ``"B"``) without
    a copy when it is contiguous (a copy otherwise), or a :class:`BlobBuffer`'s view."""
    if isinstance(data, BlobBuffer):
        return data.view()
    if not isinstance(data, memoryview):
        return data
    if not data.c_contiguous:
        return data.tobytes()
    return data if data.format == "B" and data.ndim == 1 else data.cast("B")


def _verify(
    hash_: str, size: int, data: bytes | bytearray | memoryview, *, hashed: bool = False
) -> None:
    """Check a well-formed digest against ``data`` (its size only if ``hashed``); raise
    :class:`DigestMismatch` if it does not match."""
    check_digest(hash_, size)
    n = data.nbytes if isinstance(data, memoryview) else len(data)
    if n != size:
        raise DigestMismatch(f"blob {hash_}: received {n} bytes, declared {size}")
    if hashed:
        return
    actual = hashlib.sha256(data).hexdigest()
    if actual != hash_:
        raise DigestMismatch(f"blob declared as {hash_} hashes to {actual}")


class Blobs(Protocol):
    """What the servicer needs of a blob store. Implementations are thread-safe.

    * ``has(hash, size)``: whether the blob is held with that size; touches it (it becomes the
      most recently used).
    * ``get(hash)``: the blob's bytes (:data:`BlobView`: immutable, or writable and private
      to the caller, whose writes never reach the store), or None when it is not held (never
      bytes that do not hash to ``hash``); touches it.
    * ``put(hash, size, data, hashed=False)``: verify ``data`` (raise :class:`InvalidDigest`
      / :class:`DigestMismatch`, storing nothing) and store it; a blob already held is kept.
      ``hashed``: the caller computed ``hash`` from these very bytes itself (the server's own
      results), so only the digest's form and the size are checked.
    * ``nbytes`` / ``len()``: bytes and blobs held; ``max_bytes``: the bound past which the
      least recently used blobs are evicted. An evicted blob is simply missing: clients
      upload it again.
    """

    max_bytes: int

    @property
    def nbytes(self) -> int: ...

    def __len__(self) -> int: ...

    def has(self, hash_: str, size: int) -> bool: ...

    def get(self, hash_: str) -> BlobView | None: ...

    def put(self, hash_: str, size: int, data: Blob, *, hashed: bool = False) -> None: ...

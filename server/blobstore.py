"""The server's content-addressed blob store: verified bytes by SHA-256 digest, bounded, LRU."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict

_HASH = re.compile(r"[0-9a-f]{64}")


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


class BlobStore:
    """Verified blobs in memory, keyed by hash, least recently used evicted past ``max_bytes``.

    A blob larger than the whole store is still kept until the next insertion, so that the call
    that needs it can complete. An evicted blob is simply missing: callers ask for it again.
    """

    def __init__(self, max_bytes: int = 8 << 30) -> None:
        self.max_bytes = max_bytes
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blobs)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return self._bytes

    def has(self, hash_: str, size: int) -> bool:
        """Whether the blob is held (and touch it, so that it is not evicted next)."""
        with self._lock:
            data = self._blobs.get(hash_)
            if data is None or len(data) != size:
                return False
            self._blobs.move_to_end(hash_)
            return True

    def get(self, hash_: str) -> bytes | None:
        """The blob's bytes, or None when not held."""
        with self._lock:
            data = self._blobs.get(hash_)
            if data is not None:
                self._blobs.move_to_end(hash_)
            return data

    def put(self, hash_: str, size: int, data: bytes) -> None:
        """Verify ``data`` against the digest and store it.

        Raises:
            InvalidDigest: malformed digest.
            DigestMismatch: wrong size or hash; nothing is stored.
        """
        check_digest(hash_, size)
        if len(data) != size:
            raise DigestMismatch(f"blob {hash_}: received {len(data)} bytes, declared {size}")
        actual = hashlib.sha256(data).hexdigest()
        if actual != hash_:
            raise DigestMismatch(f"blob declared as {hash_} hashes to {actual}")
        with self._lock:
            if hash_ in self._blobs:
                self._blobs.move_to_end(hash_)
                return
            self._blobs[hash_] = data
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._blobs) > 1:
                _, old = self._blobs.popitem(last=False)
                self._bytes -= len(old)

"""The in-memory blob store (:class:`BlobStore`): one process's verified blobs, least recently
used evicted past a bound."""

from __future__ import annotations

import threading
from collections import OrderedDict

from remote_partitioner.server.blobstore.base import (
    Blob,
    BlobView,
    _byte_view,
    _verify,
)
from remote_partitioner.server.blobstore.buffer import BlobBuffer, _MemoryFile


class BlobStore:
    """Verified blobs in memory, keyed by hash, least recently used evicted past ``max_bytes``.

    A blob larger than the whole store is still kept until the next insertion, so that the call
    that needs it can complete. An evicted blob is simply missing: callers ask for it again.

    ``put`` stores the object it is given, without a copy (a non-contiguous memoryview is the
    one exception): the caller hands it over and must not modify a ``bytearray`` (or the object
    under a ``memoryview``) afterwards; a :class:`BlobBuffer` is taken (its memory file or
    ``bytearray``; the caller still closes it). ``get`` serves ``bytes`` as they are, a memory
    file as a private copy-on-write mapping, and anything else as a read-only ``memoryview``,
    so that no caller can change a stored blob.
    """

    def __init__(self, max_bytes: int = 8 << 30) -> None:
        self.max_bytes = max_bytes
        self._blobs: OrderedDict[str, bytes | bytearray | memoryview | _MemoryFile] = (
            OrderedDict()
        )
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
            if data is None or _size(data) != size:
                return False
            self._blobs.move_to_end(hash_)
            return True

    def get(self, hash_: str) -> BlobView | None:
        """The blob's bytes (``bytes``, a private mapping of its memory file, or a read-only
        memoryview), or None when not held."""
        with self._lock:
            data = self._blobs.get(hash_)
            if data is None:
                return None
            self._blobs.move_to_end(hash_)
        if isinstance(data, _MemoryFile):
            return data.view()
        return data if isinstance(data, bytes) else memoryview(data).toreadonly()

    def put(self, hash_: str, size: int, data: Blob, *, hashed: bool = False) -> None:
        """Verify ``data`` against the digest (its size only, if ``hashed``: see
        :class:`Blobs`) and store it (the object itself, no copy).

        Raises:
            InvalidDigest: malformed digest.
            DigestMismatch: wrong size or hash; nothing is stored.
        """
        flat = _byte_view(data)
        _verify(hash_, size, flat, hashed=hashed)
        with self._lock:
            if hash_ in self._blobs:
                self._blobs.move_to_end(hash_)
                return
            stored: bytes | bytearray | memoryview | _MemoryFile = flat
            if isinstance(data, BlobBuffer):
                assert isinstance(flat, memoryview)
                flat.release()
                stored = data.take()
            self._blobs[hash_] = stored
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._blobs) > 1:
                _, old = self._blobs.popitem(last=False)
                self._bytes -= _size(old)


def _size(data: bytes | bytearray | memoryview | _MemoryFile) -> int:
    return data.nbytes if isinstance(data, (memoryview, _MemoryFile)) else len(data)

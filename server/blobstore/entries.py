"""Entries by key in a directory (:class:`DirEntryStore`): the blob directory's files, sharing,
recency and eviction, for bytes named by a key rather than by their own digest.

The result cache keeps its entries here (``<blob dir>/results``), so that a restarted server
and every replica that shares the blob directory answer from each other's results.
"""

from __future__ import annotations

import hashlib
import os

from remote_partitioner.server.blobstore.base import BlobView, DigestMismatch, check_digest
from remote_partitioner.server.blobstore.directory import DirBlobStore

_CHECKSUM_BYTES = 32  # SHA-256 of the payload, before it in the file


class DirEntryStore(DirBlobStore):
    """Opaque entries named by 64-hex-character keys, as files under ``directory``.

    Everything :class:`DirBlobStore` says of its files holds (atomic publication, sharing by
    processes and hosts through the file system only, recency, eviction past ``max_bytes``),
    except what a file must hold: entry ``key`` is the file ``<directory>/<key[:2]>/<key>``
    holding the SHA-256 of the payload followed by the payload. A file whose payload does not
    match its checksum (truncated, corrupted) is deleted and reported missing, never served.

    An entry is written once: a second :meth:`put_entry` under a key already held keeps the
    first (entries are deterministic functions of their key: any writer's is as good).
    Files are read into memory, not mapped (entries are small), and evicted files are
    deleted at once.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int, **kwargs: object) -> None:
        kwargs.setdefault("use_mmap", False)
        kwargs.setdefault("evict_grace", 0.0)
        super().__init__(directory, max_bytes, **kwargs)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"DirEntryStore({self.directory!r}, max_bytes={self.max_bytes})"

    def get_entry(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (not held, evicted, or not intact)."""
        data = self.get(key)
        if data is None:
            return None
        return bytes(memoryview(data)[_CHECKSUM_BYTES:])

    def put_entry(self, key: str, payload: bytes) -> None:
        """Store ``payload`` under ``key`` (kept as it is if an entry is already held).

        Raises:
            InvalidDigest: ``key`` is not 64 lowercase hexadecimal characters.
            OSError: the file cannot be written.
        """
        check_digest(key, 0)
        framed = hashlib.sha256(payload).digest() + payload
        self.put(key, len(framed), framed, hashed=True)

    def _content_matches(self, hash_: str, data: BlobView) -> bool:
        view = memoryview(data)
        return (
            view.nbytes >= _CHECKSUM_BYTES
            and hashlib.sha256(view[_CHECKSUM_BYTES:]).digest() == view[:_CHECKSUM_BYTES]
        )

    def _verify_put(
        self, hash_: str, size: int, data: bytes | bytearray | memoryview, *, hashed: bool
    ) -> None:
        check_digest(hash_, size)
        if len(data) != size:
            raise DigestMismatch(f"entry {hash_}: received {len(data)} bytes, declared {size}")
        if not hashed and not self._content_matches(hash_, memoryview(data)):
            raise DigestMismatch(f"entry {hash_}: its payload does not match its checksum")


__all__ = ["DirEntryStore"]

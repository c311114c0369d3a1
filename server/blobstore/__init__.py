"""The server's content-addressed blob stores: verified bytes by SHA-256 digest, bounded, LRU.

Two implementations of one interface (:class:`Blobs`):

* :class:`BlobStore` keeps blobs in this process's memory: a blob of at least
  :data:`MEMORY_FILE_MIN_BYTES` received as a :class:`BlobBuffer` stays in the anonymous memory
  file (``memfd_create``) it was written to, and each ``get`` maps that file privately
  (copy-on-write), so that programs are decoded on the stored bytes without a copy and a
  tensor written to never changes the store.
* :class:`DirBlobStore` keeps them as files in a directory that several server processes, and
  several replicas mounting one ReadWriteMany volume, share: a blob uploaded to any of them is
  found by all of them.

:func:`open_blob_store` builds the one a server's configuration asks for.

The package holds one module per job, storage behind one interface with one module per
backend: :mod:`.base` (the interface :class:`Blobs`, the blob types, digest checks and
errors), :mod:`.buffer` (:class:`BlobBuffer` and the anonymous memory files it fills),
:mod:`.memory` (:class:`BlobStore`) and :mod:`.directory` (:class:`DirBlobStore`). Every name
is imported from the package itself: ``from remote_partitioner.server.blobstore import X``.
"""

from __future__ import annotations

from remote_partitioner.server.blobstore.base import (
    Blob,
    BlobError,
    Blobs,
    BlobView,
    DigestMismatch,
    InvalidDigest,
    check_digest,
)
from remote_partitioner.server.blobstore.buffer import MEMORY_FILE_MIN_BYTES, BlobBuffer
from remote_partitioner.server.blobstore.directory import DirBlobStore
from remote_partitioner.server.blobstore.memory import BlobStore


def open_blob_store(max_bytes: int, directory: str | None = None) -> BlobStore | DirBlobStore:
    """The blob store a server is configured with: a :class:`DirBlobStore` in ``directory``
    (shared with every process and replica that opens the same directory), else an in-memory
    :class:`BlobStore`; either bounded by ``max_bytes``."""
    if directory:
        return DirBlobStore(directory, max_bytes)
    return BlobStore(max_bytes)


__all__ = [
    "MEMORY_FILE_MIN_BYTES",
    "Blob",
    "BlobBuffer",
    "BlobError",
    "BlobStore",
    "BlobView",
    "Blobs",
    "DigestMismatch",
    "DirBlobStore",
    "InvalidDigest",
    "check_digest",
    "open_blob_store",
]

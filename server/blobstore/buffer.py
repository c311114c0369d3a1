"""Memory for blobs being received (:class:`BlobBuffer`) and the anonymous memory files
(``memfd_create``) that :class:`~remote_partitioner.server.blobstore.memory.BlobStore` keeps
them in, with the count that bounds how many such files are open in this process.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading

# The package's name, as before the split into modules: log lines name the same logger.
logger = logging.getLogger("remote_partitioner.server.blobstore")

#: Blobs at least this large are received into an anonymous memory file where the platform
#: has ``memfd_create`` (Linux); smaller ones into a ``bytearray``.
MEMORY_FILE_MIN_BYTES = 1 << 20
_memfd_create = getattr(os, "memfd_create", None)


class _Descriptors:
    """Counts the memory files open in this process, so that they never take more than half
    of its file descriptor limit (connections need the rest)."""

    def __init__(self) -> None:
        self.open = 0
        self._lock = threading.Lock()

    @staticmethod
    def budget() -> int:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            return 0
        return 1 << 20 if soft == resource.RLIM_INFINITY else soft // 2

    def acquire(self) -> bool:
        with self._lock:
            if self.open >= self.budget():
                return False
            self.open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.open -= 1


_memory_files = _Descriptors()


class BlobBuffer:
    """Memory for one blob being received, written in order (:meth:`append`), that a store
    takes without a copy.

    A blob of at least :data:`MEMORY_FILE_MIN_BYTES` is written to an anonymous memory file
    of its declared size (sparse: a page costs memory once written), which
    :class:`BlobStore` keeps as it is (one file descriptor per blob); a smaller one, or any
    without ``memfd_create`` or a free descriptor, to a ``bytearray``. Writing ends at the
    first :meth:`view`. The buffer owns what it holds until a store :meth:`take` s it;
    :meth:`close` releases whatever it still owns (idempotent). Not thread-safe: one writer.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"negative blob size {size}")
        self.size = size
        self._written = 0
        self._sealed = False
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._bytes = bytearray()
        if (size >= MEMORY_FILE_MIN_BYTES and _memfd_create is not None
                and _memory_files.acquire()):
            try:
                fd = _memfd_create("blob", getattr(os, "MFD_CLOEXEC", 0))
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    os.close(fd)
                    raise
            except OSError as e:  # no descriptor: the bytes are kept in memory all the same
                _memory_files.release()
                logger.debug("no memory file for a blob of %d bytes: %s", size, e)
                return
            self._fd = fd

    @property
    def written(self) -> int:
        """Bytes appended so far."""
        return self._written

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` after the bytes already written.

        Raises:
            ValueError: the blob would pass its declared size, or writing has ended.
        """
        view = memoryview(data).cast("B")
        if self._sealed:
            raise ValueError("the blob was read or handed over: it cannot be written to")
        if self._written + view.nbytes > self.size:
            raise ValueError(
                f"{self._written + view.nbytes} bytes written to a blob of {self.size}"
            )
        if self._fd is None:
            self._bytes += view
            self._written += view.nbytes
            return
        while view.nbytes:
            n = os.pwrite(self._fd, view, self._written)
            self._written += n
            view = view[n:]

    def view(self) -> memoryview:
        """The bytes written, read-only; writing ends."""
        self._sealed = True
        if self._fd is None:
            return memoryview(self._bytes).toreadonly()
        if self._written == 0:
            return memoryview(b"")
        if self._map is None:
            self._map = mmap.mmap(self._fd, self._written, access=mmap.ACCESS_READ)
        return memoryview(self._map)

    def take(self) -> _MemoryFile | bytearray:
        """Hand the bytes over: the memory file, or the ``bytearray``; the buffer owns nothing
        afterwards. Views from :meth:`view` must have been released."""
        self._sealed = True
        if self._fd is None:
            out, self._bytes = self._bytes, bytearray()
            return out
        self._unmap()
        fd, self._fd = self._fd, None
        return _MemoryFile(fd, self._written)

    def close(self) -> None:
        """Release what the buffer still owns."""
        self._sealed = True
        self._unmap()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            _memory_files.release()
        self._bytes = bytearray()

    def _unmap(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still exported: the GC unmaps
                self._map.close()
            self._map = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _MemoryFile:
    """A stored blob in an anonymous memory file: each :meth:`view` is a private mapping."""

    __slots__ = ("fd", "nbytes")

    def __init__(self, fd: int, nbytes: int) -> None:
        self.fd = fd
        self.nbytes = nbytes

    def view(self) -> memoryview:
        """A writable copy-on-write mapping of the blob (its writes reach nobody else)."""
        return memoryview(mmap.mmap(self.fd, self.nbytes, access=mmap.ACCESS_COPY))

    def __del__(self) -> None:
        # Mappings made by view() hold the file open themselves.
        with contextlib.suppress(OSError):
            os.close(self.fd)
        _memory_files.release()

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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import mmap
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol, TypeAlias

logger = logging.getLogger(__name__)

_HASH = re.compile(r"[0-9a-f]{64}")

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


_TEMP_PREFIX = ".tmp-"
_LOCK_NAME = ".evict.lock"
_TRASH = ".evicted"
_MAX_VERIFIED = 200_000
_Identity: TypeAlias = tuple[int, int, int, int]


def _identity(st: os.stat_result) -> _Identity:
    """What tells one blob file from another one under the same name: an inode number can be
    reused once a file is deleted, its mtime (set to the ns when it was published) then
    differs."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class DirBlobStore:
    """Verified blobs as files under ``directory``, shared by every process that opens it.

    Layout: blob ``h`` is the file ``<directory>/<h[:2]>/<h>``, its bytes exactly, read-only.
    Nothing else is needed to share the directory: processes and hosts coordinate through the
    file system only.

    * ``put`` verifies size and SHA-256 first (nothing is written for bytes that do not match),
      writes a unique temporary file (``.tmp-*``) in the blob's own directory, optionally
      fsyncs it, and links it to its final name atomically. A file already there is left as it
      is: concurrent puts of one blob, by threads or processes, are fine. Readers never see a
      partial file under a blob's name; temporary files of writers that died are removed
      after ``stale_temp_seconds``.
    * ``get`` maps the file (``mmap``, private copy-on-write: ``ACCESS_COPY``) and returns a
      writable ``memoryview`` of it: the server holds no copy of the blob in its own memory
      (the pages are the page cache's, shared by every process on the host), the codec builds
      tensors on it without a copy, and a write by the caller copies the page it touches,
      never reaching the file. The mapping stays readable when another process evicts
      (unlinks) the file meanwhile. Before a file is first served by this
      process its size and SHA-256 are verified (and remembered per file identity: device,
      inode, size and mtime, so later reads cost nothing); a file that does not match, e.g.
      one truncated or corrupted behind the store's back, is deleted and reported missing
      (None), never served.
    * ``has`` checks existence and size only (a corrupt file found later by ``get`` is then
      missing, and the client uploads it again).
    * Recency is the file's access time, set explicitly (whatever the mount's atime options)
      to the current time by ``put`` and by ``has``/``get`` when it is older than
      ``touch_interval`` seconds (so a busy blob costs one metadata write per interval, not
      per read); its mtime stays the time it was published, part of its identity. Past
      ``max_bytes`` (counting every process's files), the least recently used files are
      evicted until ``low_water * max_bytes`` remain. The totals come from a scan of the
      directory, made when the estimate kept between scans goes past ``max_bytes`` or is
      older than ``scan_interval`` seconds, and by at most one process at a time (an
      ``flock`` on ``<directory>/.evict.lock``, where the file system supports it). The blob
      just put is never evicted by its own put, so a blob larger than the whole store is kept
      until the next insertion.
    * An evicted file is not deleted at once: it is renamed into ``<directory>/.evicted/``
      (so it is missing for every process from then on) and deleted ``evict_grace`` seconds
      later. A process on this host that maps it keeps it readable anyway; the grace is for
      other hosts on a network file system (NFS), where deleting a file that a host has
      mapped can make that host's next page fault on it fail (SIGBUS). The server keeps
      a mapping while it decodes and runs one hook call (tensors are built on it) or streams
      ``ReadBlobs``; keep ``evict_grace`` above the longest call. Files in ``.evicted`` do
      not count in ``nbytes``.

    Caveat: truncating or rewriting a blob file in place, which this class never does, would
    make readers of its mappings fault; ``use_mmap=False`` makes ``get`` read files into
    memory instead (a ``bytearray``).

    Args:
        directory: created if missing.
        max_bytes: bound on the bytes of all blob files in the directory.
        fsync: fsync each file before it is linked (its bytes are durable once visible).
        use_mmap: serve mapped files; else read them into ``bytes``.
        touch_interval: seconds within which a blob's recency is not updated again.
        scan_interval: seconds after which the bytes held are counted again.
        low_water: eviction stops when this fraction of ``max_bytes`` remains.
        stale_temp_seconds: age after which another writer's temporary file is removed.
        evict_grace: seconds an evicted file lingers in ``.evicted`` (0: deleted at once).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int = 8 << 30,
        *,
        fsync: bool = True,
        use_mmap: bool = True,
        touch_interval: float = 10.0,
        scan_interval: float = 30.0,
        low_water: float = 0.9,
        stale_temp_seconds: float = 3600.0,
        evict_grace: float = 120.0,
    ) -> None:
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], not {low_water}")
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.use_mmap = use_mmap
        self.touch_interval = touch_interval
        self.scan_interval = scan_interval
        self.low_water = low_water
        self.stale_temp_seconds = stale_temp_seconds
        self.evict_grace = evict_grace
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()  # guards the fields below
        self._evicting = threading.Lock()  # one eviction scan at a time in this process
        self._verified: OrderedDict[str, _Identity] = OrderedDict()
        self._bytes = 0
        self._count = 0
        self._scanned_at = -float("inf")
        self._evict(keep=None)

    def __repr__(self) -> str:
        return f"DirBlobStore({self.directory!r}, max_bytes={self.max_bytes})"

    # ------------------------------------------------------------------ the interface

    def __len__(self) -> int:
        """Blob files in the directory (every process's), as of the last scan plus this
        process's puts since; counted again when older than ``scan_interval``."""
        self._refresh()
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes of the blob files in the directory (every process's); see ``__len__``."""
        self._refresh()
        return self._bytes

    def path(self, hash_: str) -> str:
        """The file that holds blob ``hash_`` (which must be well-formed)."""
        return os.path.join(self.directory, hash_[:2], hash_)

    def has(self, hash_: str, size: int) -> bool:
        """Whether a file of ``size`` bytes is held for the blob (and touch it)."""
        if not _HASH.fullmatch(hash_):
            return False
        path = self.path(hash_)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != size:
            return False
        self._touch(path, st)
        return True

    def get(self, hash_: str) -> BlobView | None:
        """The blob's bytes, verified: a writable memoryview of a private (copy-on-write)
        mapping of the file, or without ``use_mmap`` a ``bytearray`` read from it; None when
        not held or not intact."""
        if not _HASH.fullmatch(hash_):
            return None
        path = self.path(hash_)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            data: BlobView
            if st.st_size == 0:
                data = b""
            elif self.use_mmap:
                data = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_COPY))
            else:
                buf = bytearray(st.st_size)
                with os.fdopen(os.dup(fd), "rb") as f:
                    n = f.readinto(buf)
                data = buf if n == st.st_size else buf[:n]
            identity = _identity(st)
            if not self._is_verified(hash_, identity):
                if len(data) != st.st_size or hashlib.sha256(data).hexdigest() != hash_:
                    self._discard(hash_, path, identity)
                    return None
                self._mark_verified(hash_, identity)
            self._touch(fd, st)
            return data
        except OSError:
            return None
        finally:
            os.close(fd)

    def put(self, hash_: str, size: int, data: Blob, *, hashed: bool = False) -> None:
        """Verify ``data`` against the digest (its size only, if ``hashed``: see
        :class:`Blobs`) and store it as the blob's file (a blob already held is kept as it
        is, and touched).

        Raises:
            InvalidDigest: malformed digest.
            DigestMismatch: wrong size or hash; nothing is written.
            OSError: the file cannot be written (after one eviction pass if the disk is full).
        """
        flat = _byte_view(data)
        _verify(hash_, size, flat, hashed=hashed)
        path = self.path(hash_)
        if self._intact(path, size):
            return
        try:
            created = self._write(hash_, path, flat)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._evict(keep=None, force=True)
            created = self._write(hash_, path, flat)
        with self._lock:
            if created:
                self._bytes += size
                self._count += 1
            stale = (
                self._bytes > self.max_bytes
                or time.monotonic() - self._scanned_at > self.scan_interval
            )
        if stale:
            self._evict(keep=hash_)

    # ------------------------------------------------------------------ writing

    def _intact(self, path: str, size: int) -> bool:
        """Whether ``path`` holds a file of ``size`` bytes (touched if so); a file of another
        size there is corrupt and removed."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size == size:
            self._touch(path, st)
            return True
        self._discard(os.path.basename(path), path, _identity(st))
        return False

    def _write(self, hash_: str, path: str, data: bytes | bytearray | memoryview) -> bool:
        """Write ``data`` to a temporary file and link it to ``path``; whether this call
        created the file (False: another writer got there first)."""
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(
            folder, f"{_TEMP_PREFIX}{hash_[:16]}-{os.getpid()}-{secrets.token_hex(8)}"
        )
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o444)
        try:
            try:
                view = memoryview(data)
                while view.nbytes:
                    view = view[os.write(fd, view) :]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, path)
                created = True
            except FileExistsError:
                created = False
            except OSError as e:  # a file system without hard links: rename instead
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                created = not os.path.exists(path)
                if created:
                    os.replace(temp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        if created:
            now = time.time_ns()
            with contextlib.suppress(OSError):
                os.utime(path, ns=(now, now))
            with contextlib.suppress(OSError):
                self._mark_verified(hash_, _identity(os.stat(path)))
        else:
            with contextlib.suppress(OSError):
                self._touch(path, os.stat(path), force=True)
        return created

    # ------------------------------------------------------------------ recency, integrity

    def _touch(self, file: str | int, st: os.stat_result, *, force: bool = False) -> None:
        """Set the access time of ``file`` (a path or an open descriptor), whose status is
        ``st``, to now, keeping its mtime; unless it was set less than ``touch_interval``
        seconds ago."""
        now = time.time_ns()
        if not force and now - st.st_atime_ns < self.touch_interval * 1e9:
            return
        # Another process may have evicted it, or own it (then only its owner may set times):
        # its recency is just not updated.
        with contextlib.suppress(OSError):
            os.utime(file, ns=(now, st.st_mtime_ns))

    def _is_verified(self, hash_: str, identity: _Identity) -> bool:
        with self._lock:
            return self._verified.get(hash_) == identity

    def _mark_verified(self, hash_: str, identity: _Identity) -> None:
        with self._lock:
            self._verified[hash_] = identity
            self._verified.move_to_end(hash_)
            while len(self._verified) > _MAX_VERIFIED:
                self._verified.popitem(last=False)

    def _discard(self, hash_: str, path: str, identity: _Identity) -> None:
        """Delete the corrupt file ``identity`` at ``path``, unless another writer has
        replaced it meanwhile."""
        logger.warning("blob file %s is corrupt (size or SHA-256 differs): deleting it", path)
        with self._lock:
            self._verified.pop(hash_, None)
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if _identity(st) == identity:
                os.unlink(path)

    # ------------------------------------------------------------------ accounting, eviction

    def _refresh(self) -> None:
        with self._lock:
            fresh = time.monotonic() - self._scanned_at <= self.scan_interval
        if not fresh:
            self._evict(keep=None)

    def _remove(self, hash_: str, path: str) -> None:
        """Evict the file at ``path``: move it to ``.evicted`` (deleted after ``evict_grace``),
        or delete it now.

        Raises:
            FileNotFoundError: it is gone already.
        """
        if self.evict_grace <= 0:
            os.unlink(path)
            return
        trash = os.path.join(self.directory, _TRASH)
        os.makedirs(trash, exist_ok=True)
        os.rename(path, os.path.join(trash, f"{hash_}.{secrets.token_hex(4)}"))

    def _empty_trash(self) -> None:
        """Delete the evicted files whose grace is over (renaming set their ctime)."""
        expired = time.time_ns() - int(self.evict_grace * 1e9)
        try:
            with os.scandir(os.path.join(self.directory, _TRASH)) as it:
                entries = list(it)
        except FileNotFoundError:
            return
        for e in entries:
            with contextlib.suppress(FileNotFoundError):
                if e.stat(follow_symlinks=False).st_ctime_ns < expired:
                    os.unlink(e.path)

    def _entries(self) -> Iterator[tuple[int, int, str, str]]:
        """(atime ns, size, hash, path) of every blob file; removes stale temporary files and
        evicted files past their grace."""
        self._empty_trash()
        stale_before = time.time_ns() - int(self.stale_temp_seconds * 1e9)
        with os.scandir(self.directory) as top:
            folders = [e.path for e in top if len(e.name) == 2 and e.is_dir()]
        for folder in folders:
            try:
                with os.scandir(folder) as it:
                    files = list(it)
            except FileNotFoundError:
                continue
            for e in files:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if e.name.startswith(_TEMP_PREFIX):
                    if st.st_mtime_ns < stale_before:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                elif _HASH.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                    yield st.st_atime_ns, st.st_size, e.name, e.path

    def _evict(self, keep: str | None, *, force: bool = False) -> None:
        """Count the directory's blobs; past ``max_bytes`` (or with ``force``, past
        ``low_water * max_bytes``) evict the least recently used, except ``keep``, down to
        ``low_water * max_bytes``. One scan at a time per process, and across processes when
        the file system supports ``flock``; a scan already under way elsewhere is not
        repeated (the bytes held are then counted as they were)."""
        if not self._evicting.acquire(blocking=False):
            return
        try:
            with self._directory_lock() as locked:
                if not locked:
                    return
                entries = list(self._entries())
                total = sum(size for _, size, _, _ in entries)
                count = len(entries)
                target = int(self.low_water * self.max_bytes)
                if total > self.max_bytes or (force and total > target):
                    entries.sort()
                    for atime_ns, size, hash_, path in entries:
                        if total <= target:
                            break
                        if hash_ == keep:
                            continue
                        try:
                            if os.stat(path).st_atime_ns != atime_ns:
                                continue  # used since the scan: keep it
                            self._remove(hash_, path)
                        except FileNotFoundError:
                            pass  # evicted by another process
                        total -= size
                        count -= 1
                        with self._lock:
                            self._verified.pop(hash_, None)
                with self._lock:
                    self._bytes, self._count = total, count
                    self._scanned_at = time.monotonic()
        finally:
            self._evicting.release()

    @contextlib.contextmanager
    def _directory_lock(self) -> Iterator[bool]:
        """Hold ``<directory>/.evict.lock`` exclusively: yields False when another process
        holds it, True when held (or when the file system cannot lock: then unguarded)."""
        try:
            fd = os.open(os.path.join(self.directory, _LOCK_NAME),
                         os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError:
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            except OSError:
                yield True
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


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

"""The directory blob store (:class:`DirBlobStore`): verified blobs as files in a directory
shared by every process and replica that opens it, with its own recency, integrity checks,
accounting and eviction across processes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import mmap
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import TypeAlias

from remote_partitioner.server.blobstore.base import (
    _HASH,
    Blob,
    BlobView,
    _byte_view,
    _verify,
)

# The package's name, as before the split into modules: log lines name the same logger.
logger = logging.getLogger("remote_partitioner.server.blobstore")

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
                if len(data) != st.st_size or not self._content_matches(hash_, data):
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
        self._verify_put(hash_, size, flat, hashed=hashed)
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

    # ------------------------------------------------------------------ what a file must hold

    def _content_matches(self, hash_: str, data: BlobView) -> bool:
        """Whether the bytes of file ``hash_`` are intact: they hash to its name."""
        return hashlib.sha256(data).hexdigest() == hash_

    def _verify_put(
        self, hash_: str, size: int, data: bytes | bytearray | memoryview, *, hashed: bool
    ) -> None:
        """Raise unless ``data`` may be stored as file ``hash_`` (see :meth:`put`)."""
        _verify(hash_, size, data, hashed=hashed)

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

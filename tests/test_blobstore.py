"""The blob stores: the in-memory ``BlobStore`` and the shared-directory ``DirBlobStore``.

``DirBlobStore`` is tested on real files in ``tmp_path``: verification before anything is
written, atomic publication (temporary files are never served), zero-copy mapped reads that
survive another process's eviction, per-process verification of files written behind the
store's back (truncated or corrupt ones are deleted and reported missing), LRU eviction bounded
by ``max_bytes`` counting every process's files, and several processes putting and reading the
same and different blobs at once.
"""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from remote_partitioner.server.blobstore import (
    MEMORY_FILE_MIN_BYTES,
    BlobBuffer,
    Blobs,
    BlobStore,
    DigestMismatch,
    DirBlobStore,
    InvalidDigest,
    open_blob_store,
)

PROCESSES = 4
ROUNDS = 5
PROCESS_TIMEOUT_S = 60


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob(i: int, size: int = 30) -> tuple[str, bytes]:
    """A deterministic blob number ``i`` of ``size`` bytes, and its hash."""
    data = (i.to_bytes(4, "big") * (size // 4 + 1))[:size]
    return digest(data), data


def files(directory: Path) -> dict[str, Path]:
    """Every file under ``directory``'s two-hex-digit folders, by name."""
    return {p.name: p for p in directory.glob("??/*")}


def store(tmp_path: Path, max_bytes: int = 1 << 20, **kwargs: Any) -> DirBlobStore:
    kwargs.setdefault("touch_interval", 0.0)
    return DirBlobStore(tmp_path / "blobs", max_bytes, **kwargs)


# --------------------------------------------------------------------------------------------
# The in-memory store


def test_memory_store_keeps_what_it_is_given_without_a_copy() -> None:
    s = BlobStore()
    h1, d1 = blob(1)
    buf = bytearray(d1)
    s.put(h1, len(d1), buf)
    got = s.get(h1)
    assert isinstance(got, memoryview) and got.readonly and got.obj is buf
    assert got == d1 and s.nbytes == len(d1) and len(s) == 1

    h2, d2 = blob(2)
    s.put(h2, len(d2), d2)
    assert s.get(h2) is d2

    h3, d3 = blob(3, 64)
    words = memoryview(bytearray(d3)).cast("I")  # a view of another format is taken as bytes
    s.put(h3, len(d3), words)
    got3 = s.get(h3)
    assert got3 is not None and bytes(got3) == d3 and s.has(h3, len(d3))
    assert s.nbytes == len(d1) + len(d2) + len(d3)


def test_memory_store_refuses_bad_bytes_and_stores_nothing() -> None:
    s = BlobStore()
    h, d = blob(1)
    with pytest.raises(DigestMismatch):
        s.put(h, len(d), bytearray(d[:-1] + b"x"))
    with pytest.raises(DigestMismatch):
        s.put(h, len(d) + 1, memoryview(d))
    with pytest.raises(InvalidDigest):
        s.put("../" + h[3:], len(d), d)
    assert len(s) == 0 and s.nbytes == 0 and s.get(h) is None


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create")
def test_a_large_received_blob_is_served_copy_on_write_from_its_memory_file() -> None:
    s = BlobStore()
    size = MEMORY_FILE_MIN_BYTES + 12_345
    h, d = blob(4, size)
    fds = _open_fds()
    buf = BlobBuffer(size)
    for off in range(0, size, 100_000):
        buf.append(d[off : off + 100_000])
    assert buf.written == size
    s.put(h, size, buf)
    buf.close()
    assert _open_fds() == fds + 1  # the store holds the memory file, nothing else is open
    a, b = s.get(h), s.get(h)
    assert isinstance(a, memoryview) and not a.readonly and a == d and b == d
    a[:4] = b"XXXX"  # a caller's write reaches neither the store nor another caller
    assert b == d and s.get(h) == d and s.nbytes == size
    del a, b
    s.max_bytes = 0
    h6, d6 = blob(6)
    s.put(h6, len(d6), d6)  # evicts the large blob: its memory file is closed
    assert s.get(h) is None and _open_fds() == fds


@pytest.mark.parametrize("kind", ["memory", "directory"])
def test_a_blob_hashed_by_its_caller_is_checked_for_form_and_size_only(
    kind: str, tmp_path: Path
) -> None:
    s: Blobs = BlobStore() if kind == "memory" else store(tmp_path)
    h, d = blob(9)
    with pytest.raises(DigestMismatch):
        s.put(h, len(d) + 1, d, hashed=True)
    with pytest.raises(InvalidDigest):
        s.put(h.upper(), len(d), d, hashed=True)
    s.put(h, len(d), d, hashed=True)
    assert s.get(h) == d and s.has(h, len(d))


def test_without_a_descriptor_a_large_blob_is_kept_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno

    from remote_partitioner.server.blobstore import buffer as blobstore

    def no_descriptor(name: str, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    s = BlobStore()
    size = MEMORY_FILE_MIN_BYTES
    for i, patch in enumerate([
        lambda: monkeypatch.setattr(blobstore, "_memfd_create", no_descriptor),
        # Memory files never take more than half of the descriptor limit.
        lambda: monkeypatch.setattr(blobstore._Descriptors, "budget", staticmethod(lambda: 0)),
    ]):
        monkeypatch.undo()
        patch()
        h, d = blob(10 + i, size)
        opened = blobstore._memory_files.open
        buf = BlobBuffer(size)
        buf.append(d)
        s.put(h, size, buf)
        buf.close()
        got = s.get(h)
        assert isinstance(got, memoryview) and got.readonly and got == d
        assert blobstore._memory_files.open == opened


def test_a_blob_buffer_refuses_bytes_past_its_size_and_stores_nothing_bad() -> None:
    s = BlobStore()
    for size in (10, MEMORY_FILE_MIN_BYTES):
        h, d = blob(7, size)
        fds = _open_fds()
        buf = BlobBuffer(size)
        with pytest.raises(ValueError, match="bytes written to a blob of"):
            buf.append(d + b"!")
        buf.append(d[:-1] + b"x")
        with pytest.raises(DigestMismatch):
            s.put(h, size, buf)
        with pytest.raises(ValueError, match="cannot be written"):
            buf.append(b"")  # its bytes were read: writing has ended
        buf.close()
        buf.close()
        assert s.get(h) is None and not s.has(h, size) and _open_fds() == fds
        ok = BlobBuffer(size)
        ok.append(d)
        s.put(h, size, ok)
        ok.close()
        assert s.get(h) == d


def test_the_directory_store_writes_a_blob_buffer_to_its_file(tmp_path: Path) -> None:
    ds = store(tmp_path, max_bytes=8 << 20)
    size = MEMORY_FILE_MIN_BYTES + 1
    h, d = blob(8, size)
    buf = BlobBuffer(size)
    buf.append(d)
    ds.put(h, size, buf)
    buf.close()
    assert bytes(files(tmp_path / "blobs")[h].read_bytes()) == d and ds.get(h) == d


# --------------------------------------------------------------------------------------------
# The directory store, one process


def test_open_blob_store(tmp_path: Path) -> None:
    memory = open_blob_store(123, None)
    assert isinstance(memory, BlobStore) and memory.max_bytes == 123
    on_disk = open_blob_store(456, str(tmp_path / "d"))
    assert isinstance(on_disk, DirBlobStore) and on_disk.max_bytes == 456
    stores: list[Blobs] = [memory, on_disk]  # both satisfy the protocol
    assert all(len(s) == 0 for s in stores)


def test_put_get_has(tmp_path: Path) -> None:
    s = store(tmp_path)
    h, d = blob(7, 5000)
    assert not s.has(h, len(d)) and s.get(h) is None
    s.put(h, len(d), bytearray(d))
    path = tmp_path / "blobs" / h[:2] / h
    assert path.read_bytes() == d
    assert not os.access(path, os.W_OK) or os.geteuid() == 0  # written read-only
    assert s.has(h, len(d)) and not s.has(h, len(d) + 1)
    got = s.get(h)
    assert isinstance(got, memoryview) and isinstance(got.obj, mmap.mmap)  # zero-copy
    assert got == d and not got.readonly
    # Private: the caller's writes copy the pages they touch, never reaching the file.
    got[0] ^= 0xFF
    assert path.read_bytes() == d and s.get(h) == d and got != d
    assert len(s) == 1 and s.nbytes == len(d)
    # A second put of the same blob, from another store on the directory, keeps the file.
    inode = path.stat().st_ino
    store(tmp_path).put(h, len(d), d)
    assert path.stat().st_ino == inode
    # The empty blob.
    he = digest(b"")
    s.put(he, 0, b"")
    assert s.has(he, 0) and s.get(he) == b""
    # No temporary file is left behind.
    assert set(files(tmp_path / "blobs")) == {h, he}


def test_without_mmap_get_reads_the_file(tmp_path: Path) -> None:
    s = store(tmp_path, use_mmap=False)
    h, d = blob(3, 100)
    s.put(h, len(d), d)
    got = s.get(h)
    assert got == d and isinstance(got, bytearray)
    got[0] ^= 0xFF
    assert s.get(h) == d


def test_bad_bytes_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    s = store(tmp_path)
    h, d = blob(1, 1000)
    with pytest.raises(DigestMismatch):
        s.put(h, len(d), d[:-1] + b"\0")
    with pytest.raises(DigestMismatch):
        s.put(h, len(d) - 1, d[:-1])
    with pytest.raises(InvalidDigest):
        s.put(h.upper(), len(d), d)
    assert files(tmp_path / "blobs") == {}
    assert len(s) == 0 and s.nbytes == 0


def test_malformed_hashes_name_no_file(tmp_path: Path) -> None:
    s = store(tmp_path)
    (tmp_path / "secret").write_bytes(b"x")
    for bad in ("../secret", "..", "", "a" * 63, "A" * 64, "../" + "a" * 61):
        assert not s.has(bad, 1)
        assert s.get(bad) is None


def test_temporary_files_are_never_served_and_stale_ones_are_removed(tmp_path: Path) -> None:
    s = store(tmp_path, stale_temp_seconds=60)
    h, d = blob(5, 100)
    folder = tmp_path / "blobs" / h[:2]
    folder.mkdir(parents=True)
    # A writer that died half-way (or is still writing): its temporary file is not the blob.
    partial = folder / f".tmp-{h[:16]}-999-0123456789abcdef"
    partial.write_bytes(d[:50])
    fresh = folder / f".tmp-{h[:16]}-998-0123456789abcdef"
    fresh.write_bytes(d)
    assert not s.has(h, len(d)) and s.get(h) is None and len(s) == 0
    old = time.time() - 3600
    os.utime(partial, (old, old))
    store(tmp_path, stale_temp_seconds=60)  # opening the store scans the directory
    assert not partial.exists() and fresh.exists()
    s.put(h, len(d), d)
    assert s.get(h) == d


def test_truncated_or_corrupt_files_are_never_served(tmp_path: Path) -> None:
    s = store(tmp_path)
    h, d = blob(9, 4096)
    path = Path(s.path(h))
    path.parent.mkdir(parents=True)

    # Truncated under the blob's own name (written behind the store's back).
    path.write_bytes(d[:100])
    assert not s.has(h, len(d))
    assert s.get(h) is None
    assert not path.exists(), "the truncated file was not deleted"

    # Same size, wrong bytes: `has` checks the size only, `get` the hash, once per file.
    path.write_bytes(b"\0" * len(d))
    assert s.has(h, len(d))
    assert s.get(h) is None and not path.exists()

    # After the client uploads it again, it is served.
    s.put(h, len(d), d)
    assert s.get(h) == d

    # A verified file replaced by a corrupt one (another inode) is verified again.
    path.unlink()
    path.write_bytes(b"\1" * len(d))
    assert s.get(h) is None and not path.exists()

    # A put over a file of the wrong size replaces it.
    path.write_bytes(d[:10])
    s.put(h, len(d), d)
    assert path.read_bytes() == d and s.get(h) == d


def test_a_mapped_blob_stays_readable_after_another_process_evicts_it(tmp_path: Path) -> None:
    s = store(tmp_path)
    h, d = blob(11, 1 << 20)
    s.put(h, len(d), d)
    view = s.get(h)
    assert view is not None
    other = store(tmp_path)  # as another server process on the same directory
    os.unlink(other.path(h))
    assert other.get(h) is None and s.get(h) is None and not s.has(h, len(d))
    assert hashlib.sha256(view).hexdigest() == h


def test_evicted_files_linger_for_their_grace(tmp_path: Path) -> None:
    s = store(tmp_path, max_bytes=100, evict_grace=0.2, scan_interval=0.0)
    (h1, d1), (h2, d2), (h3, d3) = blob(1, 60), blob(2, 60), blob(3, 10)
    s.put(h1, len(d1), d1)
    view = s.get(h1)
    s.put(h2, len(d2), d2)  # 120 > 100: evicts 1, into .evicted
    assert s.get(h1) is None and not s.has(h1, len(d1)) and s.nbytes == 60
    trash = tmp_path / "blobs" / ".evicted"
    assert [p.read_bytes() for p in trash.iterdir()] == [d1]
    assert view is not None and view == d1
    time.sleep(0.3)
    s.put(h3, len(d3), d3)  # a scan deletes what is past its grace
    assert list(trash.iterdir()) == [] and view == d1
    assert s.nbytes == 70 and s.get(h2) == d2


def test_least_recently_used_is_evicted_within_the_bound(tmp_path: Path) -> None:
    s = store(tmp_path, max_bytes=100, low_water=0.9)
    b = [blob(i) for i in range(6)]  # 30 bytes each
    for h, d in b[:3]:
        s.put(h, len(d), d)
        assert s.nbytes <= 100
    assert len(s) == 3 and s.nbytes == 90
    assert s.get(b[0][0]) == b[0][1]  # touch 0: 1 is now the least recently used
    assert s.has(b[2][0], 30)  # touch 2
    s.put(b[3][0], 30, b[3][1])  # 120 > 100: evict down to 90
    assert s.nbytes == 90 and len(s) == 3
    assert s.get(b[1][0]) is None and not s.has(b[1][0], 30)
    assert all(s.get(h) == d for h, d in (b[0], b[2], b[3]))
    # Another process's files count too: a second store on the directory sees 90 bytes.
    other = store(tmp_path, max_bytes=100)
    assert other.nbytes == 90 and len(other) == 3
    other.put(b[4][0], 30, b[4][1])
    assert other.nbytes == 90
    evicted = [h for h, _ in (b[0], b[2], b[3]) if not other.has(h, 30)]
    assert len(evicted) == 1, evicted
    assert other.get(b[4][0]) == b[4][1]


def test_a_blob_larger_than_the_store_is_kept_until_the_next_put(tmp_path: Path) -> None:
    s = store(tmp_path, max_bytes=100)
    big_h, big = blob(1, 500)
    s.put(big_h, len(big), big)
    assert s.get(big_h) == big
    h, d = blob(2, 10)
    s.put(h, len(d), d)
    assert s.get(big_h) is None and s.get(h) == d and s.nbytes == 10


def test_threads_putting_the_same_blob(tmp_path: Path) -> None:
    stores = [store(tmp_path) for _ in range(4)]
    blobs = [blob(i, 20_000) for i in range(20)]
    errors: list[BaseException] = []

    def work(s: DirBlobStore) -> None:
        try:
            for h, d in blobs:
                s.put(h, len(d), d)
                got = s.get(h)
                assert got is not None and bytes(got) == d
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert set(files(tmp_path / "blobs")) == {h for h, _ in blobs}


# --------------------------------------------------------------------------------------------
# Several processes on one directory


def _worker(directory: str, max_bytes: int, k: int, start: Any, results: Any) -> None:
    """One server-like process: in each round, put the shared blobs and its own, then read
    everything back. Reports (k, puts, hits, misses, wrong bytes seen, error)."""
    try:
        s = DirBlobStore(directory, max_bytes, touch_interval=0.0, scan_interval=0.0)
        shared = [blob(i, 50_000 + i) for i in range(8)]
        own = [blob(1000 * (k + 1) + i, 20_000 + i) for i in range(8)]
        start.wait(30)
        puts = hits = misses = wrong = 0
        for r in range(ROUNDS):
            order = shared + own if (k + r) % 2 else own[::-1] + shared[::-1]
            for h, d in order:
                s.put(h, len(d), d)
                puts += 1
            for h, d in order:
                got = s.get(h)
                if got is None:
                    misses += 1
                elif bytes(got) != d:
                    wrong += 1
                else:
                    hits += 1
        results.put((k, puts, hits, misses, wrong, None))
    except BaseException as e:
        results.put((k, 0, 0, 0, 0, f"{type(e).__name__}: {e}"))


def _run_processes(directory: Path, max_bytes: int) -> list[tuple[Any, ...]]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(str(directory), max_bytes, k, start, results))
        for k in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    out = []
    try:
        start.set()
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        for _ in procs:
            out.append(results.get(timeout=max(deadline - time.monotonic(), 0.1)))
    except queue.Empty:
        pytest.fail(f"only {len(out)} of {PROCESSES} processes finished in time")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
    return out


@pytest.mark.timeout(120)
def test_processes_share_one_directory(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    results = _run_processes(directory, 1 << 30)
    assert [r[5] for r in results if r[5]] == []
    per_process = 16 * ROUNDS
    for k, puts, hits, misses, wrong, _ in results:
        assert (puts, hits, misses, wrong) == (per_process, per_process, 0, 0), k
    found = files(directory)
    assert len(found) == 8 + 8 * PROCESSES
    assert all(digest(p.read_bytes()) == name for name, p in found.items())
    assert not list(directory.glob("??/.tmp-*"))


@pytest.mark.timeout(120)
def test_processes_evicting_under_a_small_bound(tmp_path: Path) -> None:
    directory = tmp_path / "small"
    max_bytes = 300_000  # about a third of what the processes put
    results = _run_processes(directory, max_bytes)
    assert [r[5] for r in results if r[5]] == []
    assert sum(r[4] for r in results) == 0, "a process was served wrong bytes"
    assert sum(r[3] for r in results) > 0, "nothing was evicted: the bound is not exercised"
    assert sum(r[2] for r in results) > 0
    found = files(directory)
    assert all(digest(p.read_bytes()) == name for name, p in found.items())
    # A put skips its eviction scan while another process's is under way, so the bound may be
    # overshot by what the processes put meanwhile, and no more; the next scan restores it.
    left = sum(p.stat().st_size for p in found.values())
    assert left <= max_bytes + PROCESSES * 60_000, left
    s = DirBlobStore(directory, max_bytes)
    assert s.nbytes <= max_bytes
    assert sum(p.stat().st_size for p in files(directory).values()) == s.nbytes

"""The command line's digest cache (client/digest_cache.py): a digest is used only while the
file is provably unchanged, and never while the entry is racy."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from remote_partitioner.client import digest_cache
from remote_partitioner.client.digest_cache import DigestCache


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _settled(path: Path) -> None:
    """Wait until the clock is past ``path``'s times by more than the racy margin."""
    st = path.stat()
    while time.time_ns() <= max(st.st_mtime_ns, st.st_ctime_ns) + 2 * digest_cache.RACY_NS:
        time.sleep(0.01)


def test_a_hashed_file_is_known_once_settled_and_forgotten_when_changed(tmp_path: Path) -> None:
    cache = DigestCache(tmp_path / "cache")
    f = tmp_path / "model.pt2"
    f.write_bytes(b"archive one")
    assert cache.lookup(f) is None  # (no entry)
    digest = cache.hash_file(f, f.read_bytes())
    assert (digest.hash, digest.size_bytes) == (_sha(b"archive one"), 11)
    # Recorded in the tick the file was written in: racy, not used (it is hashed again).
    assert cache.lookup(f) is None
    _settled(f)
    cache.hash_file(f, f.read_bytes())
    assert cache.lookup(f) == digest
    # Changed in place, the same size: the change time moves, the entry is not used.
    with open(f, "r+b") as w:
        w.write(b"A")
    assert f.stat().st_size == 11
    assert cache.lookup(f) is None
    # Replaced by another file of the same size: another inode.
    _settled(f)
    cache.hash_file(f, f.read_bytes())
    (tmp_path / "other").write_bytes(b"archive two")
    os.replace(tmp_path / "other", f)
    assert cache.lookup(f) is None


def test_a_written_file_is_known_at_once_through_any_link(tmp_path: Path) -> None:
    cache = DigestCache(tmp_path / "cache")
    out = tmp_path / "out.pte"
    out.write_bytes(b"a program")
    digest = cache.hash_file(out, b"a program")  # the digest, as the server sent it
    cache.record_written(out, digest)
    assert cache.lookup(out) == digest
    link = tmp_path / "link.pte"
    link.symlink_to(out)
    assert cache.lookup(link) == digest  # (entries are by the file's real path)
    out.write_bytes(b"a program")  # the same bytes, written again: unknown until hashed
    assert cache.lookup(out) is None
    # A digest that does not match the file's size is not recorded.
    cache.record_written(out, digest.__class__(hash=digest.hash, size_bytes=3))
    assert cache.lookup(out) is None


def test_what_is_not_a_usable_entry_is_a_miss(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DigestCache(tmp_path / "cache")
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    _settled(f)
    digest = cache.hash_file(f, f.read_bytes())
    assert cache.lookup(f) == digest
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text("{not json")
    assert cache.lookup(f) is None
    entry.write_text('{"path": 3}')
    assert cache.lookup(f) is None
    # A directory, a missing file, a pipe: misses, never errors, nothing recorded.
    assert cache.lookup(tmp_path) is None
    assert cache.lookup(tmp_path / "missing") is None
    os.mkfifo(tmp_path / "pipe")
    assert cache.hash_file(tmp_path / "pipe", b"piped").hash == _sha(b"piped")
    assert cache.lookup(tmp_path / "pipe") is None
    # A cache directory that cannot be created costs the entry only.
    (tmp_path / "blocked").write_text("a file where the directory would be")
    assert DigestCache(tmp_path / "blocked" / "c").hash_file(f, f.read_bytes()) == digest
    # The environment names the directory, or turns the cache off.
    monkeypatch.setenv(digest_cache.ENVIRONMENT_VARIABLE, "off")
    assert DigestCache.default() is None
    monkeypatch.setenv(digest_cache.ENVIRONMENT_VARIABLE, str(tmp_path / "named"))
    named = DigestCache.default()
    assert named is not None and named.directory == tmp_path / "named"
    monkeypatch.delenv(digest_cache.ENVIRONMENT_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = DigestCache.default()
    assert default is not None
    assert default.directory == tmp_path / "xdg" / "remote-partitioner" / "digests"


def test_the_cache_keeps_at_most_its_bound(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest_cache, "MAX_ENTRIES", 3)
    cache = DigestCache(tmp_path / "cache")
    files = []
    for i in range(5):
        f = tmp_path / f"f{i}"
        f.write_bytes(bytes([i]) * 10)
        files.append(f)
    _settled(files[-1])
    for f in files:
        cache.hash_file(f, f.read_bytes())
        time.sleep(0.01)  # (recency is the entries' modification time)
    assert len(list((tmp_path / "cache").iterdir())) == 3
    assert [cache.lookup(f) is not None for f in files] == [False, False, True, True, True]

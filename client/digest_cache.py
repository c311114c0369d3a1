"""Digests of local files remembered by the files' identity and status, so that the command
line neither hashes again an archive it hashed before nor downloads again a ``.pte`` the
output file already holds: Bazel's digest cache, with git's rule for racy entries.

An entry records a file's path, device, inode, size, modification and change times (in
nanoseconds), its SHA-256, and when the entry was recorded. It is used only while all five
status fields are unchanged *and* the file's times are older than the entry by more than the
file system's timestamp granularity (:data:`RACY_NS`; two seconds when the times are whole
seconds). A later write to the file changes its change time (which no program can set back)
and, being later than the entry, to a value the entry does not hold; a write in the same
clock tick as the recording could keep every field, so such a "racy" entry is not used, and
the file is hashed again, as git does with its index. What remains: a file changed, keeping
its size, within one clock tick of the command line writing it and recording it at once
(:meth:`DigestCache.record_written`).

The cache is a directory of small JSON files, one per path (named by the SHA-256 of its real
path), each written atomically, so any number of command lines share it, the Node one too
(``client/node/lib/digest-cache.js`` reads and writes the same entries; the integers are
decimal strings, which JavaScript's numbers would round); a damaged entry is a miss.
``REMOTE_PARTITIONER_DIGEST_CACHE`` names the directory (``off`` disables it); the default is
``$XDG_CACHE_HOME/remote-partitioner/digests`` (``~/.cache/...``). The cache holds at most
:data:`MAX_ENTRIES` entries, the oldest removed first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from pathlib import Path

from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

#: Environment variable naming the cache's directory, or ``off``.
ENVIRONMENT_VARIABLE = "REMOTE_PARTITIONER_DIGEST_CACHE"
#: An entry is racy (not used) unless the file's times are older than the entry by this much:
#: above the kernel's coarse clock tick (at most 10 ms), which stamps file times.
RACY_NS = 50_000_000
#: The same, for a file system whose times are whole seconds (FAT keeps two-second times).
RACY_WHOLE_SECONDS_NS = 2_000_000_000
#: Entries kept; past this, the least recently recorded are removed.
MAX_ENTRIES = 4096

_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def _status(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _racy_margin(status: dict[str, int]) -> int:
    whole = status["mtime_ns"] % 1_000_000_000 == 0 and status["ctime_ns"] % 1_000_000_000 == 0
    return RACY_WHOLE_SECONDS_NS if whole else RACY_NS


class DigestCache:
    """The digests of files under ``directory`` (see the module's docstring).

    Every method is safe to call on any path: a path that is not a regular file, or an
    entry that cannot be read or written, is a miss (never an error).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @classmethod
    def default(cls) -> DigestCache | None:
        """The cache ``REMOTE_PARTITIONER_DIGEST_CACHE`` names (None when it is ``off``), else
        the one under the user's cache directory."""
        named = os.environ.get(ENVIRONMENT_VARIABLE, "")
        if named.lower() == "off":
            return None
        if named:
            return cls(named)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache"
        )
        return cls(os.path.join(base, "remote-partitioner", "digests"))

    def _entry_path(self, path: str) -> Path:
        return self.directory / hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()

    def lookup(self, path: str | os.PathLike[str]) -> pb.Digest | None:
        """The digest of the regular file at ``path`` if an entry for it is usable (its
        status unchanged and not racy), else None."""
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
            entry = json.loads(self._entry_path(real).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode) or not isinstance(entry, dict):
            return None
        status = _status(st)
        try:
            if entry.get("path") != real or any(entry[f] != str(status[f]) for f in _FIELDS):
                return None
            recorded = int(entry["recorded_ns"])
            digest = pb.Digest(hash=str(entry["sha256"]), size_bytes=status["size"])
        except (KeyError, TypeError, ValueError):
            return None
        if max(status["mtime_ns"], status["ctime_ns"]) >= recorded - _racy_margin(status):
            return None  # racy: the file may have changed in the tick it was recorded in
        return digest

    def hash_file(self, path: str | os.PathLike[str], data: bytes | memoryview) -> pb.Digest:
        """The digest of ``data``, the bytes just read from ``path``, recorded for it when the
        file's status was the same before and after hashing (taken now: the caller read
        ``data`` from it after the first status, hence the status is taken first)."""
        real = os.path.realpath(path)
        try:
            before = os.stat(real)
        except OSError:
            before = None
        digest = digest_of(data)
        if (before is not None and stat.S_ISREG(before.st_mode)
                and before.st_size == digest.size_bytes):
            with contextlib.suppress(OSError):
                if _status(os.stat(real)) == _status(before):
                    self._write(real, _status(before), digest.hash)
        return digest

    def record_written(self, path: str | os.PathLike[str], digest: pb.Digest) -> None:
        """Record ``digest`` for the file at ``path``, which this process has just written
        whole (and verified) and renamed into place. Waits for the clock to move one racy
        margin past the file's times (a few tens of milliseconds at most), so that the entry
        is usable at once."""
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
            if st.st_size != digest.size_bytes or not stat.S_ISREG(st.st_mode):
                return
            status = _status(st)
            wait_ns = max(status["mtime_ns"], status["ctime_ns"]) + _racy_margin(status) + 1 \
                - time.time_ns()
            if 0 < wait_ns <= RACY_NS + 1:
                time.sleep(wait_ns / 1e9)
            if _status(os.stat(real)) == status:
                self._write(real, status, digest.hash)
        except OSError:
            return

    def _write(self, real: str, status: dict[str, int], sha256: str) -> None:
        entry = {"path": real, **{f: str(v) for f, v in status.items()}, "sha256": sha256,
                 "recorded_ns": str(time.time_ns())}
        target = self._entry_path(real)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entry), encoding="utf-8")
            os.replace(tmp, target)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._prune()

    def _prune(self) -> None:
        """Remove the least recently recorded entries past :data:`MAX_ENTRIES`."""
        try:
            entries = [e for e in os.scandir(self.directory) if ".tmp-" not in e.name]
            if len(entries) <= MAX_ENTRIES:
                return
            entries.sort(key=lambda e: e.stat().st_mtime_ns)
        except OSError:
            return
        for e in entries[: len(entries) - MAX_ENTRIES]:
            with contextlib.suppress(OSError):
                os.unlink(e.path)


__all__ = ["ENVIRONMENT_VARIABLE", "MAX_ENTRIES", "RACY_NS", "DigestCache"]

"""The server's result cache: hook responses by the content of the request that produced them.

Every hook RPC is a pure function of its request (the partitioner's name and spec, and a
program named by content: its graph and tensors are blobs addressed by SHA-256) and of the
server's versions. A response is therefore reusable for any later request with the same bytes,
from any client: the second lowering of a model skips decoding and partitioning. ``Lower``
is one more such function (of the archive's digest, the partitioner references, the options).

With a directory (the server's ``--blob-dir``) the entries also persist there, in
``<blob dir>/results``, where a restarted server and every replica sharing the directory find
them: Bazel's remote cache, REAPI's ActionCache beside its content-addressed store. The blobs a
response names (a ``.pte``, preprocess outputs, a transformed program) are in the blob store;
a caller uses an entry only while they are all still held there, so an evicted blob makes a
miss, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from remote_partitioner.server.blobstore.entries import DirEntryStore

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)


def results_directory(blob_dir: str | os.PathLike[str]) -> str:
    """Where the result cache of a server with blob directory ``blob_dir`` keeps its entries
    (beside the blob files, which the blob store's scans leave alone)."""
    return os.path.join(os.fspath(blob_dir), "results")


def environment_key() -> str:
    """A digest of what, besides a request, this process's answers depend on: the Python
    version and machine, every installed distribution's name and version (torch, ExecuTorch,
    the backends' packages, flatbuffers, plugins: anything that can change a ``.pte``'s
    bytes), and the source of this package itself (an editable install keeps its version
    while its code changes). Part of the result cache's keys, so that an entry written by
    another environment, in a directory replicas share, is never read as this one's."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\0{platform.machine()}\0".encode())
    for name, version in sorted(
        (d.metadata["Name"] or "", d.version) for d in metadata.distributions()
    ):
        h.update(f"{name}=={version}\0".encode())
    server = Path(__file__).resolve().parent
    for folder in (server, server.parent / "proto"):  # what answers, and the wire it speaks
        for source in sorted(folder.rglob("*.py")):
            h.update(str(source.relative_to(server.parent)).encode() + b"\0")
            h.update(hashlib.sha256(source.read_bytes()).digest())
    return h.hexdigest()


class ResultCache:
    """Serialized responses keyed by (RPC, request bytes, versions); least recently used
    evicted past ``max_bytes``. ``max_bytes=0`` disables it.

    Only successful responses are stored. A response is stored as bytes, so a hit returns a
    fresh message that the caller may change.

    Args:
        max_bytes: bound of the entries held in memory, and of those in ``directory``.
        versions: everything besides the request that the answers depend on (the server's
            :func:`~remote_partitioner.server.versions.versions_key`); part of every key.
        directory: also keep the entries as files here (a :class:`DirEntryStore`, shared by
            every process that opens it); a lookup that misses in memory reads it.
    """

    def __init__(
        self,
        max_bytes: int = 256 << 20,
        versions: str = "",
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._versions = versions.encode()
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: The entries on disk, or None.
        self.disk = (
            DirEntryStore(directory, max_bytes) if directory is not None and max_bytes > 0
            else None
        )
        #: Lookups answered from the cache (from memory or from disk), and lookups that were
        #: not; ``disk_hits`` of the hits were read from the directory.
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of responses held."""
        return self._bytes

    def key(self, rpc: str, request: Message) -> str:
        """The cache key of ``request`` to ``rpc``: a digest of its deterministic bytes."""
        h = hashlib.sha256(self._versions)
        h.update(b"\0" + rpc.encode() + b"\0")
        h.update(request.SerializeToString(deterministic=True))
        return h.hexdigest()

    def get(
        self, key: str, response_type: type[_M], usable: Callable[[_M], bool] | None = None
    ) -> _M | None:
        """The response stored under ``key`` as a new ``response_type``, or None; also None
        when ``usable`` says the response cannot be used (its blobs are gone), which counts
        as a miss."""
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
        from_disk = data is None
        if from_disk:
            data = self._read_disk(key)
        response = None if data is None else self._parse(key, data, response_type)
        if response is not None and usable is not None and not usable(response):
            response = None
        with self._lock:
            if response is None:
                self.misses += 1
                return None
            self.hits += 1
            self.disk_hits += from_disk
        if from_disk:
            assert data is not None
            self._remember(key, data)
        return response

    @staticmethod
    def _parse(key: str, data: bytes, response_type: type[_M]) -> _M | None:
        response = response_type()
        try:
            response.ParseFromString(data)
        except DecodeError:  # not for an intact entry (its checksum is verified): a miss
            logger.warning("result cache entry %s does not parse as %s: ignored", key,
                           response_type.DESCRIPTOR.full_name)
            return None
        return response

    def count_hit(self) -> None:
        """Count a lookup its caller answered from memory outside the cache (a ``Lower``
        answer still being stored, :mod:`~remote_partitioner.server.lower_call`) as a hit."""
        with self._lock:
            self.hits += 1

    def put(self, key: str, response: Message) -> None:
        """Store ``response`` under ``key`` (a response larger than the cache is not kept)."""
        data = response.SerializeToString(deterministic=True)
        if len(data) > self.max_bytes:
            return
        self._remember(key, data)
        if self.disk is not None:
            try:
                self.disk.put_entry(key, data)
            except OSError as e:  # a full or read-only volume costs the entry, not the call
                logger.warning("result cache entry %s not written to %s: %s", key,
                               self.disk.directory, e)

    def _read_disk(self, key: str) -> bytes | None:
        if self.disk is None:
            return None
        try:
            return self.disk.get_entry(key)
        except OSError as e:
            logger.warning("result cache entry %s not read from %s: %s", key,
                           self.disk.directory, e)
            return None

    def _remember(self, key: str, data: bytes) -> None:
        """Hold ``data`` in memory under ``key``, evicting the least recently used."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._entries[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)


__all__ = ["ResultCache", "environment_key", "results_directory"]
